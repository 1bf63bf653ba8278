"""`accept all`: every probe against one endpoint, into one run directory (kind ``accept``).

Layout (docs/acceptance.md, "Run directory"): ``command.json``, ``accept.json``, one
``<probe>.json`` per probe that ran, ``requests/<probe>.jsonl``, ``metrics/<window>.txt``,
``load/curves.jsonl``, ``inputs/``, ``manifest.json`` last. Everything goes through the run
directory's redactor, and the API key's value is scrubbed from every string besides: a server that
echoes the key in an error message does not put it into evidence.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from k3fleet.accept.client import Endpoint, EndpointError, preflight
from k3fleet.accept.record import Recorder
from k3fleet.accept.result import ProbeResult, combined_exit_code
from k3fleet.errors import EXIT_FAILED, EXIT_INCOMPLETE, UsageError, read_input
from k3fleet.evidence import REDACTED, RunDir

SCHEMA_VERSION = "1.0"
# Probes an acceptance run needs; startup joins them when a log is given. Absent means not proven.
REQUIRED = ("prefix_cache", "agent", "load")
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


@dataclass
class AllResult:
    run_dir: RunDir
    summary: dict[str, Any]
    results: dict[str, ProbeResult]

    @property
    def exit_code(self) -> int:
        return int(self.summary["exit_code"])


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


def load_options(overrides: Mapping[str, Any]) -> Any:
    """The load probe's options with the operator's overrides; bad ones are one usage line, found
    before anything runs or is written."""
    load_mod: Any = importlib.import_module("k3fleet.accept.load")
    fields = load_mod.LoadOptions.model_fields
    # The field names (step_s, max_duration_s); a dash is read as an underscore.
    overrides = {str(k).replace("-", "_"): v for k, v in overrides.items()}
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise UsageError(f"--load-option {unknown[0]}: not a load option (one of {', '.join(fields)})")
    try:
        return load_mod.LoadOptions(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"--load-option {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from exc


async def run_all(endpoint: Endpoint, opts: AllOptions, argv: Sequence[str], *,
                  progress: Progress | None = None) -> AllResult:
    say = progress or (lambda _m: None)
    rd = RunDir.create(opts.runs_dir, "accept", safe_argv(argv), out=opts.out)
    key = endpoint.api_key()
    ev = _Evidence(rd, [key] if key else [])
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "base_url": endpoint.display_url, "model": endpoint.model,
        "tls_verify": endpoint.verify_tls, "started_at": _now(), "finished_at": None, "server": {},
        "probes": {}, "not_run": {}, "interrupted": False, "error": None, "exit_code": EXIT_INCOMPLETE}
    results: dict[str, ProbeResult] = {}
    rec = Recorder()
    try:
        await _run_probes(endpoint, opts, summary, results, rec, ev, say)
    except EndpointError as exc:
        summary["error"] = exc.message
        summary["exit_code"] = exc.exit_code
    except (KeyboardInterrupt, asyncio.CancelledError):
        summary["interrupted"] = True
    finally:
        _write_evidence(ev, rec, results, summary, opts)
    if summary["error"] is None:
        summary["exit_code"] = _exit_code(results, summary)
        ev.json("accept.json", summary)
    rd.write_manifest()
    return AllResult(rd, summary, results)


def _exit_code(results: Mapping[str, ProbeResult], summary: Mapping[str, Any]) -> int:
    code = combined_exit_code(results.values()) if results else EXIT_INCOMPLETE
    if code == EXIT_FAILED:
        return code
    missing = [p for p in REQUIRED if p not in results]
    if missing or summary.get("interrupted"):
        return EXIT_INCOMPLETE
    return code


async def _run_probes(endpoint: Endpoint, opts: AllOptions, summary: dict[str, Any],
                      results: dict[str, ProbeResult], rec: Recorder, ev: _Evidence, say: Progress) -> None:
    from k3fleet.accept.agent import run_agent
    from k3fleet.accept.metrics import MetricsError, scrape
    from k3fleet.accept.prefix_cache import run_prefix_cache

    if opts.log is not None and "startup" not in opts.skip:
        from k3fleet.accept.startup import run_startup
        from k3fleet.targets import load_target

        say("startup: reading the start-up log")
        results["startup"] = run_startup(opts.log, opts.launch_command, target=load_target(opts.target))
        _copy_input(ev, opts.log, "inputs/startup.log")
        if opts.launch_command is not None:
            _copy_input(ev, opts.launch_command, "inputs/launch_command.txt")
    elif opts.log is None:
        summary["not_run"]["startup"] = "no --log given"

    concurrency = max(4, getattr(opts.agent, "concurrency", 4))
    async with endpoint.async_client(concurrency) as client:
        say(f"endpoint: {endpoint.display_url} model {endpoint.model}")
        info = await preflight(client, endpoint)
        summary["server"].update(info)
        try:
            snap = await scrape(client, endpoint.base_url)
            rec.snapshot("start", snap.raw)
            summary["server"].update(metrics_exposition=snap.exposition, cache_config=snap.cache_config(),
                                     old_metric_names=snap.old_names())
        except MetricsError as exc:
            summary["server"]["metrics_error"] = str(exc)
        if "prefix_cache" in opts.skip:
            summary["not_run"]["prefix_cache"] = "skipped (--skip)"
        else:
            results["prefix_cache"] = await run_prefix_cache(endpoint, opts.prefix, recorder=rec, progress=say,
                                                             client=client)
        if "agent" in opts.skip:
            summary["not_run"]["agent"] = "skipped (--skip)"
        else:
            results["agent"] = await run_agent(endpoint, opts.agent, recorder=rec, progress=say, client=client)
    if "load" in opts.skip:
        summary["not_run"]["load"] = "skipped (--skip)"
    elif not load_available():
        summary["not_run"]["load"] = "the load probe is not installed in this build"
    else:
        # Imported by name: the load probe is its own module and may be absent from a build.
        load_mod: Any = importlib.import_module("k3fleet.accept.load")
        say("load: phases (long-input ladder, agent ramp, sustained)")
        load_opts = opts.load_opts if opts.load_opts is not None else load_options(opts.load_overrides)
        results["load"] = await load_mod.run_load(endpoint, load_opts, _load_observer(load_mod.LoadObserver, say),
                                                  recorder=rec)


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


def _write_evidence(ev: _Evidence, rec: Recorder, results: Mapping[str, ProbeResult], summary: dict[str, Any],
                    opts: AllOptions) -> None:
    """Everything gathered, whatever happened: probe files, requests, metric snapshots, accept.json."""
    for name, result in results.items():
        data = result.model_dump(mode="json")
        ev.json(f"{name}.json", data)
        summary["probes"][name] = data
        if name == "load":
            for part in ("curves", "samples", "failures"):
                rows = result.data.get(part)
                if isinstance(rows, list):
                    ev.jsonl(f"load/{part}.jsonl", [r for r in rows if isinstance(r, Mapping)])
    for probe, rows in rec.exchanges.items():
        if opts.no_bodies:
            from k3fleet.evidence.privacy import without_bodies

            rows = [without_bodies(r) for r in rows]
        ev.jsonl(f"requests/{probe}.jsonl", rows)
    if opts.profile is not None:
        from k3fleet.accept.profile_cases import write_profile_evidence

        write_profile_evidence(ev.rd, opts.profile)
    for window, raw in rec.metrics.items():
        ev.text(f"metrics/{window}.txt", raw)
    summary["finished_at"] = _now()
    ev.json("accept.json", summary)
