"""``k3fleet watch``: the first production watch window after a go-live decision.

Every interval: ``/health``, ``/metrics`` (the acceptance metrics reader), every ``agent_every``
intervals one sampled agent contract case per critical workflow (bracketed by a second scrape), and
every ``--node-log`` file the operator points it at. The samples are judged against the accepted
baseline (the decision's ``baseline.json``) by :func:`evaluate`, a pure function of the watch state
and one sample (docs/decision.md "Watch").

A watch that never cries wolf:

- its baseline is the accepted *load* envelope: the hit ratio, latency, queue and rate of the real
  sessions the load probe ran (``Baseline.load_traffic``), never the synthetic ratio of the cache
  probe;
- its own probe traffic is not judged: the probe is bracketed by two scrapes and what the counters
  rose across it is taken out of the interval (the requests it sent are counted too, and taken out
  when the second scrape fails);
- a ratio or rate trigger needs real traffic: the interval deltas are pooled until the pool holds
  ``min_requests`` real requests, and only a full pool is judged.

Rollback triggers:

- ``process_restart_or_oom``: ``/health`` or ``/metrics`` failing ``repeat`` intervals in a row (an
  OOM takes the engine down), or the process start time moved / counters went backwards (a restart);
- ``queue_beyond_envelope``: running + waiting above the accepted concurrency (the ceiling the
  decision named, else the tested envelope) for ``repeat`` intervals in a row;
- ``queue_growth``: requests waiting grew ``repeat`` intervals in a row past the accepted load's
  queue while real requests arrived at a flat rate (the server slows, not the traffic grows);
- ``cache_hit_regression``: prefix caching switched off (``cache_config_info``), or a pool's real
  hit ratio under the accepted load's x (1 - tolerance) while the mean prefill time rose above the
  lowest seen (the accepted load's TTFT p50 or an earlier pool) x (1 + latency tolerance), ``repeat``
  pools in a row;
- ``schema_invalid_tool_calls``: a sampled critical tool-call or structured-output case fails
  ``repeat`` times in a row;
- ``corrupted_requests``: ``vllm:corrupted_requests`` rose (NaN or inf in the logits), at once;
- ``admission_rejections``: ``vllm:admission_rejections`` rose ``repeat`` intervals in a row (clients
  get 503s because a queue cap is reached), with the reasons;
- ``node_errors``: an Xid of error or critical severity (the audit's ``gpu.xid`` verdict over the
  kernel log's NVRM lines) or an NCCL error on a ``--node-log`` line not older than the approval.

When one fires the watch stops and prints the trigger and the rollback artifact: the baseline's
image, digest and launch configuration.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import itertools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field, ValidationError

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import parse_xid_lines
from k3fleet.accept.agent import CASES, AgentOptions, run_agent
from k3fleet.accept.client import Endpoint, EndpointError, fetch
from k3fleet.accept.gpu_telemetry import gpus_of
from k3fleet.accept.metrics import MetricsError, scrape, scrape_url
from k3fleet.accept.startup import NCCL_ERROR
from k3fleet.bounds import check_seconds, parse_json, parse_seconds, read_input
from k3fleet.contracts import result_code
from k3fleet.decide.package import FAILED, VERIFIED, PackageCheck, aware_time, check_fresh, verify_package
from k3fleet.errors import IncompleteError, UsageError, validation_line
from k3fleet.evidence import RunDir, layout, sha256_file, verify_run
from k3fleet.evidence.reader import RunReader
from k3fleet.evidence.redact import excerpt
from k3fleet.models.evidence import Baseline
from k3fleet.models.facts import HostFacts
from k3fleet.models.target import Target
from k3fleet.triage import Capture, build_facts
from k3fleet.verdict import evaluate_host

TRIGGERS = ("process_restart_or_oom", "queue_beyond_envelope", "queue_growth", "cache_hit_regression",
            "schema_invalid_tool_calls", "corrupted_requests", "admission_rejections", "node_errors")
DEFAULT_AGENT_CASES = ("one_required_arg", "streaming_deltas", "structured_output")
# Counters read from /metrics whose rise over an interval is the interval's traffic.
COUNTERS = ("requests", "queries", "hits", "prompt_tokens", "cached_tokens", "preemptions", "http_errors",
            "e2e_sum", "e2e_count", "itl_sum", "itl_count", "ttft_sum", "ttft_count", "prefill_sum", "prefill_count")
# Token counters the probe's own requests move: without the scrape after the probe they are unknown.
_TOKEN_COUNTERS = frozenset(COUNTERS) - {"requests", "http_errors"}


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
    caching_enabled: bool | None = None
    process_start: float | None = None
    counters: dict[str, float] = Field(default_factory=dict, description="cumulative server counters (COUNTERS)")
    error_codes: dict[str, float] = Field(default_factory=dict, description="HTTP answers by status, 4xx/5xx only")
    agent: dict[str, str] | None = Field(default=None, description="sampled case -> pass or its defects")
    probe_requests: int = Field(default=0, description="requests the watch's own probe sent this interval")
    after_probe: dict[str, float] | None = Field(default=None, description="the counters scraped right after the "
                                                                           "probe")
    after_probe_at: float | None = None
    node_errors: list[str] | None = Field(default=None, description="errors on the --node-log files since the "
                                                                    "approval")
    node_notes: list[str] | None = Field(default=None, description="what the node logs hold that fires nothing")
    window: dict[str, float | None] | None = Field(default=None, description="the interval's real traffic "
                                                                             "(evaluate fills it)")
    gpus: dict[str, dict[str, float]] | None = Field(default=None, description="per GPU: memory used and free "
                                                     "(MiB), power (W), utilisation (%) from --telemetry-url")
    telemetry_error: str | None = None


@dataclass
class WatchState:
    baseline: Baseline
    repeat: int = 2
    cache_tolerance: float = 0.5
    latency_tolerance: float = 0.5
    min_requests: int = 20
    streak: dict[str, int] = field(default_factory=dict)
    last: Sample | None = None
    first_start: float | None = None
    # Real traffic not judged yet; the lowest healthy prefill mean; (waiting, arrivals/s) of the last intervals.
    pool: dict[str, float] = field(default_factory=dict)
    prefill_low: float | None = None
    growth: list[tuple[float, float]] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)

    @property
    def queue_limit(self) -> int | None:
        if self.baseline.concurrency_ceiling:
            return self.baseline.concurrency_ceiling
        limit = self.baseline.envelope.get("max_concurrency")
        return int(limit) if isinstance(limit, int | float) and limit > 0 else None


def _streak(state: WatchState, key: str, bad: bool) -> int:
    state.streak[key] = state.streak.get(key, 0) + 1 if bad else 0
    return state.streak[key]


def real_traffic(prev: Sample, s: Sample) -> dict[str, float | None] | None:
    """What real clients sent between two samples: the counters' rise from the scrape after ``prev``'s
    probe (else ``prev`` itself) to ``s``, so the watch's own probe is never in it. ``None`` when
    either side lacks counters or one went backwards (a restart: the interval's traffic is unknown)."""
    if not s.counters or not prev.counters:
        return None
    base, since = (prev.after_probe, prev.after_probe_at) if prev.after_probe is not None else (prev.counters, prev.at)
    out: dict[str, float | None] = {}
    for key in COUNTERS:
        a, b = base.get(key), s.counters.get(key)
        if a is None or b is None:
            out[key] = None
            continue
        if b < a:
            return None
        out[key] = b - a
    if prev.after_probe is None and prev.probe_requests:
        # The probe ran but its closing scrape failed: its requests are known, its tokens are not.
        if out.get("requests") is not None:
            out["requests"] = max(0.0, (out["requests"] or 0.0) - prev.probe_requests)
        for key in _TOKEN_COUNTERS:
            out[key] = None
    out["seconds"] = max(s.at - (since or prev.at), 1e-3)
    requests = out.get("requests")
    if requests is None and out.get("e2e_count") is not None:
        out["requests"] = requests = out["e2e_count"]
    queue_now = (s.running or 0) + (s.waiting or 0)
    queue_then = (prev.running or 0) + (prev.waiting or 0)
    out["arrivals"] = None if requests is None else max(0.0, requests + queue_now - queue_then)
    return out


def judge_pool(pool: Mapping[str, float], want_ratio: float | None, prefill_low: float | None,
               cache_tolerance: float, latency_tolerance: float) -> tuple[bool, float | None, float | None, str]:
    """One pool of real traffic against the accepted load: (regressed, hit ratio, prefill mean, why).
    Regressed only when the hit ratio is under the accepted one and prefill got slower: a lower ratio
    from a different prompt mix that costs nothing is not a regression."""
    queries, hits = pool.get("queries"), pool.get("hits")
    ratio = hits / queries if queries and hits is not None and queries > 0 else None
    prefill = None
    for name in ("prefill", "ttft"):
        total, count = pool.get(f"{name}_sum"), pool.get(f"{name}_count")
        if total is not None and count:
            prefill = total / count
            break
    if ratio is None or want_ratio is None:
        return False, ratio, prefill, "no hit ratio to compare"
    low = ratio < want_ratio * (1 - cache_tolerance)
    rising = prefill is not None and prefill_low is not None and prefill > prefill_low * (1 + latency_tolerance)
    why = (f"hit ratio {ratio:.2f} over {pool.get('requests', 0):g} real requests, the accepted load's is "
           f"{want_ratio:.2f}")
    if prefill is not None and prefill_low is not None:
        why += f"; mean prefill {prefill * 1000:.0f} ms, lowest accepted {prefill_low * 1000:.0f} ms"
    return low and rising, ratio, prefill, why


def queue_grows(history: Sequence[tuple[float, float]], repeat: int, accepted_waiting: float,
                flat_tolerance: float = 0.5) -> bool:
    """``history``: (requests waiting, real arrivals per second) of the last intervals. True when the
    queue grew ``repeat`` intervals in a row past the accepted load's queue while the arrival rate
    stayed flat: never zero, its highest at most ``1 + flat_tolerance`` times its lowest."""
    if len(history) < repeat + 1:
        return False
    last = history[-(repeat + 1):]
    waits = [w for w, _ in last]
    if not all(b > a for a, b in itertools.pairwise(waits)) or waits[-1] <= max(accepted_waiting, 1.0):
        return False
    rates = [r for _, r in last[1:]]
    return min(rates) > 0 and max(rates) <= min(rates) * (1 + flat_tolerance)


def evaluate(state: WatchState, s: Sample) -> list[Trigger]:
    """Triggers this sample fires given what came before (updates ``state``, fills ``s.window``)."""
    out: list[Trigger] = []
    snap = s.model_dump(exclude_none=True)

    def fire(tid: str, message: str) -> None:
        out.append(Trigger(id=tid, message=message, t_s=s.t_s, at=s.at, sample=snap))

    traffic = state.baseline.load_traffic
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
        if prev is not None and prev.counters.get("prompt_tokens") is not None \
                and s.counters.get("prompt_tokens") is not None \
                and s.counters["prompt_tokens"] < prev.counters["prompt_tokens"]:
            fire("process_restart_or_oom", "vllm:prompt_tokens went backwards: the engine restarted")
        _explained(state, prev, s, fire)
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
        window = real_traffic(prev, s) if prev is not None else None
        s.window = window
        if window is None:
            state.growth.clear()
            state.arrived.clear()
        else:
            if not state.growth and prev is not None and prev.waiting is not None:
                state.growth.append((prev.waiting, 0.0))  # where the queue stood: only its rates are judged
            _judge_rates(state, s, window, traffic, fire)
    if s.agent is not None:
        failed = {c: d for c, d in s.agent.items() if d != "pass"}
        n = _streak(state, "agent", bool(failed))
        if failed and n >= state.repeat:
            detail = "; ".join(f"{c}: {d}" for c, d in sorted(failed.items()))
            fire("schema_invalid_tool_calls", f"sampled critical tool-call cases failed {n} times in a row ({detail})")
    if s.node_errors:
        fire("node_errors", "node errors since the approval: " + "; ".join(s.node_errors[:4]))
    state.last = s
    return out


def _explained(state: WatchState, prev: Sample | None, s: Sample, fire: Callable[[str, str], None]) -> None:
    """The failure-explaining counters between two samples: corrupted requests fire at once, admission
    rejections after ``repeat`` intervals in a row."""
    def rise(key: str) -> float | None:
        if prev is None or key not in prev.counters or key not in s.counters:
            return None
        return max(0.0, s.counters[key] - prev.counters[key])

    corrupted = rise("corrupted")
    if corrupted:
        fire("corrupted_requests", f"the server counted {corrupted:.0f} corrupted request(s) since the last sample "
                                   "(vllm:corrupted_requests: NaN or inf in the logits): its answers cannot be trusted")
    rejected = rise("rejected")
    n = _streak(state, "rejected", bool(rejected))
    if rejected and n >= state.repeat:
        fire("admission_rejections", f"{rejected:.0f} request(s) refused at admission in the last interval "
                                     f"({n} intervals in a row, vllm:admission_rejections): clients get 503s because "
                                     "a queue cap is reached")


def _judge_rates(state: WatchState, s: Sample, window: Mapping[str, float | None], traffic: Mapping[str, float],
                 fire: Callable[[str, str], None]) -> None:
    """The ratio and rate triggers: only over real traffic, only once there is enough of it."""
    arrivals, seconds = window.get("arrivals"), window.get("seconds") or 0.0
    if arrivals is not None and s.waiting is not None and seconds > 0:
        state.growth.append((s.waiting, arrivals / seconds))
        state.arrived.append(arrivals)
        del state.growth[:-(state.repeat + 1)]
        del state.arrived[:-state.repeat]
        if sum(state.arrived) >= state.min_requests and queue_grows(state.growth, state.repeat,
                                                                     traffic.get("waiting_max", 0.0)):
            rate = state.growth[-1][1]
            fire("queue_growth", f"{s.waiting:g} requests waiting, growing {state.repeat} intervals in a row at a "
                                 f"flat {rate:.1f} requests/s (the accepted load left at most "
                                 f"{traffic.get('waiting_max', 0.0):g} waiting): the server is slowing down")
    else:
        state.growth.clear()
        state.arrived.clear()
    for key, value in window.items():
        if value is not None:
            state.pool[key] = state.pool.get(key, 0.0) + value
    if state.pool.get("requests", 0.0) < state.min_requests:
        return
    pool, state.pool = state.pool, {}
    if state.prefill_low is None and traffic.get("ttft_p50_s"):
        state.prefill_low = traffic["ttft_p50_s"]
    bad, ratio, prefill, why = judge_pool(pool, traffic.get("hit_ratio"), state.prefill_low, state.cache_tolerance,
                                          state.latency_tolerance)
    if s.window is not None:
        s.window = {**s.window, "pool_requests": pool.get("requests"), "pool_hit_ratio": ratio,
                    "pool_prefill_s": prefill}
    n = _streak(state, "cache", bad)
    if not bad and prefill is not None:
        state.prefill_low = prefill if state.prefill_low is None else min(state.prefill_low, prefill)
    if bad and n >= state.repeat:
        fire("cache_hit_regression", f"{why} ({n} pools of real traffic in a row): prefix-cache reuse dropped and "
                                     "prefill got slower")


# -- node logs --------------------------------------------------------------------------------------

# Absolute times a log line can start with: journalctl -o short-iso / RFC 3339, dmesg -T, syslog.
_ISO = re.compile(r"^\s*(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)")
_CTIME = re.compile(r"^\s*\[\s*([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\s*\]")
_SYSLOG = re.compile(r"^\s*([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s")


def line_time(line: str, year: int) -> _dt.datetime | None:
    """The absolute time a log line starts with (UTC when it names no zone); ``None`` for dmesg's
    seconds since boot or no time at all."""
    try:
        if m := _ISO.match(line):
            text = m.group(1).replace("Z", "+00:00")
            if re.search(r"[+-]\d{4}$", text):
                text = text[:-2] + ":" + text[-2:]
            when = _dt.datetime.fromisoformat(text)
        elif m := _CTIME.match(line):
            when = _dt.datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
        elif m := _SYSLOG.match(line):
            when = _dt.datetime.strptime(f"{year} {' '.join(m.group(1).split())}", "%Y %b %d %H:%M:%S")
        else:
            return None
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=_dt.UTC)


def lines_since(text: str, since: _dt.datetime | None) -> str:
    """The lines not older than ``since``. A line with no absolute time is kept: the audit that the
    approval stands on found no Xid since boot, so one in the log now came after it."""
    if since is None:
        return text
    return "\n".join(line for line in text.splitlines()
                     if (when := line_time(line, since.year)) is None or when >= since)


def judge_node_log(text: str, since: _dt.datetime | None, target: Target,
                   host: str = "node") -> tuple[list[str], list[str]]:
    """(errors, notes) on a node's kernel log or journal since the approval: its Xid lines judged by the
    audit's ``gpu.xid`` verdict against ``target`` (the one the approved decision was taken on; error and
    critical fire; a warning is a note) and ``gpu.xid_application`` (the application's own fault: a note),
    and NCCL errors by the start-up analyser's pattern."""
    kept = lines_since(text, since)
    errors: list[str] = []
    notes: list[str] = []
    if parse_xid_lines(kept):
        facts = build_facts(host, [Capture(path=Path(host), name=host, kind="kernel_log", text=kept, sha256="")])
        for f in evaluate_host(HostFacts.model_validate(facts), target):
            if f.check_id == "gpu.xid" and f.kind == "fail":
                (errors if f.severity in ("error", "critical") else notes).append(f"{host}: {f.message}")
            elif f.check_id == "gpu.xid_application" and f.kind == "fail":
                notes.append(f"{host}: {f.message}")
    nccl = [line for line in kept.splitlines() if NCCL_ERROR.search(line)]
    if nccl:
        more = f" (and {len(nccl) - 1} more)" if len(nccl) > 1 else ""
        errors.append(f"{host}: NCCL error: {excerpt(nccl[-1].strip(), 200, tail='')}{more}")
    return errors, notes


def approval_time(decision: Mapping[str, Any]) -> _dt.datetime | None:
    return aware_time(decision.get("reviewed_at"))


# -- the baseline -----------------------------------------------------------------------------------


def load_baseline(path: Path, allowed_signers: Path | None, *, trees: Sequence[Path] = (),
                  max_age_s: float | None = None) -> tuple[Baseline, dict[str, Any], Target | None]:
    """The accepted baseline, only from a decision whose evidence package is intact and signed by the
    reviewer it names, a principal of ``allowed_signers`` (docs/decision.md "Watch"); with the decision and
    the target it was taken on.

    ``path`` is the package, or the decision's run directory with its package beside it
    (``<run>.tar.gz``, as decide writes it): the directory must match its manifest, and that manifest
    must be the one the signed package holds. A manifest proves only that files were not changed
    after it was written; whoever rewrites baseline.json can regenerate it, not the signature.

    The package is read once: its members are verified and then used from that same copy in memory, so
    a package swapped on disk after the check is never the one used. An approval that a later decision
    in the package's runs tree (or ``trees``) replaced, or older than ``max_age_s``, is refused."""
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
    stale = check_fresh(check, [package.parent, *trees], max_age_s)
    if stale is not None:
        raise UsageError(f"--baseline {path}: {stale}")
    decision = _member_json(check, layout.package_member(layout.DECISION))
    raw = _member_json(check, layout.package_member(layout.BASELINE))
    if not isinstance(decision, dict) or decision.get("approved") is not True or raw is None:
        outcome = decision.get("outcome") if isinstance(decision, dict) else None
        raise UsageError(f"--baseline {path}: the decision ({outcome}) was not approved: there is no accepted "
                         "baseline to watch against")
    try:
        baseline = Baseline.model_validate(raw)
    except ValidationError as exc:
        raise UsageError(validation_line(exc, f"--baseline {path}: baseline.json does not validate")) from exc
    return baseline, decision, package_target(check)


def _member_json(check: PackageCheck, rel: str) -> Any:
    """A verified member parsed from the copy verify_package kept; None when the package has none."""
    data = check.members.get(rel)
    return None if data is None else parse_json(data, f"{check.archive.name}: {rel}")


def package_target(check: PackageCheck) -> Target | None:
    """The target the signed package's decision was taken on: the audit run's ``inputs/target.json`` that
    the decision's summary names (None when the decision rests on no recorded target)."""
    try:
        summary = _member_json(check, layout.package_member(layout.SUMMARY))
        ref = ((summary.get("target") or {}).get("ref") or {}) if isinstance(summary, dict) else {}
        if not (isinstance(ref, dict) and ref.get("run") and ref.get("file")):
            return None
        raw = _member_json(check, f"{layout.PACKAGE_RUNS}/{ref['run']}/{ref['file']}")
    except (UsageError, KeyError):
        return None
    if raw is None:
        return None
    try:
        return Target.model_validate(raw)
    except ValidationError as exc:
        raise UsageError(validation_line(exc, f"--baseline {check.archive.name}: the decision's target")) from exc


def _decision_dir_package(path: Path) -> Path:
    """The evidence package of a decision run directory that matches its manifest."""
    if not (path / layout.COMMAND).is_file():
        raise UsageError(f"--baseline {path} is not a k3fleet run directory")
    kind = RunReader(path).kind
    if kind != "decision":
        if not kind:
            raise UsageError(f"--baseline {path}: its {layout.COMMAND} names no run kind: not a k3fleet decision")
        article = "an" if kind[:1] in "aeiou" else "a"
        raise UsageError(f"--baseline {path} is {article} {kind} run, not a decision: give the signed evidence "
                         "package (.tar.gz) that k3fleet decide wrote for an approved decision")
    report = verify_run(path)
    if not report.ok:
        raise IncompleteError(report.summary())
    package = layout.package_beside(path)
    if not package.is_file():
        raise UsageError(f"--baseline {path}: no evidence package {package.name} beside it: give the signed "
                         "package itself (decide --archive names where it went); a run directory alone does not "
                         "prove who approved it")
    return package


def _trusted_package(package: Path, allowed_signers: Path, label: Path) -> PackageCheck:
    check = verify_package(package, allowed_signers, keep=True)
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
    files = (check.manifest or {}).get("files") or []
    member = layout.package_member(layout.MANIFEST)
    signed = next((f.get("sha256") for f in files if isinstance(f, dict) and f.get("path") == member), None)
    if signed is None or signed != sha256_file(run_dir / layout.MANIFEST):
        raise UsageError(f"--baseline {run_dir} is not the decision its signed package {package.name} holds: its "
                         f"{layout.MANIFEST} differs (changed after signing, or another decision's package)")


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
    latency_tolerance: float = 0.5
    min_requests: int = 20
    max_samples: int | None = None
    agent_every: int = 1
    agent_cases: Sequence[str] = DEFAULT_AGENT_CASES
    api_key_env: str | None = None
    verify_tls: bool = True
    model: str | None = None
    allowed_signers: Path | None = None
    node_logs: Sequence[Path] = ()
    # The CLI's target (--target, or the packaged default): used only when the approved decision's
    # package records none (a decision taken on the packaged default).
    target: Target | None = None
    telemetry_url: str | None = None
    max_age_s: float | None = None  # refuse an approval older than this (--max-age)


@dataclass
class WatchResult:
    baseline: Baseline
    samples: list[Sample]
    triggers: list[Trigger]
    stopped_early: bool = False

    @property
    def exit_code(self) -> int:
        return result_code(failed=bool(self.triggers))


async def _health(client: Any, base: str, timeout: float) -> tuple[int | None, str | None]:
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
    result = await run_agent(endpoint, AgentOptions(repeats=1, concurrency=1, cases=list(cases),
                                                    critical=list(cases)), client=client)
    out: dict[str, str] = {}
    for name, case in (result.data.get("cases") or {}).items():
        ok = case.get("passed", 0) >= case.get("runs", 1)
        out[name] = "pass" if ok else ", ".join(sorted(case.get("defects") or {})) or "failed"
    return out


def counters_of(snap: Any) -> tuple[dict[str, float], dict[str, float]]:
    """(COUNTERS, HTTP 4xx/5xx answers by status) of one /metrics page; a counter the server does not
    publish is left out. Requests are vLLM's successful requests (every finish reason); the error codes
    are the API server's ``http_requests_total`` by ``status``."""
    out: dict[str, float] = {}

    def put(key: str, value: float | None) -> None:
        if value is not None:
            out[key] = value

    put("requests", snap.counter("vllm:request_success"))
    put("queries", snap.counter("vllm:prefix_cache_queries"))
    put("hits", snap.counter("vllm:prefix_cache_hits"))
    put("prompt_tokens", snap.counter("vllm:prompt_tokens"))
    put("cached_tokens", snap.counter("vllm:prompt_tokens_cached"))
    put("preemptions", snap.counter("vllm:num_preemptions"))
    # vLLM 0.30+ (k3fleet.accept.explain): what explains a failure the clients see.
    put("corrupted", snap.counter("vllm:corrupted_requests"))
    put("rejected", snap.counter("vllm:admission_rejections"))
    put("external_hits", snap.counter("vllm:external_prefix_cache_hits"))
    for key, name in (("e2e", "vllm:e2e_request_latency_seconds"), ("itl", "vllm:inter_token_latency_seconds"),
                      ("ttft", "vllm:time_to_first_token_seconds"), ("prefill", "vllm:request_prefill_time_seconds")):
        hist = snap.histogram(name)
        if hist is not None:
            put(f"{key}_sum", hist.sum)
            put(f"{key}_count", hist.count)
    codes: dict[str, float] = {}
    for labels, value in snap.series("http_requests_total"):
        status = str(labels.get("status", ""))
        if status[:1] in ("4", "5"):
            codes[status] = codes.get(status, 0.0) + value
    if snap.series("http_requests_total"):
        out["http_errors"] = sum(codes.values())
    return out, codes


class _NodeLogs:
    """The --node-log files, read again each interval (they grow) through the bounded reader and
    judged only when they changed."""

    def __init__(self, paths: Sequence[Path], since: _dt.datetime | None, target: Target | None) -> None:
        self.paths, self.since, self.target = list(paths), since, target
        self.seen: dict[Path, tuple[float, int, list[str], list[str]]] = {}

    def read(self) -> tuple[list[str], list[str]]:
        errors: list[str] = []
        notes: list[str] = []
        for p in self.paths:
            try:
                st = p.stat()
                key = (st.st_mtime, st.st_size)
                cached = self.seen.get(p)
                if cached is None or cached[:2] != key:
                    text = read_input(p, "--node-log", kind="a node log", limit="capture", text=True)
                    if self.target is None:
                        raise UsageError("--node-log: the decision records no target to judge the log by: give "
                                         "--target FILE")
                    e, n = judge_node_log(text.decode("utf-8", errors="replace"), self.since, self.target, p.name)
                    self.seen[p] = (*key, e, n)
                errors += self.seen[p][2]
                notes += self.seen[p][3]
            except (OSError, UsageError) as exc:
                notes.append(f"{p.name}: {excerpt(exc, 160, tail='')}")
        return errors, notes


def watch_endpoint(opts: WatchOptions, baseline: Baseline) -> Endpoint:
    """The endpoint the watch samples: a model, an http(s) URL and a set API key variable, or one usage line
    (judged before the run directory exists)."""
    model = opts.model or baseline.model
    if not model:
        raise UsageError("the baseline names no model: give --model")
    try:
        endpoint = Endpoint(base_url=opts.base_url, model=model, api_key_env=opts.api_key_env,
                            verify_tls=opts.verify_tls, timeout_s=min(max(opts.interval_s * 4, 30.0), 3600.0))
    except ValidationError as exc:
        raise UsageError(validation_line(exc, "--base-url")) from exc
    endpoint.api_key()  # a named variable that is not set is bad input now, not a failed first sample
    return endpoint


async def _watch(opts: WatchOptions, baseline: Baseline, decision: Mapping[str, Any], endpoint: Endpoint,
                 on_sample: Callable[[Sample, list[Trigger]], None]) -> WatchResult:
    state = WatchState(baseline=baseline, repeat=opts.repeat, cache_tolerance=opts.cache_tolerance,
                       latency_tolerance=opts.latency_tolerance, min_requests=opts.min_requests)
    result = WatchResult(baseline=baseline, samples=[], triggers=[])
    nodes = _NodeLogs(opts.node_logs, approval_time(decision), opts.target)
    t0 = time.monotonic()
    timeout = max(min(opts.interval_s, 10.0), 1.0)
    sent = [0]

    async def count(request: Any) -> None:
        # Every POST is the watch's own probe (health and metrics are GETs): counted, never judged.
        if request.method == "POST":
            sent[0] += 1

    async with endpoint.async_client(2) as client:
        client.event_hooks = {"request": [count], "response": []}
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
                s.counters, s.error_codes = counters_of(snap)
                s.caching_enabled = snap.prefix_caching_enabled()
                s.process_start = snap.process_start_time()
            if n == 0 and s.health is None and s.metrics_error is not None:
                raise IncompleteError(f"cannot watch {endpoint.display_url}: {s.health_error}")
            if opts.agent_every and n % opts.agent_every == 0 and s.health == 200:
                sent[0] = 0
                try:
                    s.agent = await _agent_sample(endpoint, opts.agent_cases, client)
                except Exception as exc:  # a failing probe is a sample, not a crash
                    s.agent = {c: f"probe error: {excerpt(exc, 160, tail='')}" for c in opts.agent_cases}
                s.probe_requests = sent[0]
                if s.metrics_error is None:
                    try:
                        after = await scrape(client, endpoint.base_url, timeout_s=timeout)
                    except MetricsError:
                        pass  # the probe's requests are still counted: real_traffic takes them out
                    else:
                        s.after_probe, s.after_probe_at = counters_of(after)[0], time.time()
            if opts.telemetry_url:
                try:
                    s.gpus = gpus_of(await scrape_url(client, opts.telemetry_url, timeout_s=timeout)) or None
                    if s.gpus is None:
                        s.telemetry_error = "the telemetry page has no DCGM GPU series"
                except MetricsError as exc:
                    s.telemetry_error = str(exc)
            if nodes.paths:
                errors, notes = nodes.read()
                s.node_errors, s.node_notes = errors or None, notes or None
            fired = evaluate(state, s)
            result.samples.append(s)
            on_sample(s, fired)
            if fired:
                result.triggers = fired
                result.stopped_early = True
                return result
            n += 1
            if opts.max_samples is not None and n >= opts.max_samples:
                return result
            if time.monotonic() - t0 + opts.interval_s > opts.duration_s:
                return result
            # At least half an interval after the probe: the span real traffic is judged in (the probe's
            # own span is left out) never shrinks to nothing when the probe takes the whole interval.
            await asyncio.sleep(max(opts.interval_s / 2 if s.after_probe is not None else 0.0,
                                    opts.interval_s - (time.monotonic() - started)))


def check_options(opts: WatchOptions) -> None:
    """Every option a watch cannot start with, refused before anything is written."""
    for flag, value, span in (("--interval", opts.interval_s, "watch --interval"),
                              ("--for", opts.duration_s, "watch --for")):
        problem = check_seconds(value, span)
        if problem is not None:
            raise UsageError(f"{flag} {value!r} {problem}")
    if opts.repeat < 1:
        raise UsageError("--repeat must be 1 or more")
    if opts.min_requests < 1:
        raise UsageError("--min-requests must be 1 or more")
    if opts.max_samples is not None and opts.max_samples < 1:
        raise UsageError("--samples must be 1 or more")
    if opts.telemetry_url is not None and not re.match(r"^https?://\S+$", opts.telemetry_url):
        raise UsageError(f"--telemetry-url {opts.telemetry_url!r}: an http:// or https:// URL")
    for p in opts.node_logs:
        if not p.is_file():
            raise UsageError(f"--node-log {p}: no such file")
    unknown = [c for c in opts.agent_cases if c not in _agent_case_names()]
    if unknown:
        raise UsageError(f"--agent-case {unknown[0]!r}: not an agent contract case ({', '.join(_agent_case_names())})")


@dataclass
class WatchRun:
    """A finished watch and its run directory (kind ``watch``)."""

    result: WatchResult
    run_dir: RunDir
    record: dict[str, Any]  # watch.json: samples, triggers, the rollback artifact, the exit code
    artifact: dict[str, Any]  # what the serving side goes back to (``rollback_artifact``)


def run_watch(opts: WatchOptions, argv: Sequence[str], *, runs_dir: Path, out: Path | None = None,
              on_sample: Callable[[Sample, list[Trigger]], None] | None = None) -> WatchRun:
    """Watch the endpoint into a run directory: ``command.json``, ``samples.jsonl`` one line per sample as
    it is taken, ``watch.json`` and the manifest (also when the watch is stopped or fails). Bad options and
    an untrusted baseline (unsigned, forged, tampered, unapproved) are refused before it exists."""
    check_options(opts)
    baseline, decision, recorded = load_baseline(opts.baseline, opts.allowed_signers, trees=[runs_dir],
                                                 max_age_s=opts.max_age_s)
    # The target the approved decision was taken on travels with its package; the CLI's only stands in.
    if recorded is not None:
        opts = dataclasses.replace(opts, target=recorded)
    endpoint = watch_endpoint(opts, baseline)
    rd = RunDir.create(runs_dir, "watch", argv, out=out, record={"baseline": str(opts.baseline)})

    def sample(s: Sample, fired: list[Trigger]) -> None:
        rd.append_jsonl(layout.SAMPLES, s.model_dump(mode="json"))
        if on_sample is not None:
            on_sample(s, fired)

    try:
        result = asyncio.run(_watch(opts, baseline, decision, endpoint, sample))
    except BaseException:
        rd.write_manifest()
        raise
    artifact = rollback_artifact(result.baseline)
    record = {"samples": len(result.samples), "triggers": [t.model_dump(mode="json") for t in result.triggers],
              "rollback": artifact if result.triggers else None, "exit_code": result.exit_code}
    rd.write_json(layout.WATCH, record)
    rd.write_manifest()
    return WatchRun(result, rd, record, artifact)


def _agent_case_names() -> tuple[str, ...]:
    return tuple(CASES)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds: finite, at least 1 s, at most 7 days
    (k3fleet.bounds ``DURATIONS``); inf, nan and 1e400 are refused, not watched forever."""
    return parse_seconds(text, "--for", "watch --for")
