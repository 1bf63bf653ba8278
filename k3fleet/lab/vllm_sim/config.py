"""The simulator's knobs: one pydantic model, one field per ``k3fleet lab serve-vllm`` flag.

Defaults describe a healthy Kimi K3 server as the recipe runs it (prefix caching on, match unit
1536, block size 16); the model, knobs and their meaning are in docs/acceptance-load.md.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFECTS = ("empty_tool_calls", "merged_stream_calls", "marker_in_reasoning", "invalid_arguments",
           "warm_answer_changed", "corrupted_request", "parallel_collapsed", "wrong_function", "irrelevant_call",
           "invent_argument", "stale_turn", "kimi_marker_leak", "call_text_in_content")


class SimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    model: str = "moonshotai/Kimi-K3"
    # The version the lab's start-up logs and image labels name (k3fleet/lab/demo_data, the lab fleet's
    # image_vllm): the simulated server is the server those logs describe, so "one server, one story"
    # holds on the lab (docs/acceptance.md).
    vllm_version: str = "0.27.1"
    max_model_len: int = Field(default=262144, ge=64)

    # Prefix cache (vLLM: --enable-prefix-caching, --block-size; K3: --prefix-match-unit).
    prefix_caching: bool = True
    prefix_match_unit: int = Field(default=1536, ge=0)
    block_size: int = Field(default=16, ge=1, le=4096)
    kv_blocks: int = Field(default=65536, ge=4)

    # Scheduler (vLLM: --max-num-seqs, --max-num-batched-tokens).
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=8192, ge=16)
    # vLLM 0.30+ queue cap (--max-num-queued-reqs): a request past it is answered 503 and counted in
    # vllm:admission_rejections{reason="max_num_queued_reqs"}; None: no cap.
    max_num_queued_reqs: int | None = Field(default=None, ge=0)

    # Latency model: each engine step costs itl_ms plus prefill_ms_per_token per prompt token computed.
    prefill_ms_per_token: float = Field(default=0.05, ge=0)
    itl_ms: float = Field(default=20.0, ge=0.1)

    # Faults.
    defects: dict[str, float] = Field(default_factory=dict)
    crash_above_kv: float | None = Field(default=None, gt=0, le=1)
    restart_after_s: float | None = Field(default=None, ge=0)
    # A share of chat requests answered 503 before scheduling (an overloaded server or gateway), and a share of
    # streams that stop for stall_s after their first tool-call delta (a client times out mid-answer).
    overload_rate: float = Field(default=0.0, ge=0, le=1)
    stall_after_tool_call_rate: float = Field(default=0.0, ge=0, le=1)
    stall_s: float = Field(default=30.0, ge=0, le=3600)
    old_metric_names: bool = False
    # /metrics shows the counters as they were this long ago: vLLM records a step's stats after it has
    # handed the step's outputs to the requests, so a scrape right after a stream can miss that request.
    metrics_lag_s: float = Field(default=0.0, ge=0, le=60)
    metrics_format: str = Field(default="prometheus", pattern="^(prometheus|openmetrics)$")

    # GPUs as a DCGM exporter shows them at /dcgm/metrics (docs/acceptance-load.md "GPU telemetry"): an H200's
    # 143771 MiB and 91 W idle / 700 W cap as nvidia-smi printed them (tests/fixtures/driver/
    # smi_summary_580_h200_busy.txt). Memory used is the weights plus the KV blocks in use plus activations per
    # running sequence: a model, so an OOM's memory curve has a shape; a real vLLM preallocates its KV cache.
    gpu_count: int = Field(default=1, ge=0, le=64)
    gpu_memory_mib: float = Field(default=143771.0, gt=0)
    gpu_weights_mib: float = Field(default=100000.0, ge=0)
    gpu_kv_pool_mib: float = Field(default=40000.0, ge=0)
    gpu_activation_mib_per_seq: float = Field(default=8.0, ge=0)
    gpu_power_idle_w: float = Field(default=91.0, ge=0)
    gpu_power_max_w: float = Field(default=700.0, ge=0)

    enable_prompt_tokens_details: bool = False
    api_key_env: str | None = None
    seed: int = 0

    @field_validator("defects")
    @classmethod
    def _known_defects(cls, value: dict[str, float]) -> dict[str, float]:
        for name, rate in value.items():
            if name not in DEFECTS:
                raise ValueError(f"unknown defect {name!r} (known: {', '.join(DEFECTS)})")
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"defect {name} rate {rate} is not within 0..1")
        return value

    @model_validator(mode="after")
    def _unit_on_blocks(self) -> SimConfig:
        if self.prefix_match_unit and self.prefix_match_unit % self.block_size:
            raise ValueError(f"prefix_match_unit {self.prefix_match_unit} is not a multiple of "
                             f"block_size {self.block_size}")
        return self

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    @property
    def effective_max_model_len(self) -> int:
        """vLLM refuses to start when one max-length request cannot fit the KV cache; the simulator
        serves the largest length that fits instead, and says so at start."""
        return min(self.max_model_len, self.kv_capacity_tokens)


def parse_defects(items: list[str]) -> dict[str, float]:
    """``NAME=RATE`` strings (CLI ``--defect``) to a dict; bad items raise ValueError with one line."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, rate = item.partition("=")
        if not sep:
            raise ValueError(f"--defect {item!r}: expected NAME=RATE, e.g. empty_tool_calls=0.05")
        try:
            out[name.strip()] = float(rate)
        except ValueError as exc:
            raise ValueError(f"--defect {item!r}: rate {rate!r} is not a number") from exc
    return out
