"""`accept startup`: what a vLLM start-up log and launch command say about the serving layer.

The log is the evidence of what actually ran (it wins over the launch command where they differ);
the launch command fills in what the log does not print. Patterns and their sources are listed in
docs/acceptance.md ("accept startup"). A model-load OOM is an environment / topology finding, never a
traffic one: no amount of traffic limiting fixes a model that does not fit the GPUs it was given.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_image import parse_image_ref
from k3fleet.accept import identity
from k3fleet.accept.result import ProbeResult, Status, finding
from k3fleet.bounds import read_input
from k3fleet.contracts import Severity
from k3fleet.errors import UsageError
from k3fleet.evidence import redact_argv
from k3fleet.evidence.redact import excerpt
from k3fleet.models.findings import Finding
from k3fleet.models.target import Target, version_tuple
from k3fleet.verdict import all2all

PROBE = "startup"

# Log-line prefixes vLLM and its process wrappers put before the message:
# "(APIServer pid=1) INFO 08-14 09:12:03 [api_server.py:1351] ", "vllm-1  | ", journald's "... python3[123]: ".
_PREFIX = re.compile(r"^(?:.*?\|\s)?(?:\([\w ,.=-]+\)\s*)*(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+"
                     r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[\w.]+:\d+\]\s?)?")

_VERSION_PATTERNS = (
    re.compile(r"vLLM API server version (\S+)"),
    re.compile(r"Initializing an? (?:V\d )?LLM engine \(v([^)\s]+)\)"),
    re.compile(r"vLLM Version\s*:\s*(\S+)"),
    # The block-letter banner of recent releases (0.32: "... █ ▀▄▀ █  version 0.32.0").
    re.compile(r"[\u2580-\u259f]\s+version (\d+\.\d+\S*)"),
)
_IMAGE = re.compile(r"(?<![\w./:-])((?:[\w.-]+(?::\d+)?/)*vllm-openai(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?)")
_DIGEST = re.compile(r"(?:Digest:\s*|@)(sha256:[0-9a-f]{64})")
# Any image reference a log names as its image (a custom build need not be called vllm-openai): the log's
# own vLLM version and CUDA lines are what say it is a vLLM server.
_ANY_IMAGE = re.compile(r"\b(?:[Ii]mage|IMAGE)[\"']?\s*[:=]\s*[\"']?"
                        r"((?:[\w.-]+(?::\d+)?/)+[\w.-]+(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?)")
_IMAGE_REF = re.compile(r"(?:[\w.-]+(?::\d+)?/)+[\w.-]+(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?")
# docker / podman run options that take the next token as their value.
_RUN_VALUED = frozenset({"-e", "--env", "-p", "--publish", "-v", "--volume", "--name", "--gpus", "--ipc",
                         "--shm-size", "--network", "--net", "--runtime", "-w", "--workdir", "--entrypoint",
                         "--mount", "--device", "--ulimit", "-u", "--user", "-l", "--label", "--env-file",
                         "--cpus", "-m", "--memory", "--security-opt", "--cap-add", "--hostname", "--pull"})
_CUDA_PATTERNS = (
    re.compile(r"\bCUDA_VERSION[=:]\s*\"?(\d+\.\d+(?:\.\d+)?)"),
    re.compile(r"CUDA runtime version\s*:\s*(\d+\.\d+(?:\.\d+)?)"),
    re.compile(r"NCCL version [\d.]+\+cuda(\d+\.\d+)"),
    re.compile(r"CUDA used to build PyTorch\s*:\s*(\d+\.\d+)"),
)
_TORCH = (re.compile(r"PyTorch version\s*:\s*(\S+)"), re.compile(r"\btorch(?:==|\s+)(\d+\.\d+\.\d+\S*)"))
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_NAMESPACE = re.compile(r"\bargs: Namespace\((.*)\)\s*$")
_KV = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()\s]+)")
_MAX_LEN = re.compile(r"Using max model len (\d+)")
_EP_RANK = re.compile(r"\[EP Rank \d+/(\d+)\]")
_DP_ENGINE = re.compile(r"EngineCore_DP(\d+)")
_ARCH = re.compile(r"Resolved architecture: (\w+)")
_READY = re.compile(r"Application startup complete|Available routes are|Starting vLLM API server|"
                    r"Starting \S+ server on https?://")
_AUTO_TOOL = re.compile(r"\"auto\" tool choice has been enabled")
# What only vLLM prints: its engine processes, its own name, its arguments or model resolution. A log with a
# readiness line and none of these (a bare uvicorn or another OpenAI-compatible server) is no vLLM evidence.
_VLLM_LINE = re.compile(r"EngineCore|\(APIServer pid=\d+\)|\bvLLM\b|"
                        r"\bvllm\.(?:entrypoints|engine|v1|config|model_executor)\b|"
                        r"Resolved architecture|Using max model len|non-default args")
# vLLM's check that one request at max-model-len fits the KV cache (vllm/v1/core/kv_cache_utils.py).
_KV_CAPACITY = re.compile(r"To serve at least one request with the models?'s max seq len \((\d+)\), \(([\d.]+) GiB KV "
                          r"cache is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)"
                          r"(?:\. Based on the available memory, the estimated maximum model length is (\d+))?")
# vLLM's argument check for parsers (vllm/entrypoints/launchers/launcher.py validate_api_server_args).
_BAD_PARSER = re.compile(r"invalid (tool call|reasoning) parser: (\S+)")
_EXCEPTION = re.compile(r"^\s*((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)): (.+)$")

# Failure signatures, most specific first: (finding id, layer, pattern, message).
_ENV = "environment"
_CUDA_INIT = (
    ("container_requirement",
     re.compile(r"nvidia-container-cli: requirement error: unsatisfied condition: (cuda>=[\d.]+)"),
     "the container runtime refused to start the image: the host driver does not support {0} "
     "(upgrade the driver; NVIDIA_DISABLE_REQUIRE only hides this check)"),
    ("driver_too_old", re.compile(r"driver on your system is too old \(found version (\d+)\)"),
     "PyTorch in the container found a driver that supports CUDA {0} only: the host driver is too old for the image"),
    ("error_35", re.compile(r"CUDA driver version is insufficient for CUDA runtime version|[Ee]rror 35\b"),
     "CUDA error 35: the host driver is older than the container's CUDA runtime"),
    ("driver_symbol", re.compile(r"undefined symbol: (cu[A-Z]\w*)"),
     "the driver lacks the CUDA driver API symbol {0} the build was linked against: the host driver is older "
     "than the build's CUDA"),
    ("error_803", re.compile(r"Error 803|unsupported display driver / cuda driver combination"),
     "CUDA error 803: the driver and the CUDA user-space libraries in the container do not match "
     "(mounted driver libraries or the compat package)"),
    ("error_804", re.compile(r"Error 804|forward compatibility was attempted on non supported HW"),
     "CUDA error 804: forward compatibility (cuda-compat) used on a GPU that does not support it"),
)
_NCCL = re.compile(r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|"
                   r"NCCL WARN .*(?:failed|error)", re.IGNORECASE)
# watch judges a node's journal by the same pattern (k3fleet.decide.watch.judge_node_log).
NCCL_ERROR = _NCCL
_DMABUF = re.compile(r"(?:mlx5dv|ibv)_reg_dmabuf_mr.*(?:524|not supported)", re.IGNORECASE)
_MISSING_KERNEL = re.compile(r"no kernel image is available for execution on the device|"
                             r"undefined symbol: (?!cu[A-Z])\w+|Unknown recipe|"
                             r"kernel .* not (?:compiled|available) for")
_UNSUPPORTED_ARCH = re.compile(r"is not compatible with the current PyTorch installation|Unsupported architecture|"
                               r"(?:compute capability|CUDA capability)[^.]*not supported", re.IGNORECASE)
_FALLBACK = re.compile(r"[Ff]alling back to|[Ff]all(?:s|ing)? back to|fallback to|[Uu]sing fallback|"
                       r"Custom allreduce is disabled", re.IGNORECASE)
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks|"
                  r"CUDA error: out of memory")
# Memory and time at start-up, as vLLM's workers and engine core print them (docs/acceptance.md "Start-up
# memory"): the weights' memory and load time per rank, the KV cache memory and size, the engine's init time.
_MEMORY: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"), ("weights_gib", "model_load_s")),
    (re.compile(r"Loading weights took ([\d.]+) seconds"), ("weights_load_s",)),
    (re.compile(r"Available KV cache memory: (-?[\d.]+) GiB"), ("kv_cache_gib",)),
    (re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache"), ("kv_cache_gib",)),
    (re.compile(r"[GC]PU KV cache size: ([\d,]+) tokens"), ("kv_cache_tokens",)),
    (re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
     ("concurrency_tokens", "max_concurrency_x")),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) (?:seconds|s)\b"), ("init_s",)),
)
_LOAD_START = re.compile(r"Loading (?:model )?weights|Loading safetensors|load_model|Starting to load model")
_LOAD_DONE = re.compile(r"Loading (?:model )?weights took|Model loading took|Loading weights took")

_FLAG_ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
                 "-dp": "--data-parallel-size", "-ep": "--enable-expert-parallel"}
_BOOL_FLAGS = {"--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-expert-parallel",
               "--enable-auto-tool-choice", "--trust-remote-code", "--enable-reasoning", "--enforce-eager",
               "--enable-chunked-prefill", "--disable-custom-all-reduce", "--enable-prompt-tokens-details",
               "--disable-log-requests", "--headless"}


@dataclass
class _Scan:
    """What one pass over the log collected."""

    fields: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)
    ready: bool = False
    loading: bool = False
    loaded: bool = False
    ep_size: int | None = None
    dp_engines: int = 0
    first_exception: str | None = None
    recognised: bool = False
    saw_args: bool = False
    oom_line: str | None = None
    oom_after_load: bool = False
    vllm_evidence: bool = False

    def set(self, key: str, value: Any) -> None:
        if value is not None and self.fields.get(key) is None:
            self.fields[key] = value
        self.recognised = True

    def add(self, fid: str, severity: Severity, message: str, layer: str | None, evidence: str) -> None:
        # One finding per kind: a multi-GPU log repeats each error once per rank.
        if fid in self.seen_ids:
            return
        self.seen_ids.add(fid)
        self.recognised = True
        self.findings.append(finding(fid, severity, message, layer=layer, evidence=_evidence(evidence)))


def _evidence(line: str) -> str:
    # Redacted, then cut (excerpt): a cut first could leave the start of a secret no rule recognises.
    return str(excerpt(line.strip(), 300, one_line=False))


def _message(line: str) -> str:
    return _PREFIX.sub("", line.rstrip("\n"), count=1)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("True", "False"):
        return value == "True"
    return None


def _apply_args(scan: _Scan, args: dict[str, Any]) -> None:
    """Server arguments as vLLM printed them (non-default args, or the older Namespace form)."""
    scan.saw_args = True
    scan.set("model", args.get("model") or args.get("model_tag"))
    scan.set("tensor_parallel_size", _as_int(args.get("tensor_parallel_size")))
    scan.set("pipeline_parallel_size", _as_int(args.get("pipeline_parallel_size")))
    scan.set("data_parallel_size", _as_int(args.get("data_parallel_size")))
    scan.set("max_model_len", _as_int(args.get("max_model_len")))
    # Who the server is, for holding the log against the tested endpoint (k3fleet.accept.identity).
    served = args.get("served_model_name")
    scan.set("served_model_name", served[0] if isinstance(served, list) and served else
             served if isinstance(served, str) else None)
    scan.set("host", args.get("host") if isinstance(args.get("host"), str) else None)
    scan.set("port", _as_int(args.get("port")))
    scan.set("block_size", _as_int(args.get("block_size")))
    if "enable_prefix_caching" in args:
        scan.set("prefix_caching", _as_bool(args.get("enable_prefix_caching")))
    if _as_bool(args.get("enable_expert_parallel")):
        scan.set("enable_expert_parallel", True)
    if _as_bool(args.get("enable_auto_tool_choice")):
        scan.set("auto_tool_choice", True)
    for key in ("tool_call_parser", "reasoning_parser", "all2all_backend"):
        val = args.get(key)
        if isinstance(val, str) and val:
            scan.set(key, val)


# The lines that make up most of a long-running server's log and say nothing about its start-up: the metrics
# logger's periodic line and uvicorn's access log (whole-line shapes, so nothing else can hide in them). Only the
# checks that read a line's prefix run on them: a 50 MB log is judged in seconds, not in a minute.
_ROUTINE = re.compile(
    r"(?:Engine \d+: )?Avg prompt throughput: [\d.]+ tokens/s(?:, [\w ]+: [\d.]+ ?(?:tokens/s|reqs|%))*,?\s*"
    r'|(?:INFO:\s+)?[\w.:\[\]-]+:\d+ - "(?:GET|POST|PUT|DELETE|HEAD|OPTIONS) \S+ HTTP/[\d.]+" \d{3}(?: [\w ]+)?\s*')


def _set_first(scan: _Scan, key: str, patterns: Iterable[re.Pattern[str]], msg: str) -> None:
    """Set ``key`` from the first of ``patterns`` that matches ``msg`` (its first group); none: nothing."""
    for pat in patterns:
        m = pat.search(msg)
        if m:
            scan.set(key, m.group(1))
            return


def _scan_line(scan: _Scan, raw: str) -> None:
    line = raw.rstrip("\n")
    msg = _message(line)
    if _ROUTINE.fullmatch(msg):
        for dp in _DP_ENGINE.findall(line):
            scan.dp_engines = max(scan.dp_engines, int(dp) + 1)
        if _VLLM_LINE.search(line):
            scan.vllm_evidence = True
        return
    _set_first(scan, "vllm_version", _VERSION_PATTERNS, msg)
    m = _IMAGE.search(line) or _ANY_IMAGE.search(line)
    if m:
        scan.set("image", parse_image_ref(m.group(1)).without_digest())
    d = _DIGEST.search(line)
    if d and ("Digest:" in line or "vllm-openai" in line or (m is not None and "@sha256:" in m.group(1))):
        scan.set("image_digest", d.group(1))
    _set_first(scan, "cuda_version", _CUDA_PATTERNS, msg)
    _set_first(scan, "torch_version", _TORCH, msg)
    m = _NON_DEFAULT.search(msg)
    if m:
        args = _literal(m.group(1))
        if isinstance(args, dict):
            _apply_args(scan, args)
    m = _NAMESPACE.search(msg)
    if m:
        _apply_args(scan, {k: _literal(v) if v[:1] in "'\"" else v for k, v in _KV.findall(m.group(1))})
    if "LLM engine" in msg and "with config:" in msg:
        cfg = {k: v.strip("'\"") for k, v in _KV.findall(msg.split("with config:", 1)[1])}
        scan.set("tensor_parallel_size", _as_int(cfg.get("tensor_parallel_size")))
        scan.set("pipeline_parallel_size", _as_int(cfg.get("pipeline_parallel_size")))
        scan.set("data_parallel_size", _as_int(cfg.get("data_parallel_size")))
        scan.set("max_model_len", _as_int(cfg.get("max_seq_len")))
        scan.set("prefix_caching", _as_bool(cfg.get("enable_prefix_caching")))
        scan.set("model", cfg.get("model"))
        for key in ("reasoning_parser", "reasoning_backend"):
            val = cfg.get(key)
            if val and val != "None":
                scan.set("reasoning_parser", val)
    m = _MAX_LEN.search(msg)
    if m:
        scan.set("max_model_len", int(m.group(1)))
    m = _ARCH.search(msg)
    if m:
        scan.set("architecture", m.group(1))
    m = _EP_RANK.search(msg)
    if m:
        scan.ep_size = max(scan.ep_size or 0, int(m.group(1)))
        scan.recognised = True
    for dp in _DP_ENGINE.findall(line):
        scan.dp_engines = max(scan.dp_engines, int(dp) + 1)
    if _AUTO_TOOL.search(msg):
        scan.set("auto_tool_choice", True)
    if _READY.search(msg):
        scan.ready = True
        scan.recognised = True
    if _VLLM_LINE.search(line) or scan.fields.get("vllm_version") is not None:
        scan.vllm_evidence = True
    if _LOAD_START.search(msg):
        scan.loading = True
    if _LOAD_DONE.search(msg):
        scan.loaded = True
    _scan_memory(scan, msg)
    _scan_failures(scan, line, msg)


def _scan_memory(scan: _Scan, msg: str) -> None:
    """The start-up memory figures; a multi-rank log prints one per rank or engine: the largest is kept (the
    rank nearest its limit)."""
    for pat, keys in _MEMORY:
        m = pat.search(msg)
        if not m:
            continue
        memory: dict[str, float] = scan.fields.setdefault("memory", {})
        for key, text in zip(keys, m.groups(), strict=True):
            value = float(text.replace(",", ""))
            memory[key] = max(value, memory.get(key, value))
        scan.recognised = True


# Lines that each say one thing went wrong: (pattern, finding id, severity, message, layer).
_SIGNS: tuple[tuple[re.Pattern[str], str, Severity, str, str], ...] = (
    (_MISSING_KERNEL, "accept.startup.missing_kernel", "error",
     "a GPU kernel this build needs is missing for this GPU or driver (build or image does not match the hardware)",
     _ENV),
    (_UNSUPPORTED_ARCH, "accept.startup.unsupported_arch", "error",
     "the GPU architecture is not supported by the PyTorch / kernels in this image", _ENV),
    (_FALLBACK, "accept.startup.fallback", "warning",
     "vLLM fell back to a slower or different path at start-up: the serving layer is not the one the recipe "
     "measured", "config"),
)


def _scan_failures(scan: _Scan, line: str, msg: str) -> None:
    m = _KV_CAPACITY.search(msg)
    if m:
        fits = f"; about {m.group(4)} tokens would fit" if m.group(4) else ""
        scan.add("accept.startup.kv_capacity", "error",
                 f"the KV cache cannot hold one request at max-model-len {m.group(1)} ({m.group(2)} GiB needed, "
                 f"{m.group(3)} GiB available{fits}): a start-up capacity failure of the environment: give the KV "
                 "cache more memory (GPUs, gpu-memory-utilization, KV cache space) or lower --max-model-len", _ENV, msg)
        scan.vllm_evidence = True
    m = _BAD_PARSER.search(msg)
    if m:
        kind = m.group(1).replace(" ", "_")
        scan.add(f"accept.startup.unknown_{kind}_parser", "error",
                 f"the server refused to start: {m.group(1)} parser {m.group(2)} is not one this vLLM registers "
                 f"(--{m.group(1).replace(' ', '-')}-parser must name a registered parser; the log lists them)",
                 "config", msg)
        scan.vllm_evidence = True
    for cause, pat, text in _CUDA_INIT:
        m = pat.search(msg)
        if m:
            scan.add(f"accept.startup.cuda_init.{cause}", "error",
                     "CUDA initialisation failed: " + text.format(*m.groups()), _ENV, msg)
            break
    if _DMABUF.search(msg):
        scan.add("accept.startup.nccl_dmabuf", "error",
                 "RDMA memory registration through DMA-BUF failed (errno 524 / not supported): set "
                 "NCCL_DMABUF_ENABLE=0 to fall back to nvidia_peermem, which must then be loaded", _ENV, msg)
    elif _NCCL.search(msg):
        scan.add("accept.startup.nccl", "error",
                 "NCCL failed while the workers set up their communicators: a fabric / RDMA / topology problem "
                 "on the hosts (rerun with NCCL_DEBUG=INFO), not a serving setting", _ENV, msg)
    for pat, fid, severity, text, layer in _SIGNS:
        if pat.search(msg):
            scan.add(fid, severity, text, layer, msg)
    if _OOM.search(msg) and scan.oom_line is None:
        # The phase is decided at the end: a worker's "while processing method load_model" often follows the
        # OOM line it explains.
        scan.oom_line, scan.oom_after_load = msg, scan.loaded
        scan.recognised = True
    m = _EXCEPTION.match(msg)
    if m and scan.first_exception is None and m.group(1) not in ("UserWarning", "FutureWarning"):
        scan.first_exception = msg.strip()


def _run_image(tokens: list[str]) -> int | None:
    """The index of the image of a ``docker run`` / ``podman run`` line: its first positional token."""
    for start in range(len(tokens) - 1):
        if tokens[start].rsplit("/", 1)[-1] in ("docker", "podman", "nerdctl") and tokens[start + 1] == "run":
            i = start + 2
            while i < len(tokens):
                tok = tokens[i]
                if tok.startswith("-"):
                    i += 2 if tok in _RUN_VALUED else 1
                    continue
                # A token that starts with its digest names no repository.
                names = not tok.startswith("@") and (_IMAGE_REF.fullmatch(tok) or ":" in tok or "/" in tok)
                return i if names else None
    return None


def parse_launch_command(text: str) -> dict[str, Any]:
    """Flags of a ``vllm serve`` / ``docker run ... vllm-openai`` command (continuation lines joined)."""
    joined = re.sub(r"\\[ \t]*\r?\n", " ", text)
    try:
        tokens = shlex.split(joined, comments=False, posix=True)
    except ValueError:
        tokens = joined.split()
    out: dict[str, Any] = {"argv": redact_argv(tokens)}
    flags: dict[str, Any] = {}
    model: str | None = None
    after_serve = False
    run_image = _run_image(tokens)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        m = _IMAGE.fullmatch(tok)
        if m or (run_image is not None and i == run_image):
            out["image"] = parse_image_ref(tok).without_digest()
            dm = _DIGEST.search(tok)
            if dm:
                out["image_digest"] = dm.group(1)
            after_serve = True  # the image's entrypoint is `vllm serve`: the next positional is the model
        elif tok == "serve" or tok.endswith("api_server") or tok.endswith("api_server.py"):
            after_serve = True
        elif tok.startswith("-") and after_serve:
            name, _, value = tok.partition("=")
            name = _FLAG_ALIASES.get(name, name)
            name = "--" + name.lstrip("-").replace("_", "-")
            if value:
                flags[name] = value
            elif name in _BOOL_FLAGS or i + 1 >= len(tokens) or tokens[i + 1].startswith("-"):
                flags[name] = True
            else:
                flags[name] = tokens[i + 1]
                i += 1
        elif after_serve and model is None and not tok.startswith("-") and "=" not in tok:
            model = tok
        i += 1
    model = flags.get("--model") if isinstance(flags.get("--model"), str) else model
    out["flags"] = redact_argv([f"{k}={v}" if v is not True else k for k, v in flags.items()])
    out["model"] = model
    out["tensor_parallel_size"] = _as_int(flags.get("--tensor-parallel-size"))
    out["pipeline_parallel_size"] = _as_int(flags.get("--pipeline-parallel-size"))
    out["data_parallel_size"] = _as_int(flags.get("--data-parallel-size"))
    out["enable_expert_parallel"] = bool(flags.get("--enable-expert-parallel"))
    out["max_model_len"] = _as_int(flags.get("--max-model-len"))
    if flags.get("--enable-prefix-caching"):
        out["prefix_caching"] = True
    elif flags.get("--no-enable-prefix-caching"):
        out["prefix_caching"] = False
    else:
        out["prefix_caching"] = None
    out["tool_call_parser"] = flags.get("--tool-call-parser") if isinstance(flags.get("--tool-call-parser"),
                                                                            str) else None
    out["reasoning_parser"] = flags.get("--reasoning-parser") if isinstance(flags.get("--reasoning-parser"),
                                                                            str) else None
    out["auto_tool_choice"] = bool(flags.get("--enable-auto-tool-choice"))
    # --all2all-backend, else VLLM_ALL2ALL_BACKEND in the command's environment (`VAR=x vllm serve`, `-e VAR=x`);
    # the flag replaced the variable (docs/facts.md section 15).
    env = dict(t.split("=", 1) for t in tokens if "=" in t and not t.startswith("-"))
    out["all2all_backend"] = all2all.backend_of([f"{k}={v}" for k, v in flags.items() if isinstance(v, str)],
                                                env)[0]
    out["raw_argv"] = tokens
    return out


def _read(path: Path, what: str) -> str:
    data = read_input(path, what, kind="a text log", limit="log", text=True)
    return data.decode("utf-8", errors="replace")


_FIELDS = ("vllm_version", "image", "image_digest", "cuda_version", "torch_version", "model", "architecture",
           "tensor_parallel_size", "expert_parallel_size", "data_parallel_size", "pipeline_parallel_size",
           "max_model_len", "prefix_caching", "tool_call_parser", "reasoning_parser", "auto_tool_choice",
           "all2all_backend", "served_model_name", "host", "port", "block_size")


_OTHER_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _each_line(text: str) -> Iterator[str]:
    """The lines of ``text`` one at a time (``splitlines`` would hold a second copy of a 100 MB log as a list)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        line = text[start:end]
        if _OTHER_BREAKS.search(line):
            yield from line.splitlines()  # \r of progress bars and the rarer breaks, as splitlines splits them
        else:
            yield line
        start = end + 1


def analyse_startup(log_text: str, launch_text: str | None = None, *, target: Target | None = None,
                    source: str = "log") -> ProbeResult:
    """Judge one start-up: extracted fields, findings, and pass / fail / inconclusive with the reason."""
    scan = _Scan()
    for line in _each_line(log_text):
        _scan_line(scan, line)
    launch = parse_launch_command(launch_text) if launch_text is not None else None
    data: dict[str, Any] = {k: scan.fields.get(k) for k in _FIELDS}
    if launch is not None:
        _merge_launch(scan, data, launch)
    _derive_parallel(scan, data)
    if not scan.recognised and launch is None:
        raise UsageError(f"{source} does not look like a vLLM start-up log: no version, arguments, "
                         "readiness or known failure in it")
    data["ready"] = scan.ready
    data["memory"] = {k: (int(v) if k in ("kv_cache_tokens", "concurrency_tokens") else v)
                      for k, v in (scan.fields.get("memory") or {}).items()}
    data["launch_command"] = " ".join(launch["argv"]) if launch else None
    data["server"] = identity.from_startup(data)
    if target is not None:
        _check_target(scan, data, target, launch)
    if scan.oom_line is not None:
        during_load = scan.loading and not scan.oom_after_load
        phase = "while loading the model weights" if during_load else "during start-up (weights, KV cache or graphs)"
        scan.add("accept.startup.load_oom", "error",
                 f"GPU out of memory {phase}: an environment / topology problem (GPU memory per rank, parallel "
                 "layout, gpu-memory-utilization, other processes on the GPUs), not a traffic one: limiting "
                 "traffic does not fix it", _ENV, scan.oom_line)
    if not scan.ready and scan.first_exception and not any(f.failed for f in scan.findings):
        scan.add("accept.startup.crash", "error", "the server stopped with an exception before it was ready",
                 "environment", scan.first_exception)
    status: Status
    failing = sorted((f for f in scan.findings if f.failed), key=_priority)
    if failing:
        status, reason = "fail", failing[0].message
    elif scan.ready and not scan.vllm_evidence and launch is None:
        scan.add("accept.startup.no_vllm_evidence", "warning",
                 "the log reports a server ready but nothing in it comes from vLLM (no version, engine, arguments "
                 "or model line): it proves nothing about a vLLM start-up", None, "no vLLM line in the log")
        status, reason = "inconclusive", ("the log shows a server ready but no vLLM evidence (no version, engine or "
                                          "arguments line)")
    elif scan.ready and not scan.vllm_evidence:
        scan.add("accept.startup.no_vllm_evidence", "warning",
                 "the log reports a server ready but nothing in it comes from vLLM (no version, engine, arguments "
                 "or model line); the launch command alone does not show what ran", None, "no vLLM line in the log")
        status, reason = "inconclusive", ("the log shows a server ready but no vLLM evidence (no version, engine or "
                                          "arguments line)")
    elif scan.ready:
        status, reason = "pass", "the server reported ready and the log shows no start-up failure"
    else:
        status, reason = "inconclusive", ("the log ends before the server reported ready "
                                          "(no 'Application startup complete' or route listing) and shows no failure")
    return ProbeResult(probe=PROBE, status=status, reason=reason, findings=scan.findings, data=data)


# The reason names the deepest cause first: a too-old driver explains a missing kernel, not the reverse.
_CAUSE_ORDER = ("accept.startup.kv_capacity", "accept.startup.unknown_tool_call_parser",
                "accept.startup.unknown_reasoning_parser", "accept.startup.cuda_init",
                "accept.startup.unsupported_arch", "accept.startup.missing_kernel", "accept.startup.nccl_dmabuf",
                "accept.startup.nccl", "accept.startup.load_oom", "accept.startup.crash")


def _priority(f: Finding) -> int:
    base = f.check_id.rsplit(".", 1)[0] if f.check_id.startswith("accept.startup.cuda_init.") else f.check_id
    return _CAUSE_ORDER.index(base) if base in _CAUSE_ORDER else len(_CAUSE_ORDER)


def _merge_launch(scan: _Scan, data: dict[str, Any], launch: dict[str, Any]) -> None:
    """Fill gaps from the launch command; where both speak and disagree, the log wins and it is said."""
    for key in ("image", "image_digest", "model", "tensor_parallel_size", "pipeline_parallel_size",
                "data_parallel_size", "max_model_len", "prefix_caching", "tool_call_parser", "reasoning_parser",
                "all2all_backend"):
        lv = launch.get(key)
        if lv is None:
            continue
        if data.get(key) is None:
            data[key] = lv
        elif data[key] != lv and key not in ("model", "image"):
            scan.add(f"accept.startup.launch_mismatch_{key}", "warning",
                     f"the launch command says {key}={lv} but the log shows {data[key]}: the log is what ran",
                     "config", f"{key}: launch {lv} / log {data[key]}")
    if launch.get("enable_expert_parallel"):
        scan.fields["enable_expert_parallel"] = True
    if launch.get("auto_tool_choice") and not data.get("auto_tool_choice"):
        data["auto_tool_choice"] = True


def _derive_parallel(scan: _Scan, data: dict[str, Any]) -> None:
    if data.get("data_parallel_size") is None and scan.dp_engines > 1:
        data["data_parallel_size"] = scan.dp_engines
    if scan.ep_size:
        data["expert_parallel_size"] = scan.ep_size
    elif scan.fields.get("enable_expert_parallel"):
        # vLLM's expert-parallel group spans TP x DP ranks when --enable-expert-parallel is set.
        data["expert_parallel_size"] = (data.get("tensor_parallel_size") or 1) * (data.get("data_parallel_size") or 1)
    elif data.get("tensor_parallel_size") is not None:
        data["expert_parallel_size"] = 1


def _is_target_model(model: Any, target: Target) -> bool:
    if not isinstance(model, str):
        return False
    want = target.serve.model.rsplit("/", 1)[-1].lower()
    return model.rstrip("/").rsplit("/", 1)[-1].lower() == want


def _check_target(scan: _Scan, data: dict[str, Any], target: Target, launch: dict[str, Any] | None) -> None:
    """Compare against the target's serve flags and minimum vLLM; binding only for the target's model."""
    binding = _is_target_model(data.get("model"), target)
    sev: Severity = "error" if binding else "warning"
    scope = "" if binding else f" (the log serves {data.get('model')!r}, not {target.serve.model}: informative only)"
    want_tool = target.serve.required_flags.get("--tool-call-parser")
    if want_tool and data.get("tool_call_parser") not in (None, want_tool):
        scan.add("accept.startup.tool_call_parser", sev,
                 f"tool-call parser is {data['tool_call_parser']}, the target needs {want_tool}{scope}", "config",
                 f"tool_call_parser={data['tool_call_parser']}")
    elif want_tool and data.get("tool_call_parser") is None and (launch is not None or scan.saw_args):
        scan.add("accept.startup.tool_call_parser", sev,
                 f"no tool-call parser configured: tool_choice auto needs --tool-call-parser {want_tool}{scope}",
                 "config", "tool_call_parser not set")
    want_reason = target.serve.required_flags.get("--reasoning-parser")
    if want_reason and data.get("reasoning_parser") not in (None, want_reason):
        scan.add("accept.startup.reasoning_parser", sev,
                 f"reasoning parser is {data['reasoning_parser']}, the target needs {want_reason}{scope}", "config",
                 f"reasoning_parser={data['reasoning_parser']}")
    if "--enable-prefix-caching" in target.serve.required_flags and data.get("prefix_caching") is False:
        scan.add("accept.startup.prefix_caching_off", "warning",
                 "prefix caching is off: for Kimi K3 it is off by default and must be turned on with "
                 "--enable-prefix-caching" + scope, "config", "prefix_caching=False")
    have = version_tuple(data.get("vllm_version"))
    need = version_tuple(target.vllm.min_version)
    if have is not None and need is not None and have < need:
        scan.add("accept.startup.vllm_version", sev,
                 f"vLLM {data['vllm_version']} is older than the target's minimum {target.vllm.min_version}{scope}",
                 "config", f"vllm_version={data['vllm_version']}")
    cuda = version_tuple(data.get("cuda_version"))
    want_cuda = version_tuple(target.image.cuda)
    if binding and cuda is not None and want_cuda is not None and cuda[0] < want_cuda[0]:
        scan.add("accept.startup.unofficial_build", "warning",
                 f"the container runs CUDA {data['cuda_version']} but the target image is CUDA {target.image.cuda}: a "
                 "self-built stack is a separate evidence track, never equivalent to the official image",
                 "environment", f"cuda_version={data['cuda_version']}")


def run_startup(log: Path, launch_command: Path | None = None, *, target: Target | None = None) -> ProbeResult:
    log_text = _read(log, "start-up log")
    launch_text = _read(launch_command, "launch command") if launch_command is not None else None
    return analyse_startup(log_text, launch_text, target=target, source=f"start-up log {log}")


def summary_lines(result: ProbeResult) -> Iterable[str]:
    """Human lines for the terminal: the extracted fields that are known."""
    for key in _FIELDS:
        val = result.data.get(key)
        if val is not None:
            yield f"{key}: {val}"
    memory = result.data.get("memory") or {}
    if memory:
        yield "start-up memory: " + ", ".join(f"{k} {v:g}" for k, v in memory.items())
