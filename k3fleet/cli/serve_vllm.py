"""`k3fleet lab serve-vllm`: the vLLM-compatible simulator as a foreground server."""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from pydantic import ValidationError

from k3fleet.cli.base import err, lab_app
from k3fleet.errors import UsageError, validation_line


@lab_app.command("serve-vllm")
def serve_vllm(
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback unless you say otherwise).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port; 0 picks a free one.")] = 8000,
    model: Annotated[str, typer.Option("--model", help="Served model name.")] = "moonshotai/Kimi-K3",
    max_model_len: Annotated[int, typer.Option("--max-model-len", min=64,
                                               help="Longest context accepted, in tokens.")] = 262144,
    no_prefix_caching: Annotated[bool, typer.Option("--no-prefix-caching", help="Serve with prefix caching off.")]
    = False,
    prefix_match_unit: Annotated[int, typer.Option("--prefix-match-unit", min=0,
                                                   help="Hits land on multiples of this many tokens (0: blocks).")]
    = 1536,
    block_size: Annotated[int, typer.Option("--block-size", min=1, help="Tokens per KV cache block.")] = 16,
    kv_blocks: Annotated[int, typer.Option("--kv-blocks", min=4, help="KV cache capacity in blocks.")] = 65536,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", min=1,
                                              help="Requests running at once; more wait.")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens", min=16,
                                                        help="Prefill tokens per engine step.")] = 8192,
    prefill_ms_per_token: Annotated[float, typer.Option("--prefill-ms-per-token", min=0.0,
                                                        help="Prefill time per uncached token.")] = 0.05,
    itl_ms: Annotated[float, typer.Option("--itl-ms", min=0.1, help="Engine step (inter-token) time.")] = 20.0,
    defect: Annotated[list[str] | None, typer.Option("--defect", help="NAME=RATE (repeatable): empty_tool_calls, "
                                                     "merged_stream_calls, marker_in_reasoning, invalid_arguments, "
                                                     "warm_answer_changed.")]
    = None,
    crash_above_kv: Annotated[float | None, typer.Option("--crash-above-kv", min=0.0, max=1.0,
                                                         help="Die (5xx, /health down) above this KV usage.")]
    = None,
    restart_after: Annotated[float | None, typer.Option("--restart-after", min=0.0,
                                                        help="Seconds after a crash before coming back empty.")]
    = None,
    old_metric_names: Annotated[bool, typer.Option("--old-metric-names", help="Expose pre-0.12 metric names only.")]
    = False,
    metrics_format: Annotated[str, typer.Option("--metrics-format", help="prometheus or openmetrics.")]
    = "prometheus",
    max_num_queued_reqs: Annotated[int | None, typer.Option(
        "--max-num-queued-reqs", min=0, help="Answer 503 past this many waiting requests (counted as admission "
        "rejections).")] = None,
    metrics_lag: Annotated[float, typer.Option("--metrics-lag", min=0.0, max=60.0,
                                               help="Seconds /metrics lags behind the engine's counters.")] = 0.0,
    enable_prompt_tokens_details: Annotated[bool, typer.Option("--enable-prompt-tokens-details",
                                                               help="Report usage cached_tokens.")] = False,
    api_key_env: Annotated[str | None, typer.Option("--api-key-env", help="Require this variable's value as the "
                                                    "bearer key on /v1.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulated defects.")] = 0,
) -> None:
    """Serve the vLLM-compatible simulator until Ctrl-C (docs/acceptance-load.md)."""
    from k3fleet.lab.vllm_sim import SimConfig, parse_defects, serve

    try:
        cfg = SimConfig(host=host, port=port, model=model, max_model_len=max_model_len,
                        prefix_caching=not no_prefix_caching, prefix_match_unit=prefix_match_unit,
                        block_size=block_size, kv_blocks=kv_blocks, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, prefill_ms_per_token=prefill_ms_per_token,
                        itl_ms=itl_ms, defects=parse_defects(defect or []), crash_above_kv=crash_above_kv,
                        restart_after_s=restart_after, old_metric_names=old_metric_names,
                        metrics_format=metrics_format, metrics_lag_s=metrics_lag,
                        max_num_queued_reqs=max_num_queued_reqs,
                        enable_prompt_tokens_details=enable_prompt_tokens_details,
                        api_key_env=api_key_env, seed=seed)
    except ValidationError as exc:
        raise UsageError(validation_line(exc, "serve-vllm")) from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if cfg.effective_max_model_len < cfg.max_model_len:
        err.print(f"max-model-len {cfg.max_model_len} does not fit {cfg.kv_blocks} KV blocks of {cfg.block_size}: "
                  f"serving {cfg.effective_max_model_len}", markup=False)
    try:
        asyncio.run(serve(cfg))
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    except KeyboardInterrupt:
        err.print("serve-vllm: stopped")
