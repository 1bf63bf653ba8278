"""One healthy evidence summary, the go_live baseline the decision tests change one thing in
(tests/unit/test_decide_rules.py drives the decision table from it; test_all2all.py reuses it)."""

from __future__ import annotations

import datetime as dt

from k3fleet.models.evidence import (
    AcceptEvidence,
    AgentCase,
    AgentEvidence,
    AuditEvidence,
    DataProtectionBrief,
    EvidenceSummary,
    HostEvidence,
    LoadEvidence,
    OwnerEntry,
    OwnersFile,
    PrefixCacheEvidence,
    ProfileBrief,
    Ref,
    RunInfo,
    StartupEvidence,
    TargetBrief,
)

DIGEST = "sha256:" + "93aead97" * 8
OTHER = "sha256:" + "0badc0de" * 8


def ref(run: str, file: str, op: bool = False) -> Ref:
    return Ref(run=run, file=file, operator_supplied=op)


# One server, as its start-up log names it and as the live probes saw it (k3fleet/accept/identity.py).
SERVER_IN_LOG = {"source": "start-up log", "vllm_version": "0.27.1", "model_root": "moonshotai/Kimi-K3",
                 "model_id": "moonshotai/Kimi-K3", "max_model_len": 131072, "prefix_caching": True,
                 "block_size": None, "host": "127.0.0.1", "port": 8000}
SERVER_LIVE = {"source": "endpoint", "vllm_version": "0.27.1", "model_root": "moonshotai/Kimi-K3",
               "model_id": "moonshotai/Kimi-K3", "max_model_len": 131072, "prefix_caching": True, "block_size": 16,
               "host": "127.0.0.1", "port": 8000}


def healthy() -> EvidenceSummary:
    """Every item in place: the go_live baseline each case changes one thing in."""
    audit_ref = ref("audit-1", "verdict.json")
    hosts = [HostEvidence(host=f"gpu-b0{i}", status="pass", driver_version="580.95.05", branch=580,
                          gpu_model="NVIDIA H200", gpu_count=8, image_ref="vllm/vllm-openai:kimi-k3",
                          image_digest=DIGEST, image_cuda="13.0.2", image_vllm="0.27.1") for i in (1, 2)]
    audit = AuditEvidence(run="audit-1", ref=audit_ref, started_at="2026-11-30T10:00:00+00:00", outcome="go_live",
                          reasons=["all 2 host(s) pass"], hosts=hosts, gpus_healthy=16, gpus_after_plan=16,
                          gpus_required=16, strategy="multi_node_tp_dp", rdma_required=True,
                          nccl={"NCCL_IB_HCA": "mlx5_0"})
    st_ref = ref("accept-1", "startup.json")
    startup = StartupEvidence(ref=st_ref, status="pass", vllm_version="0.27.1", image="vllm/vllm-openai:kimi-k3",
                              image_digest=DIGEST, cuda_version="13.0", torch_version="2.9.0",
                              tensor_parallel_size=8, data_parallel_size=2, expert_parallel_size=16,
                              max_model_len=131072, prefix_caching=True, tool_call_parser="kimi_k3",
                              reasoning_parser="kimi_k3", launch_command="vllm serve moonshotai/Kimi-K3 ...",
                              server=dict(SERVER_IN_LOG))
    pc = PrefixCacheEvidence(ref=ref("accept-1", "prefix_cache.json"), status="pass", cold_saved=True,
                             warm_saved=True, cache_metrics=True, controlled_reuse=True, caching_enabled=True,
                             hit_ratio=0.8, server=dict(SERVER_LIVE))
    agent_ref = ref("accept-1", "agent.json")
    cases = [AgentCase(name=n, runs=20, passed=20, pass_rate=1.0, critical=c) for n, c in (
        ("one_required_argument", True), ("nested_arguments", False), ("structured_output", False),
        ("stream_tool_call_deltas", True), ("client_contract", True), ("timeout_retry", True),
        ("tool:get_gpu_health", True), ("schema:incident_summary", True), ("invalid_schema", True),
        ("multimodal", True))]
    agent = AgentEvidence(ref=agent_ref, status="pass", cases=cases)
    load = LoadEvidence(ref=ref("accept-1", "load.json"), status="pass", outcome="stable",
                        envelope={"max_context_tokens": 65536, "max_concurrency": 64, "duration_s": 60},
                        phases=["agent_ramp", "long_input", "sustained"],
                        curves_ref=ref("accept-1", "load/curves.jsonl"), request_params_saved=True,
                        queue_latency_saved=True, restarts=0, health_failures=0, oom_events=0,
                        held_concurrency=64, held_context=65536, sustained_s=60.0, sustained_concurrency=64,
                        slo={"ttft_p95_s": 2.0, "itl_p95_s": 0.1, "error_rate": 0.01})
    target = TargetBrief(name="kimi-k3", image="vllm/vllm-openai:kimi-k3", image_repository="vllm/vllm-openai",
                         image_cuda="13.0", vllm_min="0.27.1", driver_branch=580, gpus_per_node=8,
                         required_flags={"--enable-prefix-caching": None, "--tool-call-parser": "kimi_k3"})
    return EvidenceSummary(target=target, audit=audit,
                           accept=AcceptEvidence(run="accept-1", base_url="http://127.0.0.1:8000",
                                                 model="moonshotai/Kimi-K3", startup=startup, prefix_cache=pc,
                                                 agent=agent, load=load),
                           reviewer="carol", reviewed_at="2026-11-30T12:00:00+00:00", service_owner="serving-team",
                           rollback_owner="erin", profile=PROFILE.model_copy(deep=True), signed=True,
                           runs=[RunInfo(label="accept-1", kind="accept", path="/runs/accept-1", user="alice"),
                                 RunInfo(label="audit-1", kind="audit", path="/runs/audit-1", user="alice")],
                           owners=OwnersFile(limits={k: OwnerEntry(**LIMIT_OWNER) for k in LIMIT_KINDS}),
                           owners_ref=ref("decision", "inputs/owners.yaml"))


# The production profile the healthy evidence covers (docs/decision.md "The production profile").
PROFILE = ProfileBrief(name="prod agents", concurrency=64, context_typical=8192, context_p99=65536, context_max=131072,
                       sustained_s=60.0, mix={"tools": 0.6, "structured_output": 0.1, "streaming": 0.9,
                                              "multimodal": 0.05},
                       slo={"ttft_p95_s": 2.0, "itl_p95_s": 0.1, "error_rate": 0.01}, tools=["get_gpu_health"],
                       schemas=["incident_summary"], rate_limits=["600 requests/min per tenant"],
                       data_protection=DataProtectionBrief(log_retention_days=14, run_retention_days=30,
                                                           evidence_readers=["sre-oncall", "serving-team"]),
                       ref=ref("decision", "inputs/profile.yaml"))
LIMIT_OWNER = {"owner": "dana", "deadline": dt.date(2026, 12, 15), "rollback": "pin the baseline image"}
LIMIT_KINDS = ("concurrency_ceiling", "max_context_tokens", "rate_limit", "hosts_left_out", "retry",
               "tested_envelope")
