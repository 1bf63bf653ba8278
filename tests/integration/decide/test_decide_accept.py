"""``k3fleet decide`` over real acceptance runs: ``k3fleet accept all`` against the vLLM simulator made
healthy, cache-less and defective, beside a real lab audit of the hosts that serve the image."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from decide_helpers import LAB_PROFILE, k3fleet, load_probe_ran

pytestmark = pytest.mark.integration

STARTUP_DIGEST = "4f6c3a9a1d0b8e2f7c5d9e1a3b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b2c"
LOAD_ITEMS = {"load.long_input", "load.agent_queue", "load.no_termination"}


def _decide(tmp: Path, *args: str, sign: Path | None = None, out: str = "d") -> tuple[int, dict[str, Any]]:
    signing = ["--sign-key", str(sign)] if sign is not None else []
    proc = k3fleet("decide", *args, "--reviewer", "carol", "--owner", "serving-team", "--out", str(tmp / out),
                   "--profile", str(LAB_PROFILE), "--rollback-owner", "erin", "--json", *signing)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_healthy_server_on_matched_hosts(matched_audit: Path, accept_run: Any, evidence_keys: Any,
                                        tmp_path: Path) -> None:
    """A run whose tested envelope covers the production profile: go_live, with the people, the rollback owner
    and the rate limits in force recorded; unsigned, the same evidence is a draft (exit 3), never approved."""
    run = accept_run("healthy")
    code, d = _decide(tmp_path, str(matched_audit), str(run), sign=evidence_keys.key)
    if load_probe_ran(run):
        draft_code, draft = _decide(tmp_path, str(matched_audit), str(run), out="draft")
        assert (draft_code, draft["outcome"], draft["approved"], draft["draft"]) == (3, "go_live", False, True)
        assert draft["baseline"] is None and draft["reasons"][-1]["rule"] == "signoff.unsigned"
    items = {i["id"]: i for i in d["checklist"]}
    for item in ("image.tag_digest", "vllm.version_channel", "container.cuda13", "hosts.driver_branch",
                 "chain.agree", "topology.parallel", "startup.model_load_memory", "prefix_cache.cold",
                 "prefix_cache.warm", "agent.tool_schema", "agent.client_contract", "agent.retry",
                 "owners.failed_items", "signoff.reviewer"):
        assert items[item]["status"] == "pass", (item, items[item]["detail"])
    assert items["prefix_cache.warm"]["evidence"][0]["file"] == "prefix_cache.json"
    if load_probe_ran(run):
        assert (code, d["outcome"], d["approved"]) == (0, "go_live", True), d["reasons"]
        assert d["rollback_owner"] == "erin" and d["profile"]["name"] == "lab simulator, small agent workload"
        assert "at most 4 concurrent requests (gateway)" in d["rate_limits"] and d["unproven"] == []
        assert d["operators"] and "carol" not in d["operators"]
        baseline = d["baseline"]
        assert baseline["image_digest"] == "sha256:" + STARTUP_DIGEST
        assert baseline["parallel"]["world_size"] == 16
    else:
        # The load probe is not in this build: its three items are missing, named, and nothing else.
        assert (code, d["outcome"], d["approved"]) == (3, "observe_with_limits", False)
        assert set(d["missing"]) == LOAD_ITEMS
        assert {r["rule"] for r in d["reasons"]} == {"evidence.missing"}


def test_caching_switched_off_on_the_server_is_no_approval(matched_audit: Path, accept_run: Any,
                                                          tmp_path: Path) -> None:
    run = accept_run("no-prefix-caching", prefix_caching=False)
    code, d = _decide(tmp_path, str(matched_audit), str(run))
    assert (code, d["outcome"], d["approved"]) == (1, "rebuild_environment", False)
    rules = {r["rule"] for r in d["reasons"]}
    # The launch command asks for --enable-prefix-caching, the server measures no reuse.
    assert {"prefix_cache.flag_without_reuse", "prefix_cache.off"} <= rules
    warm = next(i for i in d["checklist"] if i["id"] == "prefix_cache.warm")
    assert warm["status"] == "fail" and "caching is off" in warm["detail"]


def test_repeated_parser_failures_on_critical_paths_are_no_go_live(matched_audit: Path, accept_run: Any,
                                                                   tmp_path: Path) -> None:
    run = accept_run("defects", defects={"empty_tool_calls": 0.6})
    code, d = _decide(tmp_path, str(matched_audit), str(run))
    assert (code, d["outcome"], d["approved"]) == (1, "rebuild_environment", False)
    repeated = [r for r in d["reasons"] if r["rule"] == "agent.critical_repeated"]
    assert repeated and all("empty_tool_calls" in r["text"] and "(critical path)" in r["text"] for r in repeated)
    assert all(r["evidence"][0]["file"] == "agent.json" for r in repeated)


def test_hosts_and_server_on_different_builds_must_rebuild(healthy_audit: Path, accept_run: Any,
                                                           tmp_path: Path) -> None:
    # The default lab hosts hold another digest of the same tag than the server started.
    code, d = _decide(tmp_path, str(healthy_audit), str(accept_run("healthy")))
    assert (code, d["outcome"]) == (1, "rebuild_environment")
    chain = [r["text"] for r in d["reasons"] if r["rule"] == "chain.mismatch"]
    assert any("the server started sha256:4f6c3a9a" in t for t in chain), chain


@pytest.mark.parametrize(("name", "knobs", "load", "outcome", "rule"), [
    # tests/unit/test_accept_load.py's small and crashing servers, through accept all: below the lab profile's
    # 4 concurrent sessions, the SLO breaks or the server dies.
    ("small", {"itl_ms": 8.0, "max_num_seqs": 2}, {"ramp": [1, 2, 4, 8], "ttft_p95_slo_s": 0.25,
                                                   "turn_output_tokens": 32}, "expand_capacity", "load.below_profile"),
    ("crashing", {"itl_ms": 3.0, "kv_blocks": 512, "max_model_len": 4096, "crash_above_kv": 0.5},
     {"ramp": [1, 4, 16], "turn_output_tokens": 64}, "expand_capacity", "load.collapse"),
    # A deliberately oversized step (64 sessions) kills the server; the profile's 4 held: a documented limit.
    ("oversized", {"kv_blocks": 2048, "max_model_len": 4096, "crash_above_kv": 0.5},
     {"ramp": [1, 2, 4, 64], "turn_output_tokens": 24}, "observe_with_limits", "load.limit_above_profile"),
])
def test_load_outcomes(name: str, knobs: dict[str, Any], load: dict[str, Any], outcome: str, rule: str,
                       matched_audit: Path, accept_run: Any, limit_owners: Path, tmp_path: Path) -> None:
    if not load_probe_ran(accept_run("healthy")):
        pytest.skip("the load probe is not in this build: accept all reports it as not run")
    run = accept_run(name, load=load, skip=("prefix_cache", "agent"), **knobs)
    code, d = _decide(tmp_path, str(matched_audit), str(run), "--owners", str(limit_owners))
    assert d["outcome"] == outcome and rule in {r["rule"] for r in d["reasons"]}, d["reasons"]
    skipped = {"prefix_cache.cold", "prefix_cache.warm", "agent.tool_schema", "agent.client_contract", "agent.retry"}
    if outcome == "expand_capacity":
        assert code == 1 and not d["approved"]
    else:
        # Not expand_capacity: the limit is named with its owner; the sustained run that the collapse stopped
        # and the probes left out are gaps, so it is not approved yet.
        assert code == 3 and not d["approved"] and set(d["missing"]) == skipped | {"load.no_termination"}
        assert "expand_capacity" not in {r["outcome"] for r in d["reasons"]}
        assert [(lim["kind"], lim["value"], lim["owner"]) for lim in d["limits"]] == [
            ("concurrency_ceiling", "4", "dana")]
        assert any(r["rule"] == "envelope.gap" and "sustained" in r["text"] for r in d["reasons"])


def test_the_operator_of_the_evidence_cannot_be_its_reviewer(matched_audit: Path, accept_run: Any,
                                                             tmp_path: Path) -> None:
    """command.json records who ran each run; that person reviewing it is one person, not two."""
    run = accept_run("healthy")
    operator = json.loads((run / "command.json").read_text())["user"]
    proc = k3fleet("decide", str(matched_audit), str(run), "--reviewer", operator, "--second-reviewer", "frank",
                   "--profile", str(LAB_PROFILE), "--rollback-owner", "erin", "--out", str(tmp_path / "d"), "--json")
    d = json.loads(proc.stdout)
    assert proc.returncode == 1 and not d["approved"], d["reasons"]
    same = [r for r in d["reasons"] if r["rule"] == "signoff.same_person"]
    assert same and f"the reviewer {operator!r} is also the operator of" in same[0]["text"]
    assert {"run": run.name, "file": "command.json", "operator_supplied": False} in same[0]["evidence"]
    assert d["second_reviewer"] == "frank" and operator in d["operators"]


def test_a_custom_build_record_beside_the_official_image_served(matched_audit: Path, accept_run: Any,
                                                                tmp_path: Path) -> None:
    """The build record's image is compared with the image the server started: the official image under a
    custom-track record is never go_live."""
    build = tmp_path / "build.yaml"
    build.write_text("image: registry.example.internal/ml/vllm-k3-cu129:2026-11\nsource_branch: k3\n"
                     "commit: 0123abcd4567ef89\nlockfile: uv.lock\nbuild_command: docker build .\n"
                     f"digest: sha256:{STARTUP_DIGEST}\nrollback_image: vllm/vllm-openai:kimi-k3\n")
    code, d = _decide(tmp_path, str(matched_audit), str(accept_run("healthy")), "--build", str(build))
    assert (code, d["outcome"], d["approved"], d["track"]) == (1, "rebuild_environment", False, "custom")
    chain = [r["text"] for r in d["reasons"] if r["rule"] == "chain.mismatch"]
    assert any("vllm/vllm-openai:kimi-k3 (the official image), the build record is for "
               "registry.example.internal/ml/vllm-k3-cu129:2026-11" in t for t in chain), chain
