"""`k3fleet accept load`: the load schedule against an endpoint, with a progress bar.

The run directory (the layout of ``accept all`` with only the load probe, docs/acceptance-load.md
"Run directory") is written by the flow, ``k3fleet.accept.run.run_accept_load``; this command parses
the options and shows the progress. The first Ctrl-C stops the run and writes what was measured
(exit 3); a second aborts.
"""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from k3fleet.bounds import seconds_option
from k3fleet.change.interrupt import cancel_on_signals
from k3fleet.cli.accept import (
    AsJson,
    EndpointArgs,
    Quiet,
    accept_app,
    endpoint_options,
    print_result,
)
from k3fleet.cli.base import err
from k3fleet.errors import UsageError, validation_line

T = TypeVar("T", int, float)


def _numbers(text: str, flag: str, kind: type[T], what: str) -> list[T]:
    """A comma-separated list of ``kind`` (int or float) for ``flag``; one UsageError line otherwise."""
    try:
        values = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a comma-separated list of {what}") from None
    if not values:
        raise UsageError(f"{flag}: give at least one value")
    return values


def _ints(text: str, flag: str) -> list[int]:
    return _numbers(text, flag, int, "integers")


_DEFAULT_PHASES = "long_input,agent_ramp,sustained"


def _floats(text: str, flag: str) -> list[float]:
    return _numbers(text, flag, float, "numbers")


@accept_app.command("load")
@endpoint_options(timeout=120.0)
def load(
    server: EndpointArgs,
    phases: Annotated[str, typer.Option("--phases", help="Comma list of long_input, agent_ramp, sustained, "
                                                         "rate_ramp, slo_search.")] = "long_input,agent_ramp,sustained",
    ladder: Annotated[str, typer.Option("--ladder", help="Context lengths (tokens) of the long-input ladder.")]
    = "1024,4096,16384",
    ladder_output: Annotated[int, typer.Option("--ladder-output", min=1, help="Output tokens per ladder request.")]
    = 32,
    ladder_repeats: Annotated[int, typer.Option("--ladder-repeats", min=1, max=20, help="Requests per ladder length.")]
    = 2,
    ramp: Annotated[str, typer.Option("--ramp", help="Concurrent agent sessions per ramp step.")] = "1,2,4,8,16",
    step_s: Annotated[float, typer.Option("--step-seconds", parser=seconds_option("--step-seconds", "load step"),
                                          help="Seconds per ramp step.")] = 10.0,
    turns: Annotated[int, typer.Option("--turns", min=1, max=50, help="Turns per agent conversation.")] = 4,
    turn_output: Annotated[int, typer.Option("--turn-output", min=1, help="Output tokens per agent turn.")] = 64,
    system_tokens: Annotated[int, typer.Option("--system-tokens", min=0, help="Shared system prompt size.")] = 2048,
    sustained_concurrency: Annotated[int | None, typer.Option(
        "--sustained-concurrency", min=1, help="Default: the highest concurrency the ramp held.")] = None,
    sustained_s: Annotated[float, typer.Option("--sustained-seconds", help="Length of the sustained phase.",
                                               parser=seconds_option("--sustained-seconds", "load step"))] = 20.0,
    ttft_slo: Annotated[float, typer.Option("--ttft-slo", parser=seconds_option("--ttft-slo", "load slo"),
                                            help="TTFT p95 limit per step (s).")] = 5.0,
    itl_slo: Annotated[float, typer.Option("--itl-slo", parser=seconds_option("--itl-slo", "load slo"),
                                           help="Inter-token p95 limit per step (s).")] = 0.25,
    max_requests: Annotated[int, typer.Option("--max-requests", min=1, help="Hard bound on requests.")] = 5000,
    max_duration: Annotated[float, typer.Option("--max-duration", parser=seconds_option("--max-duration", "load step"),
                                                help="Hard bound in seconds (at most 86400).")] = 600.0,
    rates: Annotated[str, typer.Option("--rates", help="Open-loop request rates (req/s) of the rate_ramp phase.")]
    = "1,2,4,8",
    rate_s: Annotated[float, typer.Option("--rate-seconds", parser=seconds_option("--rate-seconds", "load step"),
                                          help="Seconds of arrivals per open-loop step.")] = 10.0,
    arrival: Annotated[str, typer.Option("--arrival", help="poisson, gamma (with --burstiness) or closed (paced "
                                                            "sessions, --max-concurrency of them).")] = "poisson",
    burstiness: Annotated[float, typer.Option("--burstiness", help="Gamma shape of the inter-arrival times: 1 "
                                                                    "Poisson, below 1 burstier.")] = 1.0,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency", min=1, max=4096,
                                                        help="Open loop: at most this many requests in flight.")]
    = None,
    e2e_slo: Annotated[float | None, typer.Option("--e2e-slo", parser=seconds_option("--e2e-slo", "load slo"),
                                                  help="End-to-end limit per request for goodput (s).")] = None,
    goodput_target: Annotated[float, typer.Option("--goodput-target", min=0.01, max=1.0,
                                                  help="Share of requests within the limits a rate needs.")] = 0.95,
    search_steps: Annotated[int, typer.Option("--search-steps", min=1, max=30, help="SLO search steps.")] = 6,
    search_low: Annotated[float | None, typer.Option("--search-low", min=0.001, help="SLO search: a rate to "
                                                     "start from when no ramp ran (req/s).")] = None,
    search_high: Annotated[float | None, typer.Option("--search-high", min=0.001, help="SLO search: the rate "
                                                      "above it (req/s).")] = None,
    target_rate: Annotated[float | None, typer.Option("--target-rate", min=0.001, help="Production's peak rate "
                                                      "(req/s): the SLO rate's margin is read against it.")] = None,
    telemetry_url: Annotated[str | None, typer.Option("--telemetry-url", help="A DCGM exporter's /metrics URL: "
                                                      "GPU memory, power and utilisation sampled with the run.")]
    = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="Replay this request log (JSON Lines; "
                                               "docs/acceptance-load.md 'Trace replay').")] = None,
    trace_speed: Annotated[float, typer.Option("--trace-speed", min=0.001, max=1000.0,
                                               help="Replay the trace this many times faster.")] = 1.0,
    retries: Annotated[int, typer.Option("--retries", min=0, max=10, help="Send a 429, 503 or timed-out agent "
                                         "turn again up to N times (counted).")] = 0,
    retry_backoff: Annotated[float, typer.Option("--retry-backoff", min=0.0, max=3600.0,
                                                 help="Seconds before the first retry, doubled each time.")] = 0.5,
    repeat: Annotated[int, typer.Option("--repeat", min=1, max=30, help="Run the schedule N times: each figure "
                                        "gets its spread and 95% interval.")] = 1,
    warmup: Annotated[float, typer.Option("--warmup", min=0.0, max=86400.0,
                                          help="Seconds at the start of each timed step left out of its figures.")]
    = 0.0,
    cooldown: Annotated[float, typer.Option("--cooldown", min=0.0, max=86400.0,
                                            help="Seconds at the end of each timed step left out of its figures.")]
    = 0.0,
    as_json: AsJson = False,
    quiet: Quiet = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    profile: Annotated[Path | None, typer.Option("--profile", help="Production profile (YAML): the ladder, ramp, "
                                                                   "sustained run and SLOs come from it "
                                                                   "(k3fleet schema profile).")] = None,
) -> None:
    """Long-input ladder, agent-session ramp and a sustained run, with /metrics sampled throughout."""
    from k3fleet.accept.load import LoadOptions
    from k3fleet.accept.run import run_accept_load
    from k3fleet.cli.load_progress import LoadBar

    wanted = [p.strip() for p in phases.split(",") if p.strip()]
    if trace is not None:
        from k3fleet.accept.load.trace import load_trace

        # Read (and judged) before anything runs or is written; the run reads it again.
        load_trace(trace, speed=trace_speed, limit=max_requests)
        # --trace alone replays the trace; with --phases named, the replay follows them.
        wanted = ["trace"] if phases == _DEFAULT_PHASES else [*(p for p in wanted if p != "trace"), "trace"]
    open_loop: dict[str, object] = dict(rates=_floats(rates, "--rates"), rate_step_s=rate_s, arrival=arrival,
                                        burstiness=burstiness, max_concurrency=max_concurrency,
                                        goodput_target=goodput_target, search_steps=search_steps,
                                        search_low_rps=search_low, search_high_rps=search_high)
    if e2e_slo is not None:
        open_loop["e2e_p95_slo_s"] = e2e_slo
    if telemetry_url is not None:
        open_loop["telemetry_url"] = telemetry_url
    open_loop.update(repeat=repeat, warmup_s=warmup, cooldown_s=cooldown, retry_max=retries,
                     retry_backoff_s=retry_backoff)
    if trace is not None:
        open_loop.update(trace_path=str(trace), trace_speed=trace_speed)
    if target_rate is not None:
        open_loop["target_rps"] = target_rate
    loaded = None
    try:
        if profile is not None:
            from k3fleet.accept.profile_cases import load_options_from_profile
            from k3fleet.models.profile import load_profile

            # The envelope (ladder, ramp, sustained run, SLOs) is the profile's; the shape of a step is ours.
            loaded = load_profile(profile)
            shape: dict[str, object] = dict(phases=wanted, ladder_output_tokens=ladder_output,
                                            ladder_repeats=ladder_repeats, step_s=step_s, session_turns=turns,
                                            turn_output_tokens=turn_output, system_prompt_tokens=system_tokens,
                                            request_timeout_s=server.timeout, **open_loop)
            if loaded.profile.request_rate_rps is not None:
                shape.pop("rates")  # the profile's rate sets the ramp around it
            if max_requests != 5000:
                shape["max_requests"] = max_requests
            if max_duration != 600.0:
                shape["max_duration_s"] = max_duration
            opts = load_options_from_profile(loaded, shape)
        else:
            opts = LoadOptions.model_validate(dict(phases=wanted, ladder_tokens=_ints(ladder, "--ladder"),
                               ladder_output_tokens=ladder_output, ladder_repeats=ladder_repeats,
                               ramp=_ints(ramp, "--ramp"), step_s=step_s, session_turns=turns,
                               turn_output_tokens=turn_output, system_prompt_tokens=system_tokens,
                               sustained_concurrency=sustained_concurrency, sustained_s=sustained_s,
                               max_requests=max_requests, max_duration_s=max_duration, request_timeout_s=server.timeout,
                               ttft_p95_slo_s=ttft_slo, itl_p95_slo_s=itl_slo, **open_loop))
    except ValidationError as exc:
        raise UsageError(validation_line(exc, "accept load")) from exc
    endpoint = server.endpoint()
    stop = cancel_on_signals(lambda: err.print("[yellow]interrupt: stopping the load; writing what was measured "
                                               "(Ctrl-C again to abort)[/yellow]"))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), TextColumn("{task.fields[status]}"), console=err, disable=quiet,
                        transient=False)
    with progress:
        done = run_accept_load(endpoint, opts, LoadBar(progress), sys.argv, runs_dir=runs_dir, out=out_dir,
                               profile=loaded, stop=stop)
    result, rd = done.results["load"], done.run_dir
    data = result.data
    lines = [f"outcome: {data.get('outcome')}" + (f" (ceiling {data['ceiling']})" if data.get("ceiling") else ""),
             f"requests: {data['counts']['requests']} ({data['counts']['ok']} ok), health failures "
             f"{data['counts']['health_failures']}, restarts {data['counts']['restarts']}",
             f"run directory: {rd.path}"]
    rate = data.get("rate")
    if isinstance(rate, dict):
        slo = rate.get("slo") or {}
        line = f"open loop: goodput held up to {rate.get('held_rps') or 0:g} req/s"
        if slo.get("rps") is not None:
            line += f"; SLO rate {slo['rps']:g} req/s" + (f" (missed at {slo['upper_rps']:g})"
                                                          if slo.get("upper_rps") else "")
            if slo.get("margin") is not None:
                line += f", margin {slo['margin']:+.0%} over {slo['target_rps']:g} req/s"
        lines.insert(2, line)
    rep = data.get("repeats")
    if isinstance(rep, dict):
        parts = []
        for key, label in (("ceiling", "ceiling"), ("held_concurrency", "held concurrency"),
                           ("slo_rps", "SLO rate (req/s)")):
            st = rep["envelope"].get(key)
            if st:
                ci = f" (95% interval {st['ci95'][0]:g}-{st['ci95'][1]:g})" if st.get("ci95") else ""
                parts.append(f"{label} {st['mean']:g} +- {st['stdev'] or 0:g}{ci}")
        lines.insert(2, f"{rep['n']} runs: " + ("; ".join(parts) or "no envelope figure in every run"))
    print_result(result, as_json=as_json, lines=lines)
    raise typer.Exit(result.exit_code)
