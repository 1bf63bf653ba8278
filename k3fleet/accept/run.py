"""`accept all`: every probe against one endpoint, into one run directory (kind ``accept``).

Layout (docs/acceptance.md, "Run directory"): ``command.json``, ``accept.json``, one
``<probe>.json`` per probe that ran, ``requests/<probe>.jsonl``, ``metrics/<window>.txt``,
``load/curves.jsonl``, ``inputs/``, ``manifest.json`` last. Everything goes through the run
directory's redactor, and the API key's value is scrubbed from every string besides: a server that
echoes the key in an error message does not put it into evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import importlib
import importlib.util
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.accept.client import Endpoint, EndpointError, preflight
from k3fleet.accept.metrics import MetricsError, scrape
from k3fleet.accept.probes import PROBES, REQUIRED
from k3fleet.accept.record import Recorder
from k3fleet.accept.result import ProbeResult, combined_exit_code
from k3fleet.bounds import read_input
from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE
from k3fleet.evidence import REDACTED, RunDir, layout
from k3fleet.evidence.privacy import without_bodies
from k3fleet.models.evidence import AcceptRecord
from k3fleet.models.target import Target
from k3fleet.targets import load_target

Progress = Callable[[str], None]
_USERINFO = re.compile(r"(?i)\b(https?://)[^/@\s]+@")


@dataclass
class AllOptions:
    runs_dir: Path = Path("runs")
    out: Path | None = None
    log: Path | None = None
    launch_command: Path | None = None
    target: Path | None = None
    skip: list[str] = field(default_factory=list)
    prefix: Any = None  # PrefixOptions
    agent: Any = None  # AgentOptions
    load_overrides: dict[str, Any] = field(default_factory=dict)
    load_opts: Any = None  # LoadOptions already derived (from a production profile); else from load_overrides
    profile: Any = None  # LoadedProfile: kept as profile.json and inputs/ (k3fleet/accept/profile_cases.py)
    no_bodies: bool = False  # requests/*.jsonl without request and response bodies
    # The whole run's time budget (accept all --budget): the agent's rounds and the load schedule are
    # scaled to fit it; None runs every probe at its full options.
    budget_s: float | None = None
    stop: threading.Event | None = None  # set by Ctrl-C: the probe running ends with what it measured


@dataclass
class AllResult:
    run_dir: RunDir
    summary: AcceptRecord
    results: dict[str, ProbeResult]

    @property
    def exit_code(self) -> int:
        return int(self.summary.exit_code if self.summary.exit_code is not None else EXIT_INCOMPLETE)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def safe_argv(argv: Sequence[str]) -> list[str]:
    """The command line without URL user-info (the redactor handles key=value and --token forms)."""
    return [_USERINFO.sub(r"\1", a) for a in argv]


def _scrub(obj: Any, secrets: Sequence[str]) -> Any:
    if not secrets:
        return obj
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, REDACTED)
        return obj
    if isinstance(obj, Mapping):
        return {k: _scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_scrub(v, secrets) for v in obj]
    return obj


class _Evidence:
    """Writes through the run directory, scrubbing the key's value first."""

    def __init__(self, rd: RunDir, secrets: Sequence[str]) -> None:
        self.rd = rd
        self.secrets = [s for s in secrets if s and len(s) >= 4]

    def json(self, rel: str, data: Any) -> None:
        self.rd.write_json(rel, _scrub(data, self.secrets))

    def text(self, rel: str, text: str) -> None:
        self.rd.write_text(rel, _scrub(text, self.secrets))

    def jsonl(self, rel: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.rd.write_jsonl(rel, [_scrub(r, self.secrets) for r in rows])


def load_available() -> bool:
    return importlib.util.find_spec("k3fleet.accept.load") is not None


async def run_all(endpoint: Endpoint, opts: AllOptions, argv: Sequence[str], *,
                  progress: Progress | None = None) -> AllResult:
    # lazy: accept all's start-up probe; accept load, whose command imports this module, needs none of it
    from k3fleet.accept.startup import run_startup

    say = progress or (lambda _m: None)
    # What can be judged before the run exists is judged first: a target that does not load and a --log that is
    # not a start-up log are usage errors (exit 2) that leave no run directory (docs/safety.md "Exit codes").
    target = load_target(opts.target)
    startup: ProbeResult | None = None
    if opts.log is not None and "startup" not in opts.skip:
        say("startup: reading the start-up log")
        startup = run_startup(opts.log, opts.launch_command, target=target)
    key = endpoint.api_key()
    rd = RunDir.create(opts.runs_dir, "accept", safe_argv(argv), out=opts.out)
    ev = _Evidence(rd, [key] if key else [])
    summary = AcceptRecord(base_url=endpoint.display_url, model=endpoint.model, tls_verify=endpoint.verify_tls,
                           started_at=_now(), exit_code=EXIT_INCOMPLETE)
    results: dict[str, ProbeResult] = {}
    rec = Recorder()
    try:
        await _run_probes(endpoint, opts, summary, results, rec, ev, say, target, startup)
    except EndpointError as exc:
        summary.error = exc.message
        summary.exit_code = exc.exit_code
    except (KeyboardInterrupt, asyncio.CancelledError):
        summary.interrupted = True
    finally:
        _write_evidence(ev, rec, results, summary, opts)
    if summary.error is None:
        summary.exit_code = _exit_code(results, summary)
        ev.json(layout.ACCEPT, summary.dump())
    rd.write_manifest()
    return AllResult(rd, summary, results)


def run_accept_load(endpoint: Endpoint, opts: Any, observer: Any, argv: Sequence[str], *, runs_dir: Path,
                    out: Path | None = None, profile: Any = None, stop: threading.Event | None = None) -> AllResult:
    """``accept load``: the load probe alone, into a run directory of ``accept all``'s layout with only the
    load probe (docs/acceptance-load.md "Run directory"), so ``decide`` reads it as acceptance evidence.

    ``opts`` are the load probe's options, ``observer`` its progress, ``profile`` the production
    profile they came from (kept as ``profile.json`` and ``inputs/``). When nothing was measured (the
    first request failed, a second Ctrl-C) accept.json still says what was attempted, and the error
    goes on."""
    # lazy: the load probe can be left out of a build (load_available), and accept all runs without it
    from k3fleet.accept.load import run_load

    key = endpoint.api_key()
    rd = RunDir.create(runs_dir, "accept", safe_argv(argv), out=out)
    ev = _Evidence(rd, [key] if key else [])
    started_at = _now()
    rec = Recorder()
    try:
        result = asyncio.run(run_load(endpoint, opts, observer, stop=stop, recorder=rec))
    except BaseException:
        ev.json(layout.ACCEPT, AcceptRecord(base_url=endpoint.display_url, model=endpoint.model,
                                            tls_verify=endpoint.verify_tls, started_at=started_at,
                                            error="no load measured", exit_code=EXIT_INCOMPLETE).dump())
        rd.write_manifest()
        raise
    summary = AcceptRecord(
        base_url=endpoint.display_url, model=endpoint.model, tls_verify=endpoint.verify_tls, started_at=started_at,
        not_run={p: "accept load runs the load probe only" for p in PROBES if p != "load"},
        interrupted=bool(result.data.get("interrupted")), exit_code=result.exit_code)
    results = {"load": result}
    _write_evidence(ev, rec, results, summary, AllOptions(profile=profile))
    rd.write_manifest()
    return AllResult(rd, summary, results)


def _exit_code(results: Mapping[str, ProbeResult], summary: AcceptRecord) -> int:
    code = combined_exit_code(results.values()) if results else EXIT_INCOMPLETE
    if code == EXIT_FAILED:
        return code
    # Probes an acceptance run needs (startup joins them when a log is given): absent means not proven.
    missing = [p for p in REQUIRED if p not in results]
    if missing or summary.interrupted:
        return EXIT_INCOMPLETE
    return code


async def _run_probes(endpoint: Endpoint, opts: AllOptions, summary: AcceptRecord,
                      results: dict[str, ProbeResult], rec: Recorder, ev: _Evidence, say: Progress,
                      target: Target, startup: ProbeResult | None) -> None:
    # lazy: accept all's own probes; accept load, whose command imports this module, needs none of them
    from k3fleet.accept.agent import run_agent
    from k3fleet.accept.prefix_cache import PrefixOptions, run_prefix_cache

    # The run's target, loaded once (--target, or the packaged default) and handed to every probe that reads it.
    prefix_opts = (opts.prefix or PrefixOptions()).model_copy(update={"target_model": target.serve.model})
    if startup is not None and opts.log is not None:
        results["startup"] = startup
        _copy_input(ev, opts.log, layout.STARTUP_LOG)
        if opts.launch_command is not None:
            _copy_input(ev, opts.launch_command, layout.LAUNCH_COMMAND)
    elif opts.log is None:
        summary.not_run["startup"] = "no --log given"

    concurrency = max(4, getattr(opts.agent, "concurrency", 4))
    async with endpoint.async_client(concurrency) as client:
        say(f"endpoint: {endpoint.display_url} model {endpoint.model}")
        info = await preflight(client, endpoint)
        summary.server.update(info)
        try:
            snap = await scrape(client, endpoint.base_url)
            rec.snapshot("start", snap.raw)
            summary.server.update(metrics_exposition=snap.exposition, cache_config=snap.cache_config(),
                                     old_metric_names=snap.old_names())
        except MetricsError as exc:
            summary.server["metrics_error"] = str(exc)
        # lazy: the load probe can be left out of a build (load_available)
        load_mod: Any = importlib.import_module("k3fleet.accept.load") if load_available() else None
        load_opts = None
        if load_mod is not None and "load" not in opts.skip:
            load_opts = opts.load_opts if opts.load_opts is not None else load_mod.load_options(opts.load_overrides)
        budget = Budget(opts.budget_s, time.monotonic())
        plan = budget.plan(opts, load_opts)
        summary.budget = {"budget_s": opts.budget_s, "plan": plan, "elapsed_s": {}}
        for line in plan_lines(plan, opts.budget_s):
            say(line)
        stop = opts.stop or threading.Event()
        if "prefix_cache" in opts.skip:
            summary.not_run["prefix_cache"] = "skipped (--skip)"
        elif not await _timed("prefix_cache", run_prefix_cache(endpoint, prefix_opts, recorder=rec, progress=say,
                                                                client=client), results, summary, rec, stop, say):
            return
        if "agent" in opts.skip:
            summary.not_run["agent"] = "skipped (--skip)"
        else:
            agent_opts = budget.agent(opts.agent)
            if agent_opts.time_budget_s is not None:
                say(f"agent: up to {agent_opts.repeats} rounds within {agent_opts.time_budget_s:.0f} s")
            if not await _timed("agent", run_agent(endpoint, agent_opts, recorder=rec, progress=say, client=client),
                                results, summary, rec, stop, say):
                return
    if "load" in opts.skip:
        summary.not_run["load"] = "skipped (--skip)"
    elif load_mod is None:
        summary.not_run["load"] = "the load probe is not installed in this build"
    else:
        load_opts = budget.load(load_opts, load_mod)
        say(f"load: phases {', '.join(load_opts.phases)}, time-boxed {load_opts.max_duration_s:.0f} s")
        # The load probe ends by itself on the stop event, with what it measured; it is never cancelled.
        await _timed("load", load_mod.run_load(endpoint, load_opts, _load_observer(load_mod.LoadObserver, say),
                                               recorder=rec, stop=stop), results, summary, rec, None, say)
        if stop.is_set():
            summary.interrupted = True


async def _timed(name: str, coro: Awaitable[ProbeResult], results: dict[str, ProbeResult], summary: AcceptRecord,
                 rec: Recorder, stop: threading.Event | None, say: Progress) -> bool:
    """Run one probe, timing it; on Ctrl-C (``stop``) cancel it and keep what it had sent as an
    inconclusive result. False when the run must end here. The probe runs in this task (a
    KeyboardInterrupt inside it reaches run_all as it would without the watcher)."""
    t0 = time.monotonic()
    me = asyncio.current_task()

    async def watch() -> None:
        assert stop is not None and me is not None
        while not stop.is_set():
            await asyncio.sleep(0.2)
        me.cancel()

    watcher = asyncio.ensure_future(watch()) if stop is not None else None
    try:
        result = await coro
    except EndpointError as exc:
        # The run ends here (run_all records the error), but the summary keeps the probe's row: a load
        # that aborted is a line that says so, not a line that vanishes.
        summary.aborted[name] = exc.message
        _elapsed(summary, name, round(time.monotonic() - t0, 1))
        raise
    except asyncio.CancelledError:
        if stop is None or not stop.is_set() or me is None:
            raise
        me.uncancel()
        sent = len(rec.exchanges.get(name, []))
        results[name] = ProbeResult(probe=name, status="inconclusive", data={"interrupted": True},
                                    reason=f"interrupted after {sent} request(s); what was measured is in "
                                           f"{layout.requests_file(name)}")
        summary.interrupted = True
        _elapsed(summary, name, round(time.monotonic() - t0, 1))
        return False
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    results[name] = result
    elapsed = round(time.monotonic() - t0, 1)
    _elapsed(summary, name, elapsed)
    say(f"{name}: {results[name].status.upper()} in {elapsed:.0f} s ({len(rec.exchanges.get(name, []))} requests "
        "recorded)" if name != "load" else f"load: {results[name].status.upper()} in {elapsed:.0f} s "
        f"({results[name].data.get('counts', {}).get('requests', 0)} requests)")
    return True


# Shares of the budget: the agent's rounds get this fraction of what the prefix-cache probe left (a round
# already started runs to its end), the load schedule the rest (less a margin for its calibration and the
# last in-flight requests).
_AGENT_SHARE = 0.45
_LOAD_MARGIN = 0.85


@dataclass
class Budget:
    """Scales the agent's rounds and the load schedule to one time budget for the whole run."""

    total_s: float | None
    t0: float

    def left(self) -> float | None:
        return None if self.total_s is None else max(0.0, self.total_s - (time.monotonic() - self.t0))

    def plan(self, opts: AllOptions, load_opts: Any) -> dict[str, Any]:
        """How many requests each probe will send (the agent's and the load's are upper bounds)."""
        out: dict[str, Any] = {}
        if "prefix_cache" not in opts.skip:
            reps = getattr(opts.prefix, "repeats", 5) + getattr(opts.prefix, "replays", 1)
            out["prefix_cache"] = {"requests": reps + 2, "tokenize_requests": 5}
        if "agent" not in opts.skip:
            a = opts.agent
            cases = list(getattr(a, "cases", []) or [])
            # call_then_result and timeout_retry send two requests a run.
            per_round = len(cases) + sum(1 for c in cases if c in ("call_then_result", "timeout_retry"))
            out["agent"] = {"rounds": getattr(a, "repeats", 20), "requests_per_round": per_round,
                            "requests": 1 + per_round * getattr(a, "repeats", 20),
                            "time_budget_s": None if self.total_s is None else round(self.total_s * _AGENT_SHARE)}
        if load_opts is not None:
            out["load"] = {"max_requests": load_opts.max_requests,
                           "max_duration_s": (load_opts.max_duration_s if self.total_s is None else
                                              round(min(load_opts.max_duration_s, self.total_s * (1 - _AGENT_SHARE))))}
        return out

    def agent(self, opts: Any) -> Any:
        left = self.left()
        if left is None or opts is None:
            return opts
        return opts.model_copy(update={"time_budget_s": max(1.0, left * _AGENT_SHARE)})

    def load(self, opts: Any, load_mod: Any) -> Any:
        left = self.left()
        if left is None:
            return opts
        box = max(10.0, left * _LOAD_MARGIN)
        steps = (len(opts.ramp) * opts.step_s if "agent_ramp" in opts.phases else 0.0) + (
            opts.sustained_s if "sustained" in opts.phases else 0.0)
        update: dict[str, Any] = {"max_duration_s": min(opts.max_duration_s, box)}
        # The timed steps take about half the box: the ladder and in-flight requests need the rest.
        if steps > box / 2:
            scale = box / 2 / steps
            update.update(step_s=max(1.0, opts.step_s * scale), sustained_s=max(1.0, opts.sustained_s * scale))
        return load_mod.LoadOptions.model_validate({**opts.model_dump(), **update})


def plan_lines(plan: Mapping[str, Any], budget_s: float | None) -> list[str]:
    head = f"plan (budget {budget_s:.0f} s):" if budget_s is not None else "plan (no time budget):"
    lines = [head]
    if "prefix_cache" in plan:
        p = plan["prefix_cache"]
        lines.append(f"  prefix_cache: {p['requests']} chat requests (+ up to {p['tokenize_requests']} /tokenize)")
    if "agent" in plan:
        a = plan["agent"]
        box = f", within about {a['time_budget_s']} s" if a.get("time_budget_s") else ""
        lines.append(f"  agent: up to {a['rounds']} rounds of {a['requests_per_round']} requests "
                     f"({a['requests']} at most{box})")
    if "load" in plan:
        ld = plan["load"]
        lines.append(f"  load: time-boxed {ld['max_duration_s']:.0f} s, at most {ld['max_requests']} requests")
    return lines


def _load_observer(base: type, say: Progress) -> Any:
    """The load probe's observer, reporting phases and notes as progress lines."""

    class Lines(base):  # type: ignore[misc, valid-type]
        def phase_started(self, phase: str, steps: int) -> None:
            say(f"load: {phase} ({steps} steps)")

        def note(self, message: str) -> None:
            say(f"load: {message}")

    return Lines()


def _copy_input(ev: _Evidence, src: Path, rel: str) -> None:
    # The same bounded reader as the startup probe: a FIFO or a device named as --log is refused, not read.
    data = read_input(src, "", kind="a text log", limit="log")
    ev.text(rel, data.decode("utf-8", errors="replace"))


def _elapsed(summary: AcceptRecord, name: str, seconds: float) -> None:
    """The time a probe took, into the run's budget record (set before any probe runs)."""
    if summary.budget is not None:
        summary.budget["elapsed_s"][name] = seconds


def _write_evidence(ev: _Evidence, rec: Recorder, results: Mapping[str, ProbeResult], summary: AcceptRecord,
                    opts: AllOptions) -> None:
    """Everything gathered, whatever happened: probe files, requests, metric snapshots, accept.json."""
    for name, result in results.items():
        data = result.model_dump(mode="json")
        ev.json(layout.probe_file(name), data)
        summary.probes[name] = data
        if name == "load":
            for part in layout.LOAD_ROWS:
                rows = result.data.get(part)
                if isinstance(rows, list):
                    ev.jsonl(layout.load_rows(part), [r for r in rows if isinstance(r, Mapping)])
    for probe, rows in rec.exchanges.items():
        if opts.no_bodies:
            rows = [without_bodies(r) for r in rows]
        ev.jsonl(layout.requests_file(probe), rows)
    if opts.profile is not None:
        # lazy: only a --profile run needs the profile model, kept off the CLI's start-up path (the
        # accept load command imports this module)
        from k3fleet.accept.profile_cases import write_profile_evidence

        write_profile_evidence(ev.rd, opts.profile)
    for window, raw in rec.metrics.items():
        ev.text(layout.metrics_file(window), raw)
    summary.finished_at = _now()
    ev.json(layout.ACCEPT, summary.dump())
