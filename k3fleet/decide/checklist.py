"""The sign-off checklist: every item pass / fail / missing, with the evidence file it rests on.

Pure: the items are computed from an :class:`EvidenceSummary` alone. An item whose evidence is
not in the summary is ``missing``, never ``pass`` (docs/decision.md "The checklist").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_image import parse_image_ref
from k3fleet.models.evidence import (
    AgentCase,
    AgentEvidence,
    ChecklistItem,
    DataProtectionBrief,
    EvidenceSummary,
    Fact,
    ItemStatus,
    LoadEvidence,
    Ref,
    StartupEvidence,
)
from k3fleet.verdict import all2all
from k3fleet.verdict.rules import release_key

# Audit check ids that make a host unfit to serve the image (the version chain and what the
# start-up depends on); the chain rule of the verdict marks them with chain=True as well.
CHAIN_CHECKS = frozenset({"driver.branch", "driver.version_min", "container.cuda_runtime", "container.probe",
                          "container.image_present", "container.vllm_version", "fabricmanager.version_match",
                          "driver.pending_reboot", "fleet.image_digest_drift"})
INTERCONNECT_CHECKS = frozenset({"rdma.port_state", "rdma.rail_count", "rdma.peermem", "gpu.fabric_state",
                                 "fabricmanager.active", "fabricmanager.present", "gpu.count", "nccl.settings"})

# Agent contract cases by checklist item: a case name containing any of these words belongs to
# the item (the acceptance suite's case names, docs/acceptance.md).
AGENT_ITEMS: dict[str, tuple[str, ...]] = {
    "agent.retry": ("retry", "timeout"),
    "agent.client_contract": ("contract", "stream", "no_tool", "reasoning"),
    "agent.tool_schema": ("required", "nested", "invalid", "structured", "schema", "result", "multi_turn",
                          "arg"),
}


def agent_item_of(case: str) -> str | None:
    name = case.lower()
    for item, words in AGENT_ITEMS.items():
        if any(w in name for w in words):
            return item
    return None


def image_repository(ref: str | None) -> str | None:
    """``docker.io/vllm/vllm-openai:kimi-k3@sha256:..`` -> ``vllm/vllm-openai`` (docker's familiar name, so
    every spelling of a Docker Hub repository compares equal); None without a reference (or for text that
    names none)."""
    try:
        return str(parse_image_ref(ref).familiar) if ref else None
    except ValueError:
        return None


def image_tag(ref: str | None) -> str | None:
    """The reference's tag; ``latest`` when it names none (what a pull of it would take)."""
    try:
        return str(parse_image_ref(ref).tag or "latest") if ref else None
    except ValueError:
        return None


def startup_of(s: EvidenceSummary) -> StartupEvidence | None:
    """The start-up evidence: the acceptance run's, else an operator-supplied start-up log (triage)."""
    if s.accept is not None and s.accept.startup is not None:
        return s.accept.startup
    for t in s.triage:
        if t.startup is not None:
            return t.startup
    return None


def is_custom(s: EvidenceSummary) -> bool:
    """Custom-build track: a build record was given, or the served image is not the target's repository."""
    if s.build is not None:
        return True
    st = startup_of(s)
    repo = image_repository(st.image if st else None)
    return repo is not None and repo != s.target.image_repository


def audit_fresh(s: EvidenceSummary) -> tuple[bool, str | None]:
    """An audit older than a real (not --check) change night does not describe the hosts any more."""
    a, c = s.audit, s.change
    if a is None or c is None or c.check or not c.started_at or not a.started_at:
        return True, None
    if a.started_at < c.started_at:
        return False, (f"audit {a.run} ({a.started_at}) predates change night {c.run} ({c.started_at}): "
                       "audit the fleet again after the change")
    return True, None


def all_facts(s: EvidenceSummary) -> list[Fact]:
    out: list[Fact] = []
    if s.audit is not None:
        out += s.audit.findings
    for t in s.triage:
        out += t.findings
    if s.accept is not None:
        for probe in (s.accept.startup, s.accept.prefix_cache, s.accept.agent, s.accept.load):
            if probe is not None:
                out += probe.findings
    return out


@dataclass(frozen=True)
class _Item:
    id: str
    title: str
    track: str
    fn: Callable[[EvidenceSummary], tuple[ItemStatus, str, list[Ref]]]


def _refs(*refs: Ref | None) -> list[Ref]:
    seen: list[Ref] = []
    for r in refs:
        if r is not None and r not in seen:
            seen.append(r)
    return seen


def _fail_refs(facts: Iterable[Fact]) -> list[Ref]:
    return _refs(*(f.ref for f in facts))


# -- items ------------------------------------------------------------------------------------------------


def _image_tag_digest(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    st = startup_of(s)
    if st is None or not st.image:
        return "missing", "no start-up evidence names the served image (accept startup)", []
    if not st.image_digest:
        return "missing", f"image {st.image}: the digest was not logged at start-up", [st.ref]
    if s.target.image_digest and st.image_digest != s.target.image_digest:
        return "fail", f"served digest {st.image_digest} is not the target's pin {s.target.image_digest}", [st.ref]
    if not is_custom(s) and image_tag(st.image) != image_tag(s.target.image):
        return "fail", f"served {st.image}, the target serves {s.target.image}", [st.ref]
    return "pass", f"{st.image} at {st.image_digest}", [st.ref]


def _vllm_version(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    st = startup_of(s)
    if st is None or not st.vllm_version:
        return "missing", "the vLLM version was not read from the start-up log", _refs(st.ref if st else None)
    channel = (f"custom build of {s.build.source_branch} at {s.build.commit[:12]}" if s.build is not None
               else "custom image (no build record)" if is_custom(s) else f"official image {s.target.image}")
    have, want = release_key(st.vllm_version), release_key(s.target.vllm_min)
    if have is None or want is None or have < want:
        return "fail", f"vLLM {st.vllm_version} ({channel}) is below the target's minimum {s.target.vllm_min}", \
            [st.ref]
    return "pass", f"vLLM {st.vllm_version}, {channel}", _refs(st.ref, s.build_ref)


def _cuda13(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    want = s.target.image_cuda.split(".")[0]
    st = startup_of(s)
    if st is not None and st.cuda_version:
        if st.cuda_version.split(".")[0] != want:
            return "fail", f"CUDA {st.cuda_version} inside the container, the target image is CUDA {want}", [st.ref]
        return "pass", f"CUDA {st.cuda_version} inside the container (start-up log)", [st.ref]
    if s.audit is not None:
        cudas = {h.image_cuda for h in s.audit.hosts if h.image_cuda}
        if cudas:
            bad = sorted(c for c in cudas if c.split(".")[0] != want)
            if bad:
                return "fail", f"image CUDA {', '.join(bad)} on audited hosts, the target is CUDA {want}", \
                    [s.audit.ref]
            return "pass", f"image CUDA {', '.join(sorted(cudas))} (image metadata on audited hosts)", [s.audit.ref]
    return "missing", "CUDA inside the container was read neither at start-up nor by the audit", []


def _driver_branch(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    triage_bad = [f for f in all_facts(s) if f.ref.operator_supplied and f.check_id in ("driver.branch",
                                                                                   "driver.version_min")]
    a = s.audit
    if a is None:
        if triage_bad:
            return "fail", "; ".join(f.message for f in triage_bad), _fail_refs(triage_bad)
        return "missing", "no audit run: every host's driver is unknown", []
    fresh, why = audit_fresh(s)
    if not fresh:
        return "missing", why or "the audit is stale", _refs(a.ref, s.change.ref if s.change else None)
    low = sorted(h.host for h in a.hosts if h.branch is not None and h.branch < s.target.driver_branch)
    unknown = sorted(h.host for h in a.hosts if h.branch is None)
    if low or triage_bad:
        parts = [f"{len(low)} host(s) below R{s.target.driver_branch}: {', '.join(low)}"] if low else []
        parts += [f.message for f in triage_bad]
        return "fail", "; ".join(parts), _refs(a.ref, *_fail_refs(triage_bad))
    if unknown or a.interrupted or not a.hosts or a.outcome == "incomplete":
        why = (f"driver unknown on {', '.join(unknown)}" if unknown else "the audit was interrupted" if a.interrupted
               else "the audit measured no host")
        return "missing", why, [a.ref]
    return "pass", f"all {len(a.hosts)} host(s) on R{s.target.driver_branch} or newer", [a.ref]


def _chain_agree(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    problems = chain_problems(s)
    if problems:
        return "fail", "; ".join(t for t, _ in problems), _refs(*(r for _, refs in problems for r in refs))
    st = startup_of(s)
    if s.audit is None or st is None:
        have = "audit" if s.audit is not None else "start-up log" if st is not None else None
        return "missing", ("host, container and start-up cannot be compared: " +
                           (f"only the {have}" if have else "neither an audit nor a start-up log")), \
            _refs(s.audit.ref if s.audit else None, st.ref if st else None)
    digests = {h.image_digest for h in s.audit.hosts if h.image_digest}
    if not digests or not st.image_digest:
        return "missing", "the image digest is not known on both sides (audit hosts and start-up)", \
            [s.audit.ref, st.ref]
    return "pass", f"hosts hold {st.image_digest}, the same image started with CUDA {st.cuda_version or '?'} " \
                   f"and vLLM {st.vllm_version or '?'}", [s.audit.ref, st.ref]


def triage_outside_audit(s: EvidenceSummary) -> list[str]:
    """One line per triaged host the audit did not see: its findings stay operator-supplied evidence,
    and a host count that includes it says so (never counted in silence)."""
    if s.audit is None:
        return []
    audited = {h.host for h in s.audit.hosts}
    out = []
    for t in s.triage:
        if t.host and t.host not in audited:
            out.append(f"triaged host {t.host!r} (run {t.run}) is not in the audit {s.audit.run}: its findings are "
                       "counted as operator-supplied evidence about a host the audit did not see")
    return out


def _hosts_text(s: EvidenceSummary, hosts: list[str]) -> str:
    """Host names for a finding count, each triaged host outside the audit marked as such."""
    audited = {h.host for h in s.audit.hosts} if s.audit is not None else None
    return ", ".join(f"{h} (triaged, not in the audit)" if audited is not None and h not in audited else h
                     for h in hosts)


def chain_problems(s: EvidenceSummary) -> list[tuple[str, list[Ref]]]:
    """Every disagreement in the image -> CUDA -> driver chain, each with its evidence."""
    out: list[tuple[str, list[Ref]]] = []
    chain = [f for f in all_facts(s) if f.failed and (f.chain or f.check_id in CHAIN_CHECKS)]
    by_id: dict[str, list[Fact]] = {}
    for f in chain:
        by_id.setdefault(f.check_id, []).append(f)
    for cid, facts in sorted(by_id.items()):
        hosts = sorted({f.host for f in facts if f.host})
        where = f" on {len(hosts)} host(s): {_hosts_text(s, hosts)}" if hosts else ""
        out.append((f"{cid}{where}: {facts[0].message}", _fail_refs(facts)))
    st = startup_of(s)
    a = s.audit
    if a is not None:
        digests = sorted({h.image_digest for h in a.hosts if h.image_digest})
        if len(digests) > 1:
            out.append((f"audited hosts hold {len(digests)} different image digests: {', '.join(digests)}", [a.ref]))
        if st is not None and st.image_digest and digests and st.image_digest not in digests:
            out.append((f"the server started {st.image_digest}, the audited hosts hold {', '.join(digests)}",
                        [a.ref, st.ref]))
        cudas = sorted({h.image_cuda for h in a.hosts if h.image_cuda})
        if st is not None and st.cuda_version and cudas and not any(
                _same_release(st.cuda_version, c) for c in cudas):
            out.append((f"CUDA {st.cuda_version} at start-up, the image on the hosts says {', '.join(cudas)}",
                        [a.ref, st.ref]))
        vllms = sorted({h.image_vllm for h in a.hosts if h.image_vllm})
        if st is not None and st.vllm_version and vllms and not any(
                _same_release(st.vllm_version, v) for v in vllms):
            out.append((f"vLLM {st.vllm_version} at start-up, the image on the hosts says {', '.join(vllms)}",
                        [a.ref, st.ref]))
    if st is not None:
        if st.cuda_version and st.cuda_version.split(".")[0] != s.target.image_cuda.split(".")[0]:
            out.append((f"CUDA {st.cuda_version} at start-up, the target image is CUDA {s.target.image_cuda}",
                        [st.ref]))
        have, want = release_key(st.vllm_version), release_key(s.target.vllm_min)
        if st.vllm_version and have is not None and want is not None and have < want:
            out.append((f"vLLM {st.vllm_version} at start-up is below the minimum {s.target.vllm_min}", [st.ref]))
        if s.build is not None and st.image_digest and st.image_digest != s.build.digest:
            out.append((f"the server started {st.image_digest}, the build record says {s.build.digest}",
                        _refs(st.ref, s.build_ref)))
        if s.build is not None and st.image and not _same_image(st.image, s.build.image):
            official = image_repository(st.image) == s.target.image_repository
            out.append((f"the server serves {st.image}" + (" (the official image)" if official else "")
                        + f", the build record is for {s.build.image}: custom-build evidence is not about this "
                          "server; decide each track with its own runs", _refs(st.ref, s.build_ref)))
    for t in s.triage:
        if st is not None and t.image_digest and st.image_digest and t.image_digest != st.image_digest:
            out.append((f"a captured image inspect shows {t.image_digest}, the server started {st.image_digest}",
                        [t.ref, st.ref]))
    return out


def _same_image(a: str, b: str) -> bool:
    """Same repository and tag (a digest beside either is compared on its own)."""
    return image_repository(a) == image_repository(b) and image_tag(a) == image_tag(b)


def _same_release(a: str, b: str) -> bool:
    """13.0 and 13.0.2 agree (the log may print fewer parts than the image label)."""
    pa, pb = a.lstrip("v").split("."), b.lstrip("v").split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def world_size(st: StartupEvidence) -> int | None:
    if st.tensor_parallel_size is None:
        return None
    return st.tensor_parallel_size * (st.pipeline_parallel_size or 1) * (st.data_parallel_size or 1)


def topology_problems(s: EvidenceSummary) -> list[tuple[str, list[Ref]]]:
    out: list[tuple[str, list[Ref]]] = []
    st = startup_of(s)
    a = s.audit
    # The audit leaves hosts with interconnect failures out of serving (the audit.limits rule); a
    # capture the operator took from a serving host is about the topology itself.
    bad = [f for f in all_facts(s) if f.failed and f.check_id in INTERCONNECT_CHECKS and f.ref.operator_supplied]
    by_id: dict[str, list[Fact]] = {}
    for f in bad:
        by_id.setdefault(f.check_id, []).append(f)
    for cid, facts in sorted(by_id.items()):
        hosts = sorted({f.host for f in facts if f.host})
        out.append((f"{cid} on {_hosts_text(s, hosts) or 'the fleet'}: {facts[0].message}", _fail_refs(facts)))
    if st is not None and a is not None:
        ws = world_size(st)
        if ws is not None and a.gpus_healthy and ws > a.gpus_healthy:
            out.append((f"start-up uses {ws} GPUs (TP {st.tensor_parallel_size} x PP {st.pipeline_parallel_size or 1}"
                        f" x DP {st.data_parallel_size or 1}), the audit counts {a.gpus_healthy} healthy",
                        [a.ref, st.ref]))
        if ws is not None and a.gpus_required and ws < a.gpus_required:
            out.append((f"start-up uses {ws} GPUs, the strategy {a.strategy or '?'} needs at least {a.gpus_required}",
                        [a.ref, st.ref]))
        # The backend that ran, against the audit's interconnect of the serving group (docs/facts.md section 15).
        j = all2all.judge(st.all2all_backend, a.interconnect) if a.interconnect is not None else None
        if j is not None and j.kind == "fail":
            out.append((f"start-up uses --all2all-backend {st.all2all_backend}: {j.message}; fix: {j.fix}",
                        [a.ref, st.ref]))
    return out


def _topology(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    problems = topology_problems(s)
    if problems:
        return "fail", "; ".join(t for t, _ in problems), _refs(*(r for _, refs in problems for r in refs))
    st = startup_of(s)
    a = s.audit
    if a is None or st is None or world_size(st) is None:
        return "missing", "GPU count and parallel settings need both the audit and the start-up log", \
            _refs(a.ref if a else None, st.ref if st else None)
    if a.gpus_healthy < a.gpus_required:
        return "fail", f"{a.gpus_healthy} healthy GPUs, {a.gpus_required} required", [a.ref]
    return "pass", (f"{a.gpus_healthy} healthy GPUs ({a.strategy or 'strategy ?'}); TP {st.tensor_parallel_size}"
                    f" PP {st.pipeline_parallel_size or 1} DP {st.data_parallel_size or 1}"
                    f" EP {st.expert_parallel_size or (1 if not st.enable_expert_parallel else 'on')}"), [a.ref, st.ref]


def _model_load(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    st = startup_of(s)
    if st is None:
        return "missing", "no start-up log was read (accept startup)", []
    if st.model_load_oom:
        return "fail", "; ".join(f.message for f in st.model_load_oom), [st.ref]
    if st.status in ("error", "inconclusive", "skipped"):
        return "missing", f"start-up probe {st.status}: {st.reason or ''}".strip(), [st.ref]
    return "pass", "the model loaded without running out of memory", [st.ref]


def _on_load(check: Callable[[LoadEvidence], tuple[ItemStatus, str, list[Ref]]]
             ) -> Callable[[EvidenceSummary], tuple[ItemStatus, str, list[Ref]]]:
    """An item judged on the load run; missing when there is none."""

    def item(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
        ld = s.accept.load if s.accept else None
        if ld is None:
            return "missing", "no load run (accept load)", []
        return check(ld)

    return item


def _phase_saved(ld: LoadEvidence, phase: str, saved: bool, unsaved: str, text: str
                 ) -> tuple[ItemStatus, str, list[Ref]]:
    """Pass with ``text`` when ``phase`` ran and its figures were ``saved``; missing (``unsaved``) otherwise."""
    refs = _refs(ld.ref, ld.curves_ref)
    if phase not in ld.phases or not saved:
        return "missing", unsaved, refs
    return "pass", text, refs


@_on_load
def _load_long_input(ld: LoadEvidence) -> tuple[ItemStatus, str, list[Ref]]:
    return _phase_saved(ld, "long_input", ld.request_params_saved,
                        "the long-input ladder's curves or request parameters were not saved",
                        "long-input ladder saved with its request parameters")


@_on_load
def _load_agent_queue(ld: LoadEvidence) -> tuple[ItemStatus, str, list[Ref]]:
    text = "agent ramp saved (queue, latency percentiles)"
    if ld.ceiling is not None:
        text += f"; stable only up to {ld.ceiling} concurrent sessions"
    return _phase_saved(ld, "agent_ramp", ld.queue_latency_saved,
                        "the concurrent agent ramp's queue and latency were not saved", text)


@_on_load
def _load_termination(ld: LoadEvidence) -> tuple[ItemStatus, str, list[Ref]]:
    if "sustained" not in ld.phases:
        return "missing", "the sustained phase did not run", [ld.ref]
    counts = {"restarts": ld.restarts, "OOM events": ld.oom_events, "/health failures": ld.health_failures}
    if any(v is None for k, v in counts.items() if k != "OOM events"):
        return "missing", "restarts and /health failures were not counted in the sustained run", [ld.ref]
    bad = {k: v for k, v in counts.items() if v}
    if bad:
        return "fail", "sustained run: " + ", ".join(f"{v} {k}" for k, v in bad.items()), [ld.ref]
    return "pass", "no restart, OOM or /health failure in the sustained run", [ld.ref]


def _prefix_cold(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    pc = s.accept.prefix_cache if s.accept else None
    if pc is None:
        return "missing", "no prefix-cache run (accept prefix-cache)", []
    if not pc.cold_saved:
        return "missing", f"the cold request's result was not saved ({pc.status}: {pc.reason or ''})", [pc.ref]
    return "pass", "cold request saved (a prefix the server had not seen)", [pc.ref]


def _prefix_warm(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    pc = s.accept.prefix_cache if s.accept else None
    if pc is None:
        return "missing", "no prefix-cache run (accept prefix-cache)", []
    if pc.status == "fail" or pc.controlled_reuse is False or pc.caching_enabled is False:
        why = pc.reason or "no measured reuse"
        return "fail", f"warm requests show no controlled reuse: {why}", [pc.ref]
    if pc.status != "pass" or not pc.warm_saved or not pc.cache_metrics:
        return "missing", f"prefix-cache probe {pc.status}: {pc.reason or 'warm windows or cache metrics absent'}", \
            [pc.ref]
    ratio = f" (hit ratio {pc.hit_ratio:.2f})" if pc.hit_ratio is not None else ""
    return "pass", f"warm requests reuse the prefix, cache metrics read around each window{ratio}", [pc.ref]


def _agent_item(item: str) -> Callable[[EvidenceSummary], tuple[ItemStatus, str, list[Ref]]]:
    def check(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
        ag: AgentEvidence | None = s.accept.agent if s.accept else None
        if ag is None:
            return "missing", "no agent contract run (accept agent)", []
        cases = [c for c in ag.cases if agent_item_of(c.name) == item and c.runs > 0]
        if not cases:
            return "missing", "no contract case of this kind ran", [ag.ref]
        failing = [c for c in cases if c.failures]
        if failing:
            return "fail", "; ".join(_case_text(c) for c in failing), [ag.ref]
        return "pass", ", ".join(f"{c.name} {c.passed}/{c.runs}" for c in cases), [ag.ref]

    return check


def _case_text(c: AgentCase) -> str:
    defects = ", ".join(f"{k} x{v}" for k, v in sorted(c.defects.items()))
    where = f" at the {c.layer} layer" if c.layer else ""
    crit = " (critical path)" if c.critical else ""
    return f"{c.name}{crit}: {c.passed}/{c.runs} passed" + (f", {defects}{where}" if defects else where)


def _build_field(field: str, title: str) -> Callable[[EvidenceSummary], tuple[ItemStatus, str, list[Ref]]]:
    def check(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
        if s.build is None:
            return "missing", f"custom image without a build record: give --build FILE with its {title}", []
        value = getattr(s.build, field)
        if field == "digest":
            st = startup_of(s)
            if st is not None and st.image_digest and st.image_digest != value:
                return "fail", f"build digest {value}, the server started {st.image_digest}", \
                    _refs(s.build_ref, st.ref)
        return "pass", str(value), _refs(s.build_ref)

    return check


# vLLM 0.10.1 made request logging opt-in (--enable-log-requests); up to 0.10.0 a server logged every request
# unless started with --disable-log-requests (docs/facts.md section 18).
LOG_REQUESTS_OPT_IN = (0, 10, 1)
_LOG_FLAGS = {"--enable-log-requests": True, "--no-enable-log-requests": False, "--disable-log-requests": False,
              "--no-disable-log-requests": True}
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def request_logging(st: StartupEvidence) -> tuple[bool | None, str]:
    """Whether the server logs requests, from its launch command and vLLM version: (on, why); on is None
    when the evidence cannot say."""
    if not st.launch_command:
        return None, ("no launch command in the start-up evidence (accept startup --launch-command): whether the "
                      "server logs requests is unknown")
    argv = st.launch_command.split()
    given = [a for a in argv if a in _LOG_FLAGS]
    outputs = " and outputs (--enable-log-outputs)" if "--enable-log-outputs" in argv else ""
    if given:
        on = _LOG_FLAGS[given[-1]]  # argparse: the last of them wins
        return on, f"{given[-1]} in the launch command: requests{outputs if on else ''} " \
            + ("are logged" if on else "are not logged")
    m = _VERSION.match(st.vllm_version or "")
    if m is None:
        return None, ("neither --enable-log-requests nor --disable-log-requests in the launch command, and the vLLM "
                      "version is unknown: whether it logs requests by default is unknown")
    version = tuple(int(g or 0) for g in m.groups())
    if version >= LOG_REQUESTS_OPT_IN:
        return False, (f"vLLM {st.vllm_version} logs requests only with --enable-log-requests (opt-in since 0.10.1), "
                       "which the launch command does not give")
    return True, (f"vLLM {st.vllm_version} logs every request unless started with --disable-log-requests "
                  "(request logging became opt-in in 0.10.1), which the launch command does not give")


def _no_block(s: EvidenceSummary) -> str:
    if s.profile is None:
        return "no production profile (decide --profile): its data_protection block says this"
    return (f"the profile {s.profile.name!r} has no data_protection block (log_retention_days, run_retention_days, "
            "evidence_readers)")


def _logging_scope(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    st = startup_of(s)
    if st is None:
        return "missing", "no start-up evidence: the launch command says what the server logs", []
    on, why = request_logging(st)
    dp = s.profile.data_protection if s.profile is not None else None
    refs = _refs(st.ref, s.profile.ref if s.profile is not None and on else None)
    if on is None:
        return "missing", why, [st.ref]
    if not on:
        return "pass", f"request logging off: {why}", [st.ref]
    if dp is None:
        return "missing", f"{why}; nothing says prompts may reach the server's logs: {_no_block(s)}", refs
    if not dp.request_logging:
        return "fail", (f"{why}, but the profile's data_protection does not allow request logging "
                        "(request_logging: false): start the server without it"), refs
    return "pass", (f"{why}; the profile allows request logging, the logs are kept {dp.log_retention_days} days"), refs


def _declared(s: EvidenceSummary, unproven: str, text: Callable[[DataProtectionBrief], str]
              ) -> tuple[ItemStatus, str, list[Ref]]:
    """Pass with ``text`` of the profile's data_protection block; missing (``unproven``) without one."""
    dp = s.profile.data_protection if s.profile is not None else None
    refs = _refs(s.profile.ref if s.profile else None)
    if dp is None:
        return "missing", f"{unproven}: {_no_block(s)}", refs
    return "pass", text(dp), refs


def _retention(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    return _declared(s, "retention of logs and run directories is unproven", lambda dp: (
        f"server logs kept {dp.log_retention_days} days, run directories {dp.run_retention_days} days "
        f"(k3fleet prune --older-than {dp.run_retention_days}d; runs an accepted decision cites are kept)"))


def _access(s: EvidenceSummary) -> tuple[ItemStatus, str, list[Ref]]:
    return _declared(s, "who may read the evidence is unproven", lambda dp: (
        f"evidence readable by {', '.join(dp.evidence_readers)} (run directories 0700, files 0600, the package "
        "0600: grant them access, no one else)"))


ITEMS: tuple[_Item, ...] = (
    _Item("image.tag_digest", "Image tag and digest", "common", _image_tag_digest),
    _Item("vllm.version_channel", "vLLM version and source channel", "common", _vllm_version),
    _Item("container.cuda13", "CUDA 13 inside the container", "common", _cuda13),
    _Item("hosts.driver_branch", "Every host on R580 or newer", "common", _driver_branch),
    _Item("chain.agree", "Host, container and start-up agree on the chain", "common", _chain_agree),
    _Item("topology.parallel", "GPU count, topology, parallel and interconnect settings", "common", _topology),
    _Item("startup.model_load_memory", "Model-load memory stable", "common", _model_load),
    _Item("load.long_input", "Long-input curves and request parameters saved", "common", _load_long_input),
    _Item("load.agent_queue", "Concurrent agent queue and latency documented", "common", _load_agent_queue),
    _Item("load.no_termination", "No unexplained process termination in the sustained run", "common",
          _load_termination),
    _Item("prefix_cache.cold", "Cold prefix-cache result saved", "common", _prefix_cold),
    _Item("prefix_cache.warm", "Warm result with cache metrics and controlled reuse", "common", _prefix_warm),
    _Item("agent.tool_schema", "Tool schemas pass repeated validation", "common", _agent_item("agent.tool_schema")),
    _Item("agent.client_contract", "reasoning / content / tool_calls match the client contract", "common",
          _agent_item("agent.client_contract")),
    _Item("agent.retry", "Retry and failure behaviour documented", "common", _agent_item("agent.retry")),
    _Item("data.logging_scope", "Data protection: what the server logs", "common", _logging_scope),
    _Item("data.retention", "Data protection: retention of logs and run directories", "common", _retention),
    _Item("data.access", "Data protection: who may read the evidence", "common", _access),
)

BUILD_ITEMS: tuple[_Item, ...] = (
    _Item("build.source_branch", "Custom build: source branch", "custom",
          _build_field("source_branch", "source branch")),
    _Item("build.commit", "Custom build: commit", "custom", _build_field("commit", "commit")),
    _Item("build.lockfile", "Custom build: lockfile", "custom", _build_field("lockfile", "lockfile")),
    _Item("build.command", "Custom build: build command", "custom", _build_field("build_command", "build command")),
    _Item("build.digest", "Custom build: image digest", "custom", _build_field("digest", "digest")),
    _Item("build.rollback_image", "Custom build: rollback image", "custom",
          _build_field("rollback_image", "rollback image")),
)

OWNERS_ITEM = "owners.failed_items"
REVIEWER_ITEM = "signoff.reviewer"
ROLLBACK_OWNER_ITEM = "signoff.rollback_owner"
# Every id an owners file may name.
ITEM_IDS: tuple[str, ...] = tuple(i.id for i in (*ITEMS, *BUILD_ITEMS))


def build_checklist(s: EvidenceSummary) -> list[ChecklistItem]:
    """Every item, in the issue's order; the owners and reviewer items last."""
    custom = is_custom(s)
    items: list[ChecklistItem] = []
    for spec in (*ITEMS, *(BUILD_ITEMS if custom else ())):
        status, detail, refs = spec.fn(s)
        track = spec.track if spec.track != "common" else "common"
        entry = s.owners.items.get(spec.id) if s.owners is not None and status == "fail" else None
        items.append(ChecklistItem(id=spec.id, title=spec.title, track=track,  # type: ignore[arg-type]
                                   status=status, detail=detail, evidence=refs, owner=entry))
    items.append(_owners_item(s, items))
    items.append(_reviewer_item(s))
    items.append(_rollback_owner_item(s))
    return items


def bounded_agent_defects(s: EvidenceSummary) -> list[AgentCase]:
    """Non-critical cases whose failures stay at or under the policy's defect rate."""
    ag = s.accept.agent if s.accept else None
    if ag is None:
        return []
    return [c for c in ag.cases if c.failures and not c.critical and c.runs
            and c.failures / c.runs <= s.policy.max_noncritical_defect_rate]


def _owners_item(s: EvidenceSummary, items: list[ChecklistItem]) -> ChecklistItem:
    failed = [i for i in items if i.status == "fail"]
    refs = _refs(s.owners_ref)
    if not failed:
        return ChecklistItem(id=OWNERS_ITEM, title="Owner, deadline and rollback for every failed item",
                             status="pass", detail="no failed item", evidence=refs)
    lacking = [i.id for i in failed if i.owner is None]
    # A bounded agent defect is served under a rate limit, by an owner, as a documented feature.
    bounded_items = {agent_item_of(c.name) for c in bounded_agent_defects(s)}
    incomplete = [i.id for i in failed if i.owner is not None and i.id in bounded_items
                  and (not i.owner.rate_limit or not i.owner.documented)]
    if lacking or incomplete:
        parts = []
        if lacking:
            parts.append(f"no owner, deadline and rollback for {', '.join(lacking)}"
                         + ("" if s.owners is not None else " (give --owners FILE.yaml)"))
        if incomplete:
            parts.append(f"bounded agent defect without rate_limit and documented: {', '.join(incomplete)}")
        return ChecklistItem(id=OWNERS_ITEM, title="Owner, deadline and rollback for every failed item",
                             status="missing", detail="; ".join(parts), evidence=refs)
    return ChecklistItem(id=OWNERS_ITEM, title="Owner, deadline and rollback for every failed item", status="pass",
                         detail="; ".join(f"{i.id}: {i.owner.owner} by {i.owner.deadline}" for i in failed
                                          if i.owner is not None), evidence=refs)


def _rollback_owner_item(s: EvidenceSummary) -> ChecklistItem:
    title = "Rollback owner"
    if not s.rollback_owner:
        return ChecklistItem(id=ROLLBACK_OWNER_ITEM, title=title, status="missing",
                             detail="no rollback owner named: who rolls the service back when watch fires "
                                    "(decide --rollback-owner NAME)")
    return ChecklistItem(id=ROLLBACK_OWNER_ITEM, title=title, status="pass",
                         detail=f"{s.rollback_owner} rolls back to the accepted configuration")


def _reviewer_item(s: EvidenceSummary) -> ChecklistItem:
    title = "Reviewer's name and time"
    if not s.reviewer or not s.reviewed_at:
        return ChecklistItem(id=REVIEWER_ITEM, title=title, status="missing", detail="no reviewer named")
    return ChecklistItem(id=REVIEWER_ITEM, title=title, status="pass", detail=f"{s.reviewer} at {s.reviewed_at}")
