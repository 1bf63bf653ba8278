"""The NCCL pair test of audit --active full (docs/facts.md section 17): the ring schedule, who is
eligible, the launcher's command line, the node side on lab hosts, and how each node is judged.

The bandwidths are the recorded two-node runs in k3fleet/lab/active_data (SOURCES.md names each one's
public source): 338.82 GB/s (GitHub lessizzmore/create-a3mega-ztan-fork, ztan-NCCL-test-result) and
44.27 GB/s (GitHub NVIDIA/nccl-tests issue 319). Against the default target's 368 GB/s floor both are
low; the judging tables use a target whose floor (300 GB/s) sits between them, as the lab's pair fleet
does, so one stands for a good pair and the other for a low one.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args
from nodetree import ExitJson, FailJson
from pydantic import ValidationError

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import (
    collect_node,
    collect_pair,
    parse_all_reduce_perf,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_KEY
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import nccl_pair_argv
from ansible_collections.k3fleet.gpu.plugins.modules import k3fleet_nccl_pair_info
from k3fleet.audit.run import active_spec
from k3fleet.lab.fleet import default_image, expand_hosts, generate_fleet, load_fleet
from k3fleet.models.findings import Finding
from k3fleet.models.pairs import PairRun
from k3fleet.models.target import ActiveSpec
from k3fleet.targets import load_target
from k3fleet.verdict import evaluate_fleet, validate_facts
from k3fleet.verdict.pairs import CHECK, judge_pairs, max_bytes_of, plan_pairs, ring_rounds

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "k3fleet" / "lab" / "active_data"
GOOD = parse_all_reduce_perf((DATA / "all_reduce_perf_h100_2nodes_16ranks.txt").read_text())
LOW = parse_all_reduce_perf((DATA / "all_reduce_perf_h100_2nodes_16ranks_low_excerpt.txt").read_text())
MODEL = "NVIDIA H200"


def lab_target(floor: float = 300.0) -> Any:
    """The default target with the lab's floors, pair and within the node (docs/facts.md section 17, "The
    lab"), below the recorded 338.82 GB/s run."""
    t = load_target(None)
    active = t.active.model_copy(update={"nccl_pair_busbw_min_gbs": {MODEL: floor},
                                         "nccl_busbw_min_gbs": {MODEL: floor}})
    return t.model_copy(update={"active": active})


def test_the_two_node_recordings_parse() -> None:
    assert GOOD["ranks"] == 16 and GOOD["peak_busbw_gbs"] == 338.82 and GOOD["max_bytes"] == 8589934592
    # An excerpt without the rank lines: its largest message (16 GiB) and the busbw there.
    assert LOW == {"ranks": None, "sizes": 10, "wrong": 0, "max_bytes": 17179869184, "peak_busbw_gbs": 44.27,
                   "avg_busbw_gbs": 20.017, "out_of_bounds": 0, "transport": None}


# -- the schedule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "rounds"), [
    (0, []),
    (1, []),
    (2, [[(0, 1)]]),
    (3, [[(0, 1)], [(1, 2)], [(2, 0)]]),
    (4, [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]),
    (5, [[(0, 1), (2, 3)], [(1, 2), (3, 4)], [(4, 0)]]),
    (6, [[(0, 1), (2, 3), (4, 5)], [(1, 2), (3, 4), (5, 0)]]),
])
def test_ring_rounds(n: int, rounds: list[list[tuple[int, int]]]) -> None:
    hosts = [f"h{i}" for i in range(n)]
    assert ring_rounds(hosts) == [[(hosts[a], hosts[b]) for a, b in r] for r in rounds]


@pytest.mark.parametrize("n", [3, 4, 5, 7, 8, 9, 16, 33])
def test_every_node_is_in_two_pairs_and_never_two_at_once(n: int) -> None:
    hosts = [f"h{i:02d}" for i in range(n)]
    rounds = ring_rounds(hosts)
    assert len(rounds) == (3 if n % 2 else 2)
    for r in rounds:
        busy = [h for pair in r for h in pair]
        assert len(busy) == len(set(busy))
    seen = Counter(h for r in rounds for pair in r for h in pair)
    assert set(seen.values()) == {2} and set(seen) == set(hosts)
    edges = {frozenset(p) for r in rounds for p in r}
    assert edges == {frozenset((hosts[i], hosts[(i + 1) % n])) for i in range(n)}


# -- the lab's pair fleet, collected in-process ----------------------------------------------------

FLEET = """description: pairs
hosts:
  p01: {profile: h200-r580-pair}
  p02: {profile: h200-r580-pair}
  p03: {profile: h200-r580-pair-low-link}
  p04: {profile: h200-r580-pair}
  p05: {profile: h200-r575-busy}
  p06: {profile: h200-r580}
  p07: {profile: b200-r580}
  p08: {profile: h200-r580, set: {infiniband: {hcas: 0}}}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    work = tmp_path_factory.mktemp("pairs")
    shutil.copytree(ROOT / "inventories" / "lab" / "profiles", work / "profiles")
    (work / "fleet.yaml").write_text(FLEET)
    fleet = load_fleet(work / "fleet.yaml")
    generate_fleet(fleet, work / "out")
    spec, _ = active_spec(load_target(None), "full")
    raw = {}
    for name, _host in expand_hosts(fleet, None):
        raw[name] = collect_host(_reader(work / "out", name), name, default_image(), use_nvml=False, probe=True,
                                 active="full", active_spec=spec)
    facts, invalid = validate_facts(raw, freeze=False)
    assert invalid == {}
    return work / "out", facts, spec


def _reader(lab_dir: Path, name: str) -> NodeReader:
    root = lab_dir / "hosts" / name
    return NodeReader(root=str(root), path=str(root / "bin"), timeout=10)


def test_plan_pairs_like_idle_nodes_and_says_why_the_others_are_not(lab: Any) -> None:
    _, facts, _ = lab
    plan = plan_pairs(facts)
    # p01-p04 and p06 are idle 8x H200 with rails: one ring of five, in name order.
    assert plan.rounds == [[("p01", "p02"), ("p03", "p04")], [("p02", "p03"), ("p04", "p06")], [("p06", "p01")]]
    assert plan.gpus["p01"] == 8 and plan.models["p01"] == MODEL
    # Reached at the hostname each node reported (the lab's is its inventory name).
    assert plan.addresses["p03"] == "p03"
    why = plan.not_paired
    assert set(why) == {"p05", "p07", "p08"}
    assert why["p05"].startswith("active checks did not run: GPU") and "gpu.in_use" in why["p05"]
    assert why["p07"] == "no other eligible node with 8x NVIDIA B200 to pair with"
    assert why["p08"] == "the node has no ACTIVE RDMA rail (rdma facts)"


def test_launcher_command_line() -> None:
    launcher = load_target(None).active.nccl_pair_launcher
    assert nccl_pair_argv(launcher, ["gpu-a", "gpu-b"], 8, "8G") == [
        "mpirun", "-H", "gpu-a:8,gpu-b:8", "-np", "16", "--bind-to", "none", "-x", "NCCL_ALGO=Ring",
        "-x", "PATH", "-x", "LD_LIBRARY_PATH", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"]
    assert max_bytes_of("8G") == GOOD["max_bytes"] == 8589934592


@pytest.mark.parametrize(("launcher", "words"), [
    (["mpirun", "-np", "{ranks}"], "{hosts}"),
    (["mpirun", "-H", "{hosts}", "{nodes}"], "unknown placeholder nodes"),
    (["mpirun", "-H", "{hosts"], "literal brace"),
    (["mpirun -H", "{hosts}"], "one list item each"),
    ([], "one list item each"),
])
def test_a_bad_launcher_is_refused_with_the_reason(launcher: list[str], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        ActiveSpec(nccl_pair_launcher=launcher)


def test_a_floor_must_be_above_zero() -> None:
    with pytest.raises(ValidationError, match="above 0 GB/s: NVIDIA H200"):
        ActiveSpec(nccl_pair_busbw_min_gbs={MODEL: 0})


def test_lab_pairs_print_the_recorded_runs(lab: Any) -> None:
    out, _, spec = lab
    good = collect_pair(_reader(out, "p01"), ["p01", "p02"], 8, spec)
    assert good["ran"] and good["rc"] == 0 and good["peak_busbw_gbs"] == GOOD["peak_busbw_gbs"] == 338.82
    assert good["ranks"] == 16
    # Either node's low link makes the pair low, whichever node launches.
    for a, b in (("p02", "p03"), ("p03", "p04")):
        low = collect_pair(_reader(out, a), [a, b], 8, spec)
        assert low["peak_busbw_gbs"] == LOW["peak_busbw_gbs"] == 44.27


def test_lab_pair_without_the_tools_is_reported_not_run(lab: Any) -> None:
    out, _, spec = lab
    # p06 has neither mpirun nor all_reduce_perf: nothing runs.
    here = collect_pair(_reader(out, "p06"), ["p06", "p01"], 8, spec)
    assert here == {"ran": False, "reason": "mpirun: command not found", "addresses": ["p06", "p01"], "gpus": 8}
    # Launched from p01, the launcher fails on the partner that lacks Open MPI.
    there = collect_pair(_reader(out, "p01"), ["p01", "p06"], 8, spec)
    assert there["ran"] and there["rc"] == 1 and there["peak_busbw_gbs"] is None
    assert "p06: orted: command not found" in there["reason"]


@pytest.mark.usefixtures("patched_exits")
def test_the_module_as_the_pair_play_runs_it(lab: Any) -> None:
    out, _, spec = lab
    root = out / "hosts" / "p01"
    args = {"addresses": ["p01", "p02"], "gpus": 8, "active_spec": spec, "root": str(root), "path": str(root / "bin")}
    with patch_module_args(args), pytest.raises(ExitJson) as done:
        k3fleet_nccl_pair_info.main()
    result = done.value.args[0]
    assert result["changed"] is False
    pair = result[RESULT_KEY]["pair"]
    assert pair["peak_busbw_gbs"] == 338.82 and pair["addresses"] == ["p01", "p02"]
    (cmd,) = result[RESULT_KEY]["commands"]
    assert cmd["argv"][:4] == ["mpirun", "-H", "p01:8,p02:8", "-np"] and cmd["rc"] == 0
    with patch_module_args({**args, "active_spec": {"nccl_max_bytes": "8G"}}), pytest.raises(FailJson) as bad:
        k3fleet_nccl_pair_info.main()
    assert "active_spec needs nccl_pair_launcher, nccl_max_bytes, nccl_timeout_s" in bad.value.args[0]["msg"]


@pytest.mark.parametrize(("addresses", "gpus"), [(["p01"], 8), (["p01", "p02,p03"], 8), (["p01", "-H"], 8),
                                                  (["p01", "p02"], 0)])
def test_a_bad_pair_runs_nothing(lab: Any, addresses: list[str], gpus: int) -> None:
    out, _, spec = lab
    reader = _reader(out, "p01")
    got = collect_pair(reader, addresses, gpus, spec)
    assert got["ran"] is False and got["reason"] and reader.commands == []


# -- judging -------------------------------------------------------------------------------------


def run(a: str, b: str, parsed: dict[str, Any] | None, k: int = 1, **over: Any) -> PairRun:
    """A pair's run with one of the recorded outputs (None: it did not run)."""
    base: dict[str, Any] = {"hosts": [a, b], "round": k, "gpus": 8, "gpu_model": MODEL}
    if parsed is None:
        return PairRun.model_validate({**base, "ran": False, "reason": "mpirun: command not found", **over})
    # The low excerpt has no rank lines; a 16-rank run either way (its NCCL line says nranks 16).
    return PairRun.model_validate({**base, "ran": True, "rc": 0, **parsed, **over})


def judged(runs: list[PairRun], target: Any = None, not_paired: dict[str, str] | None = None) -> tuple[
        dict[str, list[tuple[str, str]]], dict[str, list[Finding]]]:
    """(per node its findings' severity and kind, the findings)."""
    found = judge_pairs(runs, not_paired or {}, target if target is not None else lab_target())
    assert all(f.check_id == CHECK and f.fix for fs in found.values() for f in fs)
    return {h: [(f.severity, f.kind) for f in fs] for h, fs in found.items()}, found


def ring(hosts: list[str], low_edges: set[frozenset[str]]) -> list[PairRun]:
    return [run(a, b, LOW if frozenset((a, b)) in low_edges else GOOD, k)
            for k, r in enumerate(ring_rounds(hosts), 1) for a, b in r]


def test_a_node_in_two_low_pairs_fails_and_its_partners_are_explained() -> None:
    hosts = ["n1", "n2", "n3", "n4", "n5"]
    kinds, found = judged(ring(hosts, {frozenset(("n2", "n3")), frozenset(("n3", "n4"))}))
    assert kinds == {"n3": [("error", "fail")], "n2": [("info", "note")], "n4": [("info", "note")]}
    assert "2 of the node's pairs are below 300 GB/s (n4 44.27 GB/s; n2 44.27 GB/s)" in found["n3"][0].message
    assert "n3 is in 2 low pairs and is judged the cause" in found["n2"][0].message
    assert (found["n2"][0].fix or "").startswith("None on this node: n3's finding")


def test_a_low_pair_of_two_good_nodes_is_the_path_between_them() -> None:
    hosts = ["n1", "n2", "n3", "n4"]
    kinds, found = judged(ring(hosts, {frozenset(("n2", "n3"))}))
    assert kinds == {"n2": [("warning", "fail")], "n3": [("warning", "fail")]}
    assert "the path between the node and n3 is the suspect" in found["n2"][0].message
    assert "the path between the node and n2 is the suspect" in found["n3"][0].message


def test_two_nodes_cannot_be_told_apart() -> None:
    kinds, found = judged([run("n1", "n2", LOW)])
    assert kinds == {"n1": [("error", "fail")], "n2": [("error", "fail")]}
    assert "no other pair tells the node apart from its partner" in found["n1"][0].message
    # The same pair at the floor: nothing to report.
    assert judged([run("n1", "n2", GOOD)])[0] == {}


def test_a_low_node_whose_other_pair_is_unknown_fails_beside_a_good_partner() -> None:
    runs = [run("n1", "n2", GOOD, 1), run("n2", "n3", LOW, 2), run("n3", "n1", None, 3)]
    kinds, found = judged(runs)
    assert kinds == {"n3": [("error", "fail"), ("warning", "unknown")], "n2": [("info", "note")],
                     "n1": [("warning", "unknown")]}
    assert "and n2 reaches the floor with another node" in found["n3"][0].message
    assert "could not be judged: on n3: mpirun: command not found" in found["n1"][0].message


def test_wrong_results_fail_both_nodes() -> None:
    kinds, found = judged([run("n1", "n2", GOOD, wrong=3)])
    assert kinds == {"n1": [("error", "fail")], "n2": [("error", "fail")]}
    assert "reports wrong results (3 #wrong, 0 out of bounds)" in found["n2"][0].message


def test_every_pair_low_is_a_shared_cause() -> None:
    kinds, found = judged(ring(["n1", "n2", "n3", "n4"], set()), target=load_target(None))
    assert set(kinds) == {"n1", "n2", "n3", "n4"} and all(k == [("error", "fail")] for k in kinds.values())
    assert "every pair of the NVIDIA H200 nodes is below 368 GB/s" in found["n1"][0].message


@pytest.mark.parametrize(("over", "words"), [
    ({"ranks": 8}, "it ran 8 ranks, 16 expected"),
    ({"max_bytes": 1073741824}, "the run stopped at 1073741824 B of 8589934592 B"),
    ({"peak_busbw_gbs": None, "rc": 1, "reason": "mpirun: exit 1"}, "on n1: mpirun: exit 1"),
    ({"ran": True, "error": "timeout", "reason": "mpirun ...: timed out after 600.0s"}, "timed out after 600.0s"),
    ({"gpu_model": "NVIDIA L40S"}, "has no entry for NVIDIA L40S (measured 338.82 GB/s)"),
])
def test_a_pair_that_cannot_be_judged_is_unknown_on_both_nodes(over: dict[str, Any], words: str) -> None:
    kinds, found = judged([run("n1", "n2", GOOD, **over)])
    assert kinds == {"n1": [("warning", "unknown")], "n2": [("warning", "unknown")]}
    assert words in found["n2"][0].message


def test_a_node_not_paired_is_unknown() -> None:
    kinds, found = judged([], not_paired={"n9": "no other eligible node with 8x NVIDIA B200 to pair with"})
    assert kinds == {"n9": [("warning", "unknown")]}
    assert found["n9"][0].message.endswith("not paired: no other eligible node with 8x NVIDIA B200 to pair with")


def test_pair_findings_join_the_hosts_verdict(lab: Any) -> None:
    _, facts, _ = lab
    target = lab_target()
    plan = plan_pairs(facts)
    runs = [run(a, b, LOW if "p03" in (a, b) else GOOD, k) for k, r in enumerate(plan.rounds, 1) for a, b in r]
    extra = judge_pairs(runs, plan.not_paired, target)
    before = evaluate_fleet(facts, target, {})
    after = evaluate_fleet(facts, target, {}, extra=extra)
    assert before.hosts["p03"].status != "fail" and after.hosts["p03"].status == "fail"
    assert [f.message for f in after.hosts["p03"].findings if f.check_id == CHECK] == [
        extra["p03"][0].message]
    # The other nodes of p03's kind keep their own findings; the partners' notes leave them as they were.
    assert after.hosts["p01"].findings == before.hosts["p01"].findings
    assert after.hosts["p02"].status == before.hosts["p02"].status
    assert after.summary.failed == before.summary.failed + 1


# -- the change night's verify: the same module within the node, with the lines that decide a run --------


@pytest.mark.usefixtures("patched_exits")
def test_one_address_runs_all_reduce_perf_within_the_node_and_keeps_the_deciding_lines(lab: Any) -> None:
    out, _, spec = lab
    root = out / "hosts" / "p01"
    args = {"addresses": ["p01"], "gpus": 8, "active_spec": spec, "root": str(root), "path": str(root / "bin"),
            "log_lines": 3}
    with patch_module_args(args), pytest.raises(ExitJson) as done:
        k3fleet_nccl_pair_info.main()
    pair = done.value.args[0][RESULT_KEY]["pair"]
    (cmd,) = done.value.args[0][RESULT_KEY]["commands"]
    # The audit's within-node command line (every GPU in one process), no launcher.
    assert cmd["argv"] == ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8"] and cmd["rc"] == 0
    assert pair["ran"] and pair["gpus"] == 8 and pair["peak_busbw_gbs"] == 338.82 and pair["wrong"] == 0
    assert "# Avg bus bandwidth    : 70.742" in pair["log"]["decisive"] and len(pair["log"]["tail"]) == 3


def test_the_pair_keeps_its_log_only_when_asked(lab: Any) -> None:
    out, _, spec = lab
    low = collect_pair(_reader(out, "p02"), ["p02", "p03"], 8, spec, keep=4)
    assert low["peak_busbw_gbs"] == 44.27 and len(low["log"]["tail"]) == 4
    assert any("Using network IB" in line for line in low["log"]["decisive"])
    assert "log" not in collect_pair(_reader(out, "p01"), ["p01", "p02"], 8, spec)


def test_a_node_without_all_reduce_perf_or_a_gpu_count_runs_nothing(lab: Any) -> None:
    out, _, spec = lab
    reader = _reader(out, "p06")
    assert collect_node(reader, 8, spec, keep=5) == {"ran": False, "reason": "all_reduce_perf: command not found",
                                                     "gpus": 8}
    assert collect_node(reader, 0, spec)["ran"] is False and reader.commands == []
