"""Make the lab's tiny model: run by the vLLM venv's Python (torch, transformers, tokenizers), never
imported by k3fleet itself.

``python make_model.py OUT_DIR``: a byte-level BPE tokenizer trained on the spot on fixed text, with
special tokens for the chat markers and ``<tool_call>``/``</tool_call>`` (vLLM's hermes tool parser
looks them up), saved as a ``PreTrainedTokenizerFast`` with a chat template that renders tools; a
``LlamaConfig`` of hidden 128, 2 layers, 2 heads, 1 KV head (head_dim 64: the CPU attention refuses
16) with random weights from a fixed seed, saved as bfloat16 safetensors. The same recipe gives the
same files. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

RECIPE = 1
SEED = 0x4B33
VOCAB = 1024
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
           "</tool_response>"]

# Qwen/Hermes style: tools declared in the system turn, calls as <tool_call>{json}</tool_call>, tool
# results as a user turn; arguments rendered whether they arrive as a string or as an object.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions.\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and arguments within \
<tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n\
</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'user' or message.role == 'system' %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls or [] %}
{%- set fn = tool_call.function if tool_call.function is defined else tool_call %}
{{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' }}
{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

_WORDS = ("the", "node", "driver", "fabric", "manager", "drain", "canary", "wave", "rollback", "ticket", "call",
          "tool", "function", "arguments", "name", "status", "gpu", "cache", "prefix", "token", "queue", "agent",
          "severity", "owner", "team", "labels", "impact", "replicas", "deployment", "reason", "alert", "runbook",
          "system", "user", "assistant", "json", "schema", "string", "object", "array", "integer", "boolean")


def corpus() -> Iterator[str]:
    """Fixed training text: prose from the probes' words, JSON of tool calls, digits and punctuation."""
    rng = random.Random(SEED)
    for i in range(4000):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 24)))
        yield f"{words.capitalize()}. Case {i:04d}, ticket OPS-{4100 + i % 97}, node gpu-{i % 64:03d}."
        yield json.dumps({"name": rng.choice(_WORDS), "arguments": {rng.choice(_WORDS): rng.choice(_WORDS),
                                                                      "n": rng.randint(0, 999)}})


def make(out: Path) -> None:
    # lazy: torch and transformers are heavy and only building the model needs them
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[3:])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 8192
    fast.save_pretrained(tmp)
    torch.manual_seed(SEED)
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=8192,
                      tie_word_embeddings=True, eos_token_id=eos, pad_token_id=fast.pad_token_id,
                      bos_token_id=None, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "k3fleet-model.json").write_text(json.dumps({"recipe": RECIPE, "seed": SEED, "vocab": len(fast)}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make_model.py OUT_DIR", file=sys.stderr)
        return 2
    make(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
