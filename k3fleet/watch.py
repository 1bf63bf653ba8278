"""``k3fleet watch``: the first production watch window after a go-live decision.

Every interval: ``/health``, ``/metrics`` (the acceptance metrics reader) and, every
``agent_every`` intervals, one sampled agent contract case per critical workflow. The samples are
judged against the accepted baseline (the decision's ``baseline.json``) by :func:`evaluate`, a pure
function of the watch state and one sample. Rollback triggers (docs/decision.md "Watch"):

- ``queue_beyond_envelope``: running + waiting above the accepted concurrency (the ceiling the
  decision named, else the tested envelope) for ``repeat`` intervals in a row;
- ``schema_invalid_tool_calls``: a sampled critical tool-call case fails ``repeat`` times in a row;
- ``cache_hit_regression``: prefix caching switched off (``cache_config_info``), or the interval's
  cache hit ratio below the accepted ratio x (1 - tolerance) for ``repeat`` intervals with traffic;
- ``process_restart_or_oom``: ``/health`` or ``/metrics`` failing ``repeat`` intervals in a row
  (an OOM takes the engine down), or the process start time moved / counters went backwards
  (a restart under the approved profile).

When one fires the watch stops and prints the trigger and the rollback artifact: the baseline's
image, digest and launch configuration.
"""

from __future__ import annotations

import asyncio
import json
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from k3fleet.ansible.module_utils.k3fleet_redact import excerpt
from k3fleet.bounds import check_seconds, parse_seconds, read_bounded
from k3fleet.decide.models import Baseline
from k3fleet.decide.package import FAILED, VERIFIED, PackageCheck, read_package_file, verify_package
from k3fleet.errors import IncompleteError, UsageError

TRIGGERS = ("queue_beyond_envelope", "schema_invalid_tool_calls", "cache_hit_regression", "process_restart_or_oom")
DEFAULT_AGENT_CASES = ("one_required_arg", "streaming_deltas")


class Trigger(BaseModel):
    id: str
    message: str
    t_s: float = Field(description="seconds since the watch started")
    at: float = Field(description="unix time")
    sample: dict[str, Any] = Field(default_factory=dict)


class Sample(BaseModel):
    t_s: float
    at: float
    health: int | None = None
    health_error: str | None = None
    metrics_error: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    queries: float | None = None
    hits: float | None = None
    prompt_tokens: float | None = None
    caching_enabled: bool | None = None
    process_start: float | None = None
    agent: dict[str, str] | None = Field(default=None, description="sampled case -> pass or its defects")


@dataclass
class WatchState:
    baseline: Baseline
    repeat: int = 2
    cache_tolerance: float = 0.5
    streak: dict[str, int] = field(default_factory=dict)
    last: Sample | None = None
    first_start: float | None = None

    @property
    def queue_limit(self) -> int | None:
        if self.baseline.concurrency_ceiling:
            return self.baseline.concurrency_ceiling
        limit = self.baseline.envelope.get("max_concurrency")
        return int(limit) if isinstance(limit, int | float) and limit > 0 else None


def _streak(state: WatchState, key: str, bad: bool) -> int:
    state.streak[key] = state.streak.get(key, 0) + 1 if bad else 0
    return state.streak[key]


def evaluate(state: WatchState, s: Sample) -> list[Trigger]:
    """Triggers this sample fires given what came before (updates ``state``)."""
    out: list[Trigger] = []
    snap = s.model_dump(exclude_none=True)

    def fire(tid: str, message: str) -> None:
        out.append(Trigger(id=tid, message=message, t_s=s.t_s, at=s.at, sample=snap))

    down = s.health != 200 or s.metrics_error is not None
    n = _streak(state, "down", down)
    if down and n >= state.repeat:
        why = s.health_error or (f"/health answered {s.health}" if s.health not in (None, 200) else None) \
            or s.metrics_error or "no answer"
        fire("process_restart_or_oom", f"the server is down for {n} intervals in a row ({why}): restart or OOM "
                                       "under the approved profile")
    if not down:
        if s.process_start is not None:
            if state.first_start is None:
                state.first_start = s.process_start
            elif s.process_start > state.first_start + 0.5:
                moved = s.process_start - state.first_start
                fire("process_restart_or_oom", "the server process restarted during the watch window "
                                               f"(process start time moved by {moved:.0f}s)")
                state.first_start = s.process_start
        prev = state.last if state.last is not None and state.last.metrics_error is None else None
        if prev is not None and prev.prompt_tokens is not None and s.prompt_tokens is not None \
                and s.prompt_tokens < prev.prompt_tokens:
            fire("process_restart_or_oom", "vllm:prompt_tokens went backwards: the engine restarted")
        limit = state.queue_limit
        queue = (s.running or 0) + (s.waiting or 0) if s.running is not None or s.waiting is not None else None
        over = limit is not None and queue is not None and queue > limit
        n = _streak(state, "queue", over)
        if over and n >= state.repeat:
            fire("queue_beyond_envelope", f"{queue:g} requests running or waiting, the accepted envelope is {limit} "
                                          f"({n} intervals in a row)")
        if state.baseline.prefix_caching and s.caching_enabled is False:
            fire("cache_hit_regression", "prefix caching is off on the server (cache_config_info "
                                         "enable_prefix_caching=False); the accepted configuration has it on")
        ratio = None
        if prev is not None and None not in (s.hits, s.queries, prev.hits, prev.queries):
            dq = s.queries - prev.queries  # type: ignore[operator]
            dh = s.hits - prev.hits  # type: ignore[operator]
            if dq > 0 and dh >= 0:
                ratio = dh / dq
        want = state.baseline.prefix_cache_hit_ratio
        if ratio is not None:
            # Without traffic in the interval there is no ratio: the streak neither grows nor resets.
            low = want is not None and ratio < want * (1 - state.cache_tolerance)
            n = _streak(state, "cache", low)
            if low and n >= state.repeat and want is not None:
                fire("cache_hit_regression", f"prefix-cache hit ratio {ratio:.2f} over the interval, the accepted "
                                             f"ratio is {want:.2f} ({n} intervals in a row)")
    if s.agent is not None:
        failed = {c: d for c, d in s.agent.items() if d != "pass"}
        n = _streak(state, "agent", bool(failed))
        if failed and n >= state.repeat:
            detail = "; ".join(f"{c}: {d}" for c, d in sorted(failed.items()))
            fire("schema_invalid_tool_calls", f"sampled critical tool-call cases failed {n} times in a row ({detail})")
    state.last = s
    return out


# -- the baseline -----------------------------------------------------------------------------------


def load_baseline(path: Path, allowed_signers: Path | None) -> tuple[Baseline, dict[str, Any]]:
    """The accepted baseline, only from a decision whose evidence package is intact and signed by a
    principal of ``allowed_signers`` (docs/decision.md "Watch").

    ``path`` is the package, or the decision's run directory with its package beside it
    (``<run>.tar.gz``, as decide writes it): the directory must match its manifest, and that manifest
    must be the one the signed package holds. A manifest proves only that files were not changed
    after it was written; whoever rewrites baseline.json can regenerate it, not the signature."""
    run_dir: Path | None = None
    if path.is_dir():
        run_dir, package = path, _decision_dir_package(path)
    elif path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        package = path
    else:
        raise UsageError(f"--baseline {path}: give the signed .tar.gz evidence package of an approved decision "
                         "(or the decision's run directory with its package beside it)")
    if allowed_signers is None:
        raise UsageError("--allowed-signers FILE is required: watch trusts a baseline only from an evidence "
                         "package signed by one of its principals")
    check = _trusted_package(package, allowed_signers, path)
    if run_dir is not None:
        _same_decision(run_dir, package, check)
    try:
        decision = _loads(read_package_file(package, "decision/decision.json"), package.name)
        try:
            raw = _loads(read_package_file(package, "decision/baseline.json"), package.name)
        except UsageError:
            raw = None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise IncompleteError(f"{package}: {exc}") from exc
    if not isinstance(decision, dict) or decision.get("approved") is not True or raw is None:
        outcome = decision.get("outcome") if isinstance(decision, dict) else None
        raise UsageError(f"--baseline {path}: the decision ({outcome}) was not approved: there is no accepted "
                         "baseline to watch against")
    try:
        return Baseline.model_validate(raw), decision
    except ValidationError as exc:
        raise UsageError(f"--baseline {path}: baseline.json does not validate ({exc.error_count()} problem(s))") \
            from exc


def _decision_dir_package(path: Path) -> Path:
    """The evidence package of a decision run directory that matches its manifest."""
    from k3fleet.evidence import COMMAND, verify_run

    if not (path / COMMAND).is_file():
        raise UsageError(f"--baseline {path} is not a k3fleet run directory")
    command = _json(path / COMMAND, path.name)
    kind = command.get("kind") if isinstance(command, dict) else None
    if kind != "decision":
        if not isinstance(kind, str) or not kind:
            raise UsageError(f"--baseline {path}: its {COMMAND} names no run kind: not a k3fleet decision")
        article = "an" if kind[:1] in "aeiou" else "a"
        raise UsageError(f"--baseline {path} is {article} {kind} run, not a decision: give the signed evidence "
                         "package (.tar.gz) that k3fleet decide wrote for an approved decision")
    report = verify_run(path)
    if not report.ok:
        raise IncompleteError(report.summary())
    package = path.with_name(path.name + ".tar.gz")
    if not package.is_file():
        raise UsageError(f"--baseline {path}: no evidence package {package.name} beside it: give the signed "
                         "package itself (decide --archive names where it went); a run directory alone does not "
                         "prove who approved it")
    return package


def _trusted_package(package: Path, allowed_signers: Path, label: Path) -> PackageCheck:
    check = verify_package(package, allowed_signers)
    if check.signature == FAILED:
        raise UsageError(f"--baseline {label}: the evidence package's signature fails: {check.signature_problem}")
    if not check.ok:
        raise IncompleteError(f"--baseline {label}: the evidence package is not intact: "
                              f"{'; '.join(check.problems[:3])}")
    if check.signature != VERIFIED:
        raise UsageError(f"--baseline {label}: the evidence package {package.name} is unsigned: nothing proves who "
                         "approved it (sign it with k3fleet decide --sign-key KEY)")
    return check


def _same_decision(run_dir: Path, package: Path, check: PackageCheck) -> None:
    """The run directory is the one the package signs: its manifest (which covers every file in it,
    verify_run checked) is byte for byte the package's ``decision/manifest.json``."""
    from k3fleet.evidence import MANIFEST, sha256_file

    files = (check.manifest or {}).get("files") or []
    signed = next((f.get("sha256") for f in files if isinstance(f, dict) and f.get("path") == f"decision/{MANIFEST}"),
                  None)
    if signed is None or signed != sha256_file(run_dir / MANIFEST):
        raise UsageError(f"--baseline {run_dir} is not the decision its signed package {package.name} holds: its "
                         f"{MANIFEST} differs (changed after signing, or another decision's package)")


def _json(p: Path, label: str) -> Any:
    try:
        return json.loads(read_bounded(p, "run_json").decode("utf-8"))
    except FileNotFoundError as exc:
        raise IncompleteError(f"{label}: {p.name} is missing") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(f"{label}: {p.name} is not valid JSON ({exc})") from exc


def _loads(data: bytes, label: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{label}: not valid JSON ({exc})") from exc


def rollback_artifact(b: Baseline) -> dict[str, Any]:
    """What the serving side goes back to when a trigger fires."""
    image = f"{b.image}@{b.image_digest}" if b.image and b.image_digest and "@" not in b.image else b.image
    return {"image": image, "image_digest": b.image_digest, "launch_command": b.launch_command,
            "runtime_env": b.runtime_env, "parallel": b.parallel, "parsers": b.parsers,
            "max_model_len": b.max_model_len, "prefix_caching": b.prefix_caching,
            "rollback_image": b.rollback_image}


# -- the loop ---------------------------------------------------------------------------------------------


@dataclass
class WatchOptions:
    base_url: str
    baseline: Path
    duration_s: float = 900.0
    interval_s: float = 15.0
    repeat: int = 2
    cache_tolerance: float = 0.5
    agent_every: int = 1
    agent_cases: Sequence[str] = DEFAULT_AGENT_CASES
    api_key_env: str | None = None
    verify_tls: bool = True
    model: str | None = None
    allowed_signers: Path | None = None


@dataclass
class WatchResult:
    baseline: Baseline
    samples: list[Sample]
    triggers: list[Trigger]
    stopped_early: bool = False

    @property
    def exit_code(self) -> int:
        return 1 if self.triggers else 0


async def _health(client: Any, base: str, timeout: float) -> tuple[int | None, str | None]:
    import httpx

    from k3fleet.accept.client import EndpointError, fetch

    try:
        # Bounded like every probe request: one deadline for the whole answer, a cap on its body.
        resp = await fetch(client, "GET", f"{base}/health", shown="/health", kind="completion", deadline_s=timeout,
                           timeout=timeout)
        return resp.status, None
    except EndpointError as exc:
        return None, exc.message
    except httpx.HTTPError as exc:
        return None, f"/health: {' '.join(str(exc).split()) or type(exc).__name__}"


async def _agent_sample(endpoint: Any, cases: Sequence[str], client: Any) -> dict[str, str]:
    from k3fleet.accept.agent import AgentOptions, run_agent

    result = await run_agent(endpoint, AgentOptions(repeats=1, concurrency=1, cases=list(cases),
                                                    critical=list(cases)), client=client)
    out: dict[str, str] = {}
    for name, case in (result.data.get("cases") or {}).items():
        ok = case.get("passed", 0) >= case.get("runs", 1)
        out[name] = "pass" if ok else ", ".join(sorted(case.get("defects") or {})) or "failed"
    return out


async def _watch(opts: WatchOptions, baseline: Baseline, on_sample: Callable[[Sample, list[Trigger]], None]
                 ) -> WatchResult:
    from k3fleet.accept.client import Endpoint
    from k3fleet.accept.metrics import MetricsError, scrape

    model = opts.model or baseline.model
    if not model:
        raise UsageError("the baseline names no model: give --model")
    try:
        endpoint = Endpoint(base_url=opts.base_url, model=model, api_key_env=opts.api_key_env,
                            verify_tls=opts.verify_tls, timeout_s=min(max(opts.interval_s * 4, 30.0), 3600.0))
    except ValidationError as exc:
        raise UsageError(f"--base-url: {exc.errors()[0]['msg']}") from exc
    state = WatchState(baseline=baseline, repeat=opts.repeat, cache_tolerance=opts.cache_tolerance)
    result = WatchResult(baseline=baseline, samples=[], triggers=[])
    t0 = time.monotonic()
    timeout = max(min(opts.interval_s, 10.0), 1.0)
    async with endpoint.async_client(2) as client:
        n = 0
        while True:
            started = time.monotonic()
            s = Sample(t_s=round(started - t0, 3), at=time.time())
            s.health, s.health_error = await _health(client, endpoint.base_url, timeout)
            try:
                snap = await scrape(client, endpoint.base_url, timeout_s=timeout)
            except MetricsError as exc:
                s.metrics_error = str(exc)
            else:
                summ = snap.summary(None)
                s.running, s.waiting, s.kv_usage = summ["running"], summ["waiting"], summ["kv_usage"]
                s.queries, s.hits = summ["prefix_cache_queries"], summ["prefix_cache_hits"]
                s.prompt_tokens = summ["prompt_tokens"]
                s.caching_enabled = snap.prefix_caching_enabled()
                s.process_start = snap.process_start_time()
            if n == 0 and s.health is None and s.metrics_error is not None:
                raise IncompleteError(f"cannot watch {endpoint.display_url}: {s.health_error}")
            if opts.agent_every and n % opts.agent_every == 0 and s.health == 200:
                try:
                    s.agent = await _agent_sample(endpoint, opts.agent_cases, client)
                except Exception as exc:  # a failing probe is a sample, not a crash
                    s.agent = {c: f"probe error: {excerpt(exc, 160, tail='')}" for c in opts.agent_cases}
            fired = evaluate(state, s)
            result.samples.append(s)
            on_sample(s, fired)
            if fired:
                result.triggers = fired
                result.stopped_early = True
                return result
            n += 1
            if time.monotonic() - t0 + opts.interval_s > opts.duration_s:
                return result
            await asyncio.sleep(max(0.0, opts.interval_s - (time.monotonic() - started)))


def run_watch(opts: WatchOptions, on_sample: Callable[[Sample, list[Trigger]], None] | None = None
              ) -> WatchResult:
    for flag, value, span in (("--interval", opts.interval_s, "watch --interval"),
                              ("--for", opts.duration_s, "watch --for")):
        problem = check_seconds(value, span)
        if problem is not None:
            raise UsageError(f"{flag} {value!r} {problem}")
    if opts.repeat < 1:
        raise UsageError("--repeat must be 1 or more")
    unknown = [c for c in opts.agent_cases if c not in _agent_case_names()]
    if unknown:
        raise UsageError(f"--agent-case {unknown[0]!r}: not an agent contract case ({', '.join(_agent_case_names())})")
    baseline, _ = load_baseline(opts.baseline, opts.allowed_signers)
    return asyncio.run(_watch(opts, baseline, on_sample or (lambda _s, _t: None)))


def _agent_case_names() -> tuple[str, ...]:
    from k3fleet.accept.agent import CASES

    return tuple(CASES)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds: finite, at least 1 s, at most 7 days
    (k3fleet.bounds ``DURATIONS``); inf, nan and 1e400 are refused, not watched forever."""
    return parse_seconds(text, "--for", "watch --for")
