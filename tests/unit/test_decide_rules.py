"""The decision table, as a table: every outcome, every rule, every missing-evidence case.

The pure decision function is driven from typed evidence summaries here; the same rules over
real run directories (lab audit, upgrade --check, the simulator) are in
tests/integration/test_decide_runs.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from k3fleet.decide import RULES, build_checklist, decide
from k3fleet.decide.checklist import ITEM_IDS
from k3fleet.decide.envelope import tested_text as envelope_text
from k3fleet.errors import UsageError
from k3fleet.models.evidence import (
    AcceptEvidence,
    AgentCase,
    ChangeEvidence,
    CustomBuild,
    EvidenceSummary,
    Fact,
    HostEvidence,
    OomRecord,
    OwnerEntry,
    OwnersFile,
    StartupEvidence,
    TriageEvidence,
)
from tests.unit.decide_evidence import (
    DIGEST,
    LIMIT_KINDS,
    LIMIT_OWNER,
    OTHER,
    healthy,
)
from tests.unit.decide_evidence import ref as _ref


def _acc(s: EvidenceSummary) -> AcceptEvidence:
    assert s.accept is not None
    return s.accept


def _st(s: EvidenceSummary) -> StartupEvidence:
    assert _acc(s).startup is not None
    return _acc(s).startup  # type: ignore[return-value]


def _case(s: EvidenceSummary, name: str) -> AgentCase:
    agent = _acc(s).agent
    assert agent is not None
    return next(c for c in agent.cases if c.name == name)


def _fail_case(name: str, failures: int, defects: dict[str, int] | None = None) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        c = _case(s, name)
        c.passed = c.runs - failures
        c.defects = defects or {}
        c.layer = "http"
    return mut


def _owners(**items: dict[str, Any]) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        s.owners = OwnersFile(items={k: OwnerEntry(**v) for k, v in items.items()},
                              limits={k: OwnerEntry(**LIMIT_OWNER) for k in LIMIT_KINDS})
        s.owners_ref = _ref("decision", "inputs/owners.yaml")
    return mut


def _chain(*muts: Callable[[EvidenceSummary], None]) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        for m in muts:
            m(s)
    return mut


def _set(path: str, value: Any) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        obj: Any = s
        *head, last = path.split(".")
        for part in head:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    return mut


def _audit_finding(check: str, host: str = "gpu-b01", chain: bool = True) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        assert s.audit is not None
        s.audit.findings.append(Fact(check_id=check, severity="critical", kind="fail", host=host, chain=chain,
                                     message=f"{check} failed on {host}", ref=s.audit.ref))
    return mut


def _startup_finding(fid: str, message: str) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        st = _st(s)
        st.status = "fail"
        st.findings.append(Fact(check_id=fid, severity="error", message=message, layer="environment", ref=st.ref))
    return mut


def _custom(build: bool, digest: str = DIGEST) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        _st(s).image = "registry.example.internal/ml/vllm-k3-cu129:2026-11"
        assert s.audit is not None
        for h in s.audit.hosts:
            h.image_ref = "registry.example.internal/ml/vllm-k3-cu129:2026-11"
        if build:
            s.build = CustomBuild(image="registry.example.internal/ml/vllm-k3-cu129:2026-11", source_branch="k3",
                                  commit="0123abcd4567ef89", lockfile="uv.lock sha256:" + "ab" * 32,
                                  build_command="docker build -f docker/Dockerfile --build-arg CUDA=12.9 .",
                                  digest=digest, rollback_image="vllm/vllm-openai:kimi-k3@" + DIGEST)
            s.build_ref = _ref("decision", "inputs/build.yaml")
    return mut


def _change(check: bool, hosts: dict[str, str], started: str) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        s.change = ChangeEvidence(run="change-1", ref=_ref("change-1", "journal.jsonl"), change_id="CHG-1042",
                                  operator="alice", check=check, started_at=started, hosts=hosts)
    return mut


def _triage(check: str, chain: bool) -> Callable[[EvidenceSummary], None]:
    def mut(s: EvidenceSummary) -> None:
        ref = _ref("triage-1", "triage.json", op=True)
        s.triage.append(TriageEvidence(run="triage-1", ref=ref, host="gpu-x01", kinds=["nvidia_smi"],
                                       findings=[Fact(check_id=check, severity="critical", kind="fail", host="gpu-x01",
                                                      chain=chain, message=f"{check} in a pasted capture",
                                                      ref=ref)]))
    return mut


def _old_vllm(launch: str) -> Callable[[EvidenceSummary], None]:
    """vLLM 0.10.0 on the hosts and at start-up (the target allowing it), started with ``launch``."""
    def mut(s: EvidenceSummary) -> None:
        _st(s).vllm_version, _st(s).launch_command, s.target.vllm_min = "0.10.0", launch, "0.9.0"
        assert s.audit is not None
        for h in s.audit.hosts:
            h.image_vllm = "0.10.0"
    return mut


def _oom(*topology: bool, failed: int = 32) -> Callable[[EvidenceSummary], None]:
    """An OOM collapse under load at ``failed`` sessions with one OOM record per flag (True: uneven KV
    pressure across engines, a topology OOM; False: every engine full, capacity)."""
    def mut(s: EvidenceSummary) -> None:
        ld = _acc(s).load
        assert ld is not None
        ld.outcome, ld.reason, ld.oom_events = "collapse", f"OOM at {failed} sessions", len(topology)
        ld.failed_concurrency = failed
        ld.oom_records = [OomRecord(t_s=41.5 + i, phase="agent_ramp", step=f"{failed} sessions", concurrency=failed,
                                    node="gpu-b01", engine="1", message="CUDA out of memory",
                                    last_success_t_s=40.9 + i, last_success_id=f"chatcmpl-{i}",
                                    kv_by_engine={"0": 0.41, "1": 0.97} if top else {"0": 0.96, "1": 0.97},
                                    topology=top) for i, top in enumerate(topology)]
    return mut


OWNER = {"owner": "dana", "deadline": dt.date(2026, 12, 15), "rollback": "pin the baseline image"}
OWNER_LIMITED = {**OWNER, "rate_limit": "20 tool turns/min per tenant", "documented": "docs/known-issues.md#k3-tools"}

# name -> (mutation, outcome, approved, exit code, rules that must fire, item -> status)
CASES: dict[str, tuple[Callable[[EvidenceSummary], None] | None, str, bool, int, set[str], dict[str, str]]] = {
    "healthy": (None, "go_live", True, 0, {"all.pass"}, {}),
    "driver_below_r580": (_audit_finding("driver.branch"), "rebuild_environment", False, 1, {"chain.mismatch"},
                          {"chain.agree": "fail"}),
    "digest_differs_host_vs_startup": (_set("accept.startup.image_digest", OTHER), "rebuild_environment", False, 1,
                                       {"chain.mismatch"}, {"chain.agree": "fail"}),
    "digest_drift_across_hosts": (_set("audit.hosts", [HostEvidence(host="h1", status="pass", branch=580,
                                                                    image_digest=DIGEST),
                                                       HostEvidence(host="h2", status="pass", branch=580,
                                                                    image_digest=OTHER)]),
                                  "rebuild_environment", False, 1, {"chain.mismatch"}, {"chain.agree": "fail"}),
    "vllm_below_minimum": (_set("accept.startup.vllm_version", "0.27.0"), "rebuild_environment", False, 1,
                           {"chain.mismatch"}, {"vllm.version_channel": "fail"}),
    "cuda12_in_container": (_set("accept.startup.cuda_version", "12.9"), "rebuild_environment", False, 1,
                            {"chain.mismatch"}, {"container.cuda13": "fail"}),
    "model_load_oom": (_startup_finding("accept.startup.load_oom", "GPU out of memory while loading the weights"),
                       "rebuild_environment", False, 1, {"startup.model_load_oom"},
                       {"startup.model_load_memory": "fail"}),
    "startup_nccl_failure": (_startup_finding("accept.startup.nccl", "NCCL error: unhandled system error"),
                             "rebuild_environment", False, 1, {"startup.failed"}, {}),
    "world_size_beyond_healthy_gpus": (_set("accept.startup.data_parallel_size", 4), "rebuild_environment", False, 1,
                                       {"topology.mismatch"}, {"topology.parallel": "fail"}),
    "pasted_interconnect_failure": (_triage("rdma.port_state", chain=False), "rebuild_environment", False, 1,
                                    {"topology.mismatch"}, {"topology.parallel": "fail"}),
    "gpus_short_after_plan": (_chain(_set("audit.gpus_after_plan", 8), _set("audit.gpus_healthy", 8)),
                              "expand_capacity", False, 1, {"capacity.short"}, {"topology.parallel": "fail"}),
    "queue_collapse_under_limits": (_set("accept.load.outcome", "collapse"), "expand_capacity", False, 1,
                                    {"load.collapse"}, {}),
    "sustained_oom_restarts": (_chain(_set("accept.load.restarts", 2), _set("accept.load.oom_events", 1)),
                               "expand_capacity", False, 1, {"load.collapse"}, {"load.no_termination": "fail"}),
    "concurrency_ceiling_above_profile": (
        _chain(_set("accept.load.outcome", "ceiling"), _set("accept.load.ceiling", 96),
               _set("accept.load.held_concurrency", 96)),
        "observe_with_limits", True, 0, {"load.ceiling"}, {"load.agent_queue": "pass"}),
    "concurrency_ceiling_below_profile": (
        _chain(_set("accept.load.outcome", "ceiling"), _set("accept.load.ceiling", 48),
               _set("accept.load.held_concurrency", 48)),
        "expand_capacity", False, 1, {"load.below_profile", "envelope.gap"}, {}),
    "context_refused_within_profile": (_chain(_set("accept.load.outcome", "adjust_config"),
                                              _set("accept.load.failed_context", 65536)),
                                       "rebuild_environment", False, 1, {"load.context_below_profile"}, {}),
    "context_refused_above_profile": (_chain(_set("accept.load.outcome", "adjust_config"),
                                             _set("accept.load.failed_context", 200000)),
                                      "observe_with_limits", True, 0, {"load.context_envelope"}, {}),
    # The four cases of the issue: a tiny test, an OOM only an oversized test caused, the reviewer who ran the
    # evidence, a custom build record beside another served image.
    "tiny_test_against_the_profile": (_chain(_set("accept.load.held_concurrency", 4),
                                             _set("accept.load.sustained_concurrency", 4),
                                             _set("accept.load.held_context", 16384),
                                             _set("accept.load.sustained_s", 6.0)),
                                      "observe_with_limits", False, 3, {"envelope.gap"}, {}),
    "oversized_only_oom": (_chain(_set("accept.load.outcome", "collapse"), _set("accept.load.failed_concurrency", 128),
                                  _set("accept.load.reason", "OOM at 128 sessions")),
                           "observe_with_limits", True, 0, {"load.limit_above_profile"}, {}),
    "oom_within_profile": (_chain(_set("accept.load.outcome", "collapse"), _set("accept.load.failed_concurrency", 32),
                                  _set("accept.load.held_concurrency", 16)),
                           "expand_capacity", False, 1, {"load.collapse", "envelope.gap"}, {}),
    # OOM records: uneven KV pressure across engines is a topology fault (rebuild), every engine full is capacity.
    "topology_oom_under_load": (_oom(True), "rebuild_environment", False, 1, {"load.topology_oom"},
                                {"load.no_termination": "fail"}),
    "topology_oom_only_above_the_profile": (_oom(True, failed=128), "rebuild_environment", False, 1,
                                            {"load.topology_oom"}, {}),
    "capacity_oom_under_load": (_oom(False), "expand_capacity", False, 1, {"load.collapse"}, {}),
    "topology_and_capacity_ooms": (_oom(True, False), "rebuild_environment", False, 1,
                                   {"load.topology_oom", "load.collapse"}, {}),
    "reviewer_ran_the_evidence": (_set("reviewer", "Alice@example.org"), "observe_with_limits", False, 1,
                                  {"signoff.same_person"}, {}),
    "reviewer_ran_the_change_night": (_chain(_change(True, {"gpu-b01": "not_started"}, "2026-11-30T11:00:00+00:00"),
                                             _set("reviewer", "alice"), _set("runs", [])),
                                      "observe_with_limits", False, 1, {"signoff.same_person"}, {}),
    "second_reviewer_recorded": (_set("second_reviewer", "frank"), "go_live", True, 0, {"all.pass"}, {}),
    # Without a profile, retention and access are unproven: missing, so not approved (never in silence).
    "no_profile": (_set("profile", None), "observe_with_limits", False, 3, {"profile.missing", "evidence.missing"},
                   {"data.retention": "missing", "data.access": "missing", "data.logging_scope": "pass"}),
    "request_logging_allowed_by_the_profile": (
        _chain(_set("accept.startup.launch_command", "vllm serve moonshotai/Kimi-K3 --enable-log-requests"),
               _set("profile.data_protection.request_logging", True)),
        "go_live", True, 0, {"all.pass"}, {"data.logging_scope": "pass"}),
    "request_logging_the_profile_forbids": (
        _set("accept.startup.launch_command", "vllm serve moonshotai/Kimi-K3 --enable-log-requests"),
        "observe_with_limits", False, 1, {"checklist.failed"}, {"data.logging_scope": "fail"}),
    "old_vllm_logs_requests_by_default": (_old_vllm("vllm serve moonshotai/Kimi-K3"),
        "observe_with_limits", False, 1, {"checklist.failed"}, {"data.logging_scope": "fail"}),
    "old_vllm_started_with_disable_log_requests": (_old_vllm("vllm serve moonshotai/Kimi-K3 --disable-log-requests"),
        "go_live", True, 0, {"all.pass"}, {"data.logging_scope": "pass"}),
    "no_profile_no_owner_for_its_limit": (_chain(_set("profile", None), _set("owners", None)),
                                          "observe_with_limits", False, 3, {"profile.missing", "limits.unowned"}, {}),
    "production_tool_untested": (lambda s: setattr(_acc(s).agent, "cases", [  # type: ignore[union-attr]
        c for c in _acc(s).agent.cases if c.name != "tool:get_gpu_health"]),  # type: ignore[union-attr]
                                 "observe_with_limits", False, 3, {"envelope.gap"}, {}),
    "multimodal_untested": (lambda s: setattr(_acc(s).agent, "cases", [  # type: ignore[union-attr]
        c for c in _acc(s).agent.cases if c.name != "multimodal"]),  # type: ignore[union-attr]
                            "observe_with_limits", False, 3, {"envelope.gap"}, {}),
    "slo_laxer_than_the_profile": (_set("accept.load.slo", {"ttft_p95_s": 5.0, "itl_p95_s": 0.1, "error_rate": 0.01}),
                                   "observe_with_limits", False, 3, {"envelope.gap"}, {}),
    # A log of the same build from another launch (another port on the host the probes called) blocks go-live.
    "startup_log_from_another_launch": (lambda s: _acc(s).startup.server.update(port=8001),  # type: ignore[union-attr]
                                        "observe_with_limits", False, 3, {"startup.other_server"}, {}),
    "startup_log_from_another_version": (
        lambda s: _acc(s).startup.server.update(vllm_version="0.28.0", max_model_len=65536),  # type: ignore[union-attr]
        "observe_with_limits", False, 3, {"startup.other_server"}, {}),
    # Behind a proxy the port differs but the server is the same: no finding.
    "startup_log_behind_a_proxy": (lambda s: _acc(s).startup.server.update(host="0.0.0.0", port=8001),  # type: ignore[union-attr]
                                   "go_live", True, 0, {"all.pass"}, {}),
    "prefix_flag_without_reuse": (_chain(_set("accept.prefix_cache.status", "fail"),
                                         _set("accept.prefix_cache.controlled_reuse", False),
                                         _set("accept.prefix_cache.reason", "hits did not rise")),
                                  "rebuild_environment", False, 1, {"prefix_cache.flag_without_reuse"},
                                  {"prefix_cache.warm": "fail"}),
    "prefix_caching_off": (_chain(_set("accept.startup.prefix_caching", False),
                                  _set("accept.prefix_cache.caching_enabled", False),
                                  _set("accept.prefix_cache.status", "fail")),
                           "rebuild_environment", False, 1, {"prefix_cache.off"}, {"prefix_cache.warm": "fail"}),
    "bounded_noncritical_defect_with_owner": (
        _chain(_fail_case("nested_arguments", 1, {"empty_tool_calls": 1}), _owners(**{"agent.tool_schema":
                                                                                      OWNER_LIMITED})),
        "observe_with_limits", True, 0, {"agent.bounded_defect"},
        {"agent.tool_schema": "fail", "owners.failed_items": "pass"}),
    "bounded_noncritical_defect_without_owner": (
        _fail_case("nested_arguments", 1, {"empty_tool_calls": 1}), "observe_with_limits", False, 3,
        {"agent.bounded_defect", "evidence.missing"}, {"owners.failed_items": "missing"}),
    "bounded_defect_owner_without_rate_limit": (
        _chain(_fail_case("nested_arguments", 1), _owners(**{"agent.tool_schema": OWNER})),
        "observe_with_limits", False, 3, {"agent.bounded_defect", "evidence.missing"},
        {"owners.failed_items": "missing"}),
    "noncritical_defect_unbounded": (_fail_case("structured_output", 5, {"invalid_arguments": 5}),
                                     "rebuild_environment", False, 1, {"agent.noncritical_unbounded"}, {}),
    "critical_path_repeated_parser_failure": (
        _fail_case("stream_tool_call_deltas", 3, {"merged_stream_calls": 3}), "rebuild_environment", False, 1,
        {"agent.critical_repeated"}, {"agent.client_contract": "fail"}),
    "critical_path_single_failure_with_owner": (
        _chain(_fail_case("one_required_argument", 1), _owners(**{"agent.tool_schema": OWNER})),
        "observe_with_limits", True, 0, {"agent.critical_single"}, {"agent.tool_schema": "fail"}),
    "audit_hosts_left_out": (_chain(_set("audit.outcome", "observe_with_limits"),
                                    _set("audit.reasons", ["1 host(s) fail checks and are left out"]),
                                    _set("audit.hosts", [HostEvidence(host="h1", status="pass", branch=580,
                                                                      image_digest=DIGEST),
                                                         HostEvidence(host="h2", status="pass", branch=580,
                                                                      image_digest=DIGEST),
                                                         HostEvidence(host="h3", status="fail", branch=580)])),
                             "observe_with_limits", True, 0, {"audit.limits"}, {}),
    "custom_build_with_record": (_custom(build=True), "go_live", True, 0, {"all.pass"},
                                 {"build.commit": "pass", "build.rollback_image": "pass"}),
    "custom_build_record_but_official_image_served": (
        _chain(_custom(build=True), _set("accept.startup.image", "vllm/vllm-openai:kimi-k3")),
        "rebuild_environment", False, 1, {"chain.mismatch"}, {"chain.agree": "fail"}),
    "custom_build_record_for_another_image": (
        _chain(_custom(build=True), _set("accept.startup.image", "registry.example.internal/ml/other:2026-10")),
        "rebuild_environment", False, 1, {"chain.mismatch"}, {}),
    "custom_build_digest_mismatch": (_custom(build=True, digest=OTHER), "rebuild_environment", False, 1,
                                     {"chain.mismatch"}, {"build.digest": "fail"}),
    "change_night_rolled_back": (_change(False, {"gpu-b01": "upgraded", "gpu-b02": "rolled_back"},
                                         "2026-11-30T08:00:00+00:00"),
                                 "rebuild_environment", False, 1, {"change.incomplete"}, {}),
    "change_check_only_after_audit": (_change(True, {"gpu-b01": "not_started"}, "2026-11-30T11:00:00+00:00"),
                                      "go_live", True, 0, {"all.pass"}, {"hosts.driver_branch": "pass"}),
    "pasted_capture_driver_too_old": (_triage("driver.branch", chain=True), "rebuild_environment", False, 1,
                                      {"chain.mismatch"}, {"hosts.driver_branch": "fail"}),
    "load_ceiling_not_recorded": (_set("accept.load.outcome", "ceiling"), "observe_with_limits", True, 0,
                                  {"load.ceiling"}, {}),
}

# Missing evidence: never a pass. name -> (mutation, items that must be missing)
MISSING: dict[str, tuple[Callable[[EvidenceSummary], None], set[str]]] = {
    "no_audit": (_set("audit", None), {"hosts.driver_branch", "chain.agree", "topology.parallel"}),
    "no_acceptance_run": (_set("accept", None), {"image.tag_digest", "vllm.version_channel", "chain.agree",
                                                 "topology.parallel", "startup.model_load_memory", "load.long_input",
                                                 "load.agent_queue", "load.no_termination", "prefix_cache.cold",
                                                 "prefix_cache.warm", "agent.tool_schema", "agent.client_contract",
                                                 "agent.retry"}),
    "no_cuda_anywhere": (_chain(_set("accept.startup.cuda_version", None),
                                lambda s: [setattr(h, "image_cuda", None) for h in s.audit.hosts]),  # type: ignore
                         {"container.cuda13"}),
    "no_startup": (_set("accept.startup", None), {"image.tag_digest", "vllm.version_channel", "chain.agree",
                                                  "topology.parallel", "startup.model_load_memory"}),
    "startup_without_digest": (_set("accept.startup.image_digest", None), {"image.tag_digest", "chain.agree"}),
    "startup_inconclusive": (_set("accept.startup.status", "inconclusive"), {"startup.model_load_memory"}),
    "no_parallel_sizes": (_set("accept.startup.tensor_parallel_size", None), {"topology.parallel"}),
    "no_prefix_cache": (_set("accept.prefix_cache", None), {"prefix_cache.cold", "prefix_cache.warm"}),
    "prefix_cache_inconclusive": (_chain(_set("accept.prefix_cache.status", "inconclusive"),
                                         _set("accept.prefix_cache.controlled_reuse", None)), {"prefix_cache.warm"}),
    "no_cold_window": (_set("accept.prefix_cache.cold_saved", False), {"prefix_cache.cold"}),
    "no_agent": (_set("accept.agent", None), {"agent.tool_schema", "agent.client_contract", "agent.retry"}),
    "no_retry_case": (lambda s: setattr(_acc(s).agent, "cases", [c for c in _acc(s).agent.cases  # type: ignore
                                                                  if "retry" not in c.name]), {"agent.retry"}),
    "no_load": (_set("accept.load", None), {"load.long_input", "load.agent_queue", "load.no_termination"}),
    "no_long_input_params": (_set("accept.load.request_params_saved", False), {"load.long_input"}),
    "no_queue_curves": (_set("accept.load.queue_latency_saved", False), {"load.agent_queue"}),
    "no_sustained_phase": (_set("accept.load.phases", ["agent_ramp", "long_input"]), {"load.no_termination"}),
    "restarts_not_counted": (_set("accept.load.restarts", None), {"load.no_termination"}),
    "no_reviewer": (_set("reviewer", None), {"signoff.reviewer"}),
    "custom_image_without_build_record": (_custom(build=False), {"build.source_branch", "build.commit",
                                                                  "build.lockfile", "build.command", "build.digest",
                                                                  "build.rollback_image"}),
    "failed_item_without_owner": (_fail_case("one_required_argument", 1), {"owners.failed_items"}),
    "no_rollback_owner": (_set("rollback_owner", None), {"signoff.rollback_owner"}),
    "audit_older_than_change_night": (_change(False, {"gpu-b01": "upgraded", "gpu-b02": "upgraded"},
                                              "2026-11-30T11:00:00+00:00"), {"hosts.driver_branch"}),
    "audit_interrupted": (_set("audit.interrupted", True), {"hosts.driver_branch"}),
    "profile_without_data_protection": (_set("profile.data_protection", None), {"data.retention", "data.access"}),
    "no_launch_command": (_set("accept.startup.launch_command", None), {"data.logging_scope"}),
    "request_logging_on_without_data_protection": (
        _chain(_set("accept.startup.launch_command", "vllm serve moonshotai/Kimi-K3 --enable-log-requests"),
               _set("profile.data_protection", None)), {"data.logging_scope", "data.retention", "data.access"}),
    "vllm_version_unknown_without_log_flags": (_set("accept.startup.vllm_version", None), {"data.logging_scope"}),
    "driver_unknown_on_a_host": (lambda s: setattr(s.audit.hosts[0], "branch", None),  # type: ignore[union-attr]
                                 {"hosts.driver_branch"}),
}


def _apply(mut: Callable[[EvidenceSummary], None] | None) -> EvidenceSummary:
    s = healthy()
    if mut is not None:
        mut(s)
    return EvidenceSummary.model_validate(s.model_dump())


@pytest.mark.parametrize("name", sorted(CASES))
def test_decision_table(name: str) -> None:
    mut, outcome, approved, code, rules, items = CASES[name]
    d = decide(_apply(mut))
    fired = {r.rule for r in d.reasons}
    assert d.outcome == outcome, (d.outcome, [r.text for r in d.reasons])
    assert d.approved is approved
    assert d.exit_code == code
    assert rules <= fired, (rules, fired)
    status = {i.id: i.status for i in d.checklist}
    for item, want in items.items():
        assert status[item] == want, (item, status[item], [i.detail for i in d.checklist if i.id == item])
    for r in d.reasons:
        if r.rule not in ("all.pass",):
            assert (r.text and r.evidence) or r.rule == "evidence.missing", r
    if approved:
        assert d.baseline is not None and d.baseline.image_digest == DIGEST
        assert not d.missing
    else:
        assert d.baseline is None


@pytest.mark.parametrize("name", sorted(MISSING))
def test_missing_evidence_is_never_a_pass(name: str) -> None:
    mut, missing = MISSING[name]
    d = decide(_apply(mut))
    assert d.outcome != "go_live"
    assert not d.approved
    assert missing <= set(d.missing), (missing, d.missing)
    assert d.exit_code in (1, 3)
    texts = [r.text for r in d.reasons if r.rule == "evidence.missing"]
    for item in missing:
        title = next(i.title for i in d.checklist if i.id == item)
        assert any(title in t for t in texts), (item, texts)


def test_missing_evidence_alone_exits_3_and_a_definite_failure_wins() -> None:
    only_missing = decide(_apply(_set("accept.load", None)))
    assert (only_missing.outcome, only_missing.exit_code) == ("observe_with_limits", 3)
    both = decide(_apply(_chain(_set("accept.load", None), _audit_finding("driver.branch"))))
    assert (both.outcome, both.exit_code) == ("rebuild_environment", 1)


def test_every_rule_and_every_item_is_exercised_by_the_table() -> None:
    fired: set[str] = set()
    for mut, *_ in CASES.values():
        fired |= {r.rule for r in decide(_apply(mut)).reasons}
    for mut, _ in MISSING.values():
        fired |= {r.rule for r in decide(_apply(mut)).reasons}
    assert {r.id for r in RULES} - {"checklist.failed"} <= fired
    missing_items = set().union(*(m for _, m in MISSING.values()))
    assert set(ITEM_IDS) | {"owners.failed_items", "signoff.reviewer"} <= missing_items


def test_a_failed_item_no_rule_explains_still_blocks_approval(monkeypatch: pytest.MonkeyPatch) -> None:
    from k3fleet.decide import checklist

    extra = checklist._Item("new.item", "A future item", "common",
                            lambda s: ("fail", "measured and failed", [_ref("accept-1", "new.json")]))
    monkeypatch.setattr(checklist, "ITEMS", (*checklist.ITEMS, extra))
    d = decide(_apply(None))
    assert not d.approved and d.exit_code == 1
    # The failed item also needs an owner (missing), but the failure itself is what stops approval.
    assert [r.rule for r in d.reasons] == ["checklist.failed", "evidence.missing"]
    assert d.reasons[0].evidence == [_ref("accept-1", "new.json")]
    assert d.missing == ["owners.failed_items"]


def test_outcome_precedence_rebuild_over_capacity_over_limits() -> None:
    d = decide(_apply(_chain(_set("accept.load.outcome", "collapse"), _set("accept.startup.vllm_version", "0.26.0"),
                             _set("accept.load.ceiling", 8))))
    assert d.outcome == "rebuild_environment"
    assert {"chain.mismatch", "load.collapse"} <= {r.rule for r in d.reasons}


def test_ceiling_is_named_and_becomes_the_baseline_envelope() -> None:
    d = decide(_apply(_chain(_set("accept.load.outcome", "ceiling"), _set("accept.load.ceiling", 96),
                             _set("accept.load.held_concurrency", 96))))
    assert [(lim.kind, lim.value) for lim in d.limits] == [("concurrency_ceiling", "96")]
    assert "96 concurrent" in next(r.text for r in d.reasons if r.rule == "load.ceiling")
    assert d.baseline is not None and d.baseline.concurrency_ceiling == 96
    assert d.baseline.parsers == {"tool_call_parser": "kimi_k3", "reasoning_parser": "kimi_k3"}
    assert d.baseline.runtime_env == {"NCCL_IB_HCA": "mlx5_0"}
    assert d.baseline.parallel["world_size"] == 16


def test_bounded_defect_limit_carries_rate_limit_owner_and_documentation() -> None:
    d = decide(_apply(_chain(_fail_case("nested_arguments", 1, {"empty_tool_calls": 1}),
                             _owners(**{"agent.tool_schema": OWNER_LIMITED}))))
    lim = next(lim for lim in d.limits if lim.kind == "rate_limit")
    assert lim.owner == "dana" and "20 tool turns/min" in lim.text and "known-issues" in lim.text
    item = next(i for i in d.checklist if i.id == "agent.tool_schema")
    assert item.owner is not None and item.owner.rollback == "pin the baseline image"


def test_official_and_custom_tracks_are_separate_items() -> None:
    official = {i.id: i.track for i in build_checklist(_apply(None))}
    custom = {i.id: i.track for i in build_checklist(_apply(_custom(build=True)))}
    assert not any(k.startswith("build.") for k in official)
    assert {k for k, t in custom.items() if t == "custom"} == {i for i in ITEM_IDS if i.startswith("build.")}
    d = decide(_apply(_custom(build=True)))
    assert d.track == "custom" and d.baseline is not None
    assert d.baseline.rollback_image == "vllm/vllm-openai:kimi-k3@" + DIGEST
    channel = next(i for i in d.checklist if i.id == "vllm.version_channel")
    assert "custom build of k3 at 0123abcd4567" in channel.detail


def test_operator_supplied_evidence_is_marked_in_reasons() -> None:
    d = decide(_apply(_triage("driver.branch", chain=True)))
    refs = [e for r in d.reasons if r.rule == "chain.mismatch" for e in r.evidence]
    assert any(e.operator_supplied and "operator-supplied" in str(e) for e in refs)


def test_decide_is_pure_same_summary_same_decision() -> None:
    s = _apply(_chain(_set("accept.load.outcome", "ceiling"), _set("accept.load.ceiling", 32)))
    before = s.model_dump_json()
    assert decide(s).model_dump() == decide(s).model_dump()
    assert s.model_dump_json() == before


def test_triaged_host_outside_the_audit_is_said_never_counted_silently() -> None:
    s = _apply(_triage("driver.branch", chain=True))
    assert s.audit is not None and "gpu-x01" not in {h.host for h in s.audit.hosts}
    d = decide(s)
    assert d.warnings == [f"triaged host 'gpu-x01' (run triage-1) is not in the audit {s.audit.run}: its findings are "
                          "counted as operator-supplied evidence about a host the audit did not see"]
    chain = next(r for r in d.reasons if r.rule == "chain.mismatch")
    assert "gpu-x01 (triaged, not in the audit)" in chain.text


def test_triaged_host_in_the_audit_gives_no_warning() -> None:
    s = _apply(_triage("driver.branch", chain=True))
    assert s.audit is not None and s.audit.hosts
    host = s.audit.hosts[0].host
    s.triage[0].host = host
    assert decide(s).warnings == []


def test_go_live_records_the_rollback_owner_the_rate_limits_and_the_people() -> None:
    d = decide(_apply(_set("second_reviewer", "frank")))
    assert (d.outcome, d.rollback_owner, d.second_reviewer, d.operators) == ("go_live", "erin", "frank", ["alice"])
    assert d.rate_limits == ["at most 64 concurrent requests and 131072 context tokens (the production profile "
                             "'prod agents')", "600 requests/min per tenant"]
    assert d.profile is not None and d.unproven == []


def test_every_limit_carries_its_owner_deadline_and_rollback() -> None:
    d = decide(_apply(_chain(_set("accept.load.outcome", "collapse"), _set("accept.load.failed_concurrency", 128))))
    lim = next(lim for lim in d.limits if lim.kind == "concurrency_ceiling")
    assert (lim.value, lim.owner, lim.rollback) == ("64", "dana", "pin the baseline image")
    assert "collapses at 128" in lim.text and d.rate_limits[0] == lim.text
    bare = decide(_apply(_chain(_set("accept.load.outcome", "collapse"), _set("accept.load.failed_concurrency", 128),
                                _set("owners", None))))
    unowned = next(r for r in bare.reasons if r.rule == "limits.unowned")
    assert "concurrency_ceiling" in unowned.text and "no deadline, rollback" in unowned.text
    assert not bare.approved and bare.exit_code == 3


def test_without_a_profile_the_decision_names_what_is_unproven() -> None:
    d = decide(_apply(_set("profile", None)))
    assert d.outcome == "observe_with_limits" and d.outcome != "go_live"
    assert any("production concurrency (tested: 64)" in u for u in d.unproven)
    lim = next(lim for lim in d.limits if lim.kind == "tested_envelope")
    assert lim.value == "64 concurrent, 65536-token context, 60 s sustained"


def test_each_envelope_gap_is_named() -> None:
    d = decide(_apply(_chain(_set("accept.load.held_concurrency", 4), _set("accept.load.sustained_concurrency", 4),
                             _set("accept.load.held_context", 16384), _set("accept.load.sustained_s", 6.0))))
    gaps = [r.text for r in d.reasons if r.rule == "envelope.gap"]
    assert any("held 4 concurrent sessions, the profile peaks at 64" in g for g in gaps), gaps
    assert any("held 16384 tokens, the profile's p99 is 65536" in g for g in gaps), gaps
    assert any("6 s at 4 concurrent, the profile sustains 64 for 60 s" in g for g in gaps), gaps
    assert d.unproven == [g.split(": ", 1)[1] for g in gaps]


def test_the_served_image_is_compared_with_the_build_record() -> None:
    d = decide(_apply(_chain(_custom(build=True), _set("accept.startup.image", "vllm/vllm-openai:kimi-k3"))))
    text = next(r.text for r in d.reasons if "build record is for" in r.text)
    assert "vllm/vllm-openai:kimi-k3 (the official image)" in text and d.track == "custom"


def test_a_topology_oom_is_a_rebuild_that_cites_the_record_never_capacity() -> None:
    d = decide(_apply(_oom(True)))
    fired = {r.rule for r in d.reasons}
    assert "load.collapse" not in fired and "capacity.short" not in fired and d.outcome == "rebuild_environment"
    text = next(r.text for r in d.reasons if r.rule == "load.topology_oom")
    for part in ("node gpu-b01", "engine 1", "41.5 s into the load run", "agent_ramp 32 sessions",
                 "engine 0 0.41, engine 1 0.97", "ended at 40.9 s (id chatcmpl-0)", "data-parallel ranks",
                 "--all2all-backend", "expert placement"):
        assert part in text, (part, text)
    # Above the profile a topology OOM is still the placement's fault, not a limit to document.
    above = decide(_apply(_oom(True, failed=128)))
    assert "load.limit_above_profile" not in {r.rule for r in above.reasons} and not above.limits


def test_the_reader_takes_the_oom_records_the_load_probe_writes(tmp_path: Path) -> None:
    """load.json's oom_records, as k3fleet/accept/oom.py builds them, reach the decision."""
    from k3fleet.accept.load import Shot
    from k3fleet.accept.oom import oom_records
    from k3fleet.accept.result import ProbeResult
    from k3fleet.decide.readers import _load_evidence
    from k3fleet.evidence.reader import RunReader

    def shot(t: float, ok: bool, rid: str | None = None) -> Shot:
        return Shot(phase="sustained", step="4 sessions", concurrency=4, context_tokens=None, t=t, ok=ok,
                    kind=None if ok else "http_5xx", message=None if ok else "CUDA out of memory", e2e=0.5, rid=rid)

    samples = [{"t_s": 2.8, "kv_usage": 0.98, "kv_by_engine": {"0": 0.98, "1": 0.3}}]
    records = oom_records([shot(1.0, True, "chatcmpl-7"), shot(3.0, False)], samples, "http://gpu-m01:8000")
    ref = _ref("accept-1", "load.json")
    result = ProbeResult(probe="load", status="fail", reason="OOM", data={"outcome": "collapse",
                                                                          "oom_records": records})
    ld = _load_evidence(RunReader(tmp_path, "accept-1"), result, ref)
    assert [(r.node, r.engine, r.t_s, r.last_success_t_s, r.last_success_id, r.topology) for r in ld.oom_records] \
        == [("gpu-m01", "0", 3.0, 1.5, "chatcmpl-7", True)]
    bad = ProbeResult(probe="load", status="fail", reason="OOM", data={"oom_records": [{"t_s": "soon"}]})
    with pytest.raises(UsageError, match=r"load.json: data.oom_records.0.t_s"):
        _load_evidence(RunReader(tmp_path, "accept-1"), bad, ref)


def test_the_profile_rate_needs_an_slo_search_that_reaches_it() -> None:
    # The profile peaks at 20 requests/s: no search is a gap, a search that found 12 is a gap, 24 covers it.
    def rated(s: EvidenceSummary) -> EvidenceSummary:
        assert s.profile is not None
        s.profile.request_rate_rps = 20.0
        return s
    none = decide(_apply(_chain(rated, _set("accept.load.held_rps", 8.0))))
    gaps = [r.text for r in none.reasons if r.rule == "envelope.gap"]
    assert any("no SLO search found the highest rate within the SLO (held 8 requests/s), the profile peaks at 20"
               in g for g in gaps), gaps
    low = decide(_apply(_chain(rated, _set("accept.load.slo_rps", 12.0))))
    assert any("goodput meets the SLO up to 12 requests/s, the profile peaks at 20" in r.text for r in low.reasons)
    ok = decide(_apply(_chain(rated, _set("accept.load.slo_rps", 24.0), _set("accept.load.rate_margin", 0.2))))
    assert not [r for r in ok.reasons if r.rule == "envelope.gap"] and ok.outcome == "go_live"
    tested = envelope_text(_acc(_apply(_set("accept.load.slo_rps", 24.0))).load)
    assert "24 requests/s within the SLO (open loop)" in tested


@pytest.mark.parametrize("outcome_mut", [None, _set("profile", None)])
def test_an_unsigned_decision_the_evidence_would_approve_is_a_draft(outcome_mut: Any) -> None:
    """"A reviewer has signed the final go-live outcome": unsigned, go_live is a draft, exit 3."""
    s = _apply(outcome_mut)
    signed = decide(s)
    s.signed = False
    draft = decide(s)
    if signed.approved:
        assert not draft.approved and draft.draft and draft.exit_code == 3, draft
        assert draft.outcome == signed.outcome
        assert draft.reasons[-1].rule == "signoff.unsigned" and "--sign-key" in draft.reasons[-1].text
        assert draft.baseline is None and draft.rate_limits == []
    else:  # not approved anyway: never called a draft, the exit unchanged
        assert not draft.draft and draft.exit_code == signed.exit_code


def test_an_interval_that_crosses_the_profile_limit_is_a_gap() -> None:
    # The healthy evidence's mean held (64 concurrent, TTFT within 2 s) but over 5 runs the intervals reach past.
    d = decide(_apply(_chain(_set("accept.load.repeats", 5),
                             _set("accept.load.intervals", {"held_concurrency": [48.0, 70.0],
                                                            "ttft_p95_s": [1.2, 2.6], "itl_p95_s": [0.05, 0.08]}))))
    gaps = [r.text for r in d.reasons if r.rule == "envelope.gap"]
    assert any("held concurrency's 95% interval over 5 runs (48-70) reaches below the profile's 64" in g
               for g in gaps), gaps
    assert any("TTFT p95 95% interval over 5 runs (1.2-2.6 s) crosses the profile's 2 s" in g for g in gaps), gaps
    assert not any("inter-token" in g for g in gaps) and d.outcome != "go_live"
    inside = decide(_apply(_chain(_set("accept.load.repeats", 5),
                                  _set("accept.load.intervals", {"held_concurrency": [64.0, 64.0],
                                                                 "ttft_p95_s": [1.2, 1.8]}))))
    assert not [r for r in inside.reasons if r.rule == "envelope.gap"]
