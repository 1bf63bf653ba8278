"""IMEX on multi-node NVLink racks: the collector, its reading, the host check and the all-to-all judgement.

Fixture sources: tests/fixtures/imex/SOURCES.md (nvidia-imex-ctl -N, config.cfg, the node list) and
tests/fixtures/fabricmanager/SOURCES.md (the systemctl show blocks). The lab case renders GB200 NVL72 trays
(inventories/lab/profiles/gb200-nvl72-*.yaml) and reads them with the real collector.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nodetree
import pytest
from nodetree import fake_command

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_imex as imexc
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from k3fleet.lab.fleet import default_image
from k3fleet.lab.profile import ProfileLoader
from k3fleet.lab.render import ProfileRenderer
from k3fleet.lab.render.imex import CTL_TIMESTAMP
from k3fleet.models.facts import HostFacts, ImexFacts
from k3fleet.models.findings import InterconnectSummary
from k3fleet.models.target import Target
from k3fleet.paths import data_dir
from k3fleet.targets import load_target
from k3fleet.verdict import all2all
from k3fleet.verdict.fleet import evaluate_fleet
from k3fleet.verdict.imex import imex_state

_, fixture = nodetree.fixtures("imex")
_, fm_fixture = nodetree.fixtures("fabricmanager")
READY = fixture("nvidia_imex_ctl_N_18_ready.txt")
PEER_DOWN = fixture("nvidia_imex_ctl_N_peer_unavailable.txt")
DOWN = fixture("nvidia_imex_ctl_N_down.txt")
PROFILES = data_dir("inventories/lab") / "profiles"
DOMAIN = "00000001-0000-0000-0000-000000000001"


def _block(recorded: str, unit: str, imex_id: str = "nvidia-imex.service") -> str:
    """One unit's block of a recorded systemctl show, renamed to the IMEX unit (systemd's own format)."""
    block = next(b for b in recorded.strip().split("\n\n") if b.startswith(f"Id={unit}\n"))
    return block.replace(f"Id={unit}", f"Id={imex_id}", 1)


FM_FAILED = fm_fixture("systemctl_show_fm_failed.txt")
IMEX_ACTIVE = _block(FM_FAILED, "nvidia-persistenced.service")  # loaded, active, running, enabled
IMEX_FAILED = _block(FM_FAILED, "nvidia-fabricmanager.service")  # loaded, failed, failed, enabled
IMEX_NOT_FOUND = _block(FM_FAILED, "dnf-automatic.timer")  # not-found, inactive, dead


# -- parsers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "domain", "not_ready", "links"), [
    (READY, "UP", [], 0),
    (PEER_DOWN, "DEGRADED", [(5, "172.31.50.44", "UNAVAILABLE", None)], 35),
    (DOWN, "DOWN", [(i, None, "UNAVAILABLE", None) for i in range(18)], 18 * 18),
])
def test_imex_ctl_nodes_table(text: str, domain: str, not_ready: list[tuple[Any, ...]], links: int) -> None:
    got = imexc.parse_imex_ctl_nodes(text)
    assert got["domain_state"] == domain
    assert [n["index"] for n in got["nodes"]] == list(range(18))
    assert got["nodes"][0]["address"] == "172.31.48.81"
    bad = [n for n in got["nodes"] if n["status"] != "READY"]
    assert [(n["index"], n["status"], n["version"]) for n in bad] == [(i, s, v) for i, _, s, v in not_ready]
    for n, want in zip(bad, not_ready, strict=True):
        assert want[1] is None or n["address"] == want[1]
    assert got["links_not_connected_count"] == links
    assert len(got["links_not_connected"]) == min(links, imexc.MAX_LINKS)
    if text is READY:
        assert {n["version"] for n in got["nodes"]} == {"570.172"}
    if text is PEER_DOWN:
        assert "0->5 N" in got["links_not_connected"] and "5->0 I" in got["links_not_connected"]


def test_other_output_is_not_a_domain_status() -> None:
    with pytest.raises(ValueError, match="printed no node status"):
        imexc.parse_imex_ctl_nodes(fm_fixture("nv_fabricmanager_version.txt"))


def test_config_and_node_list() -> None:
    cfg = imexc.parse_config(fixture("config.cfg"))
    assert cfg["IMEX_NODE_CONFIG_FILE"] == "/etc/nvidia-imex/nodes_config.cfg"
    assert cfg["SERVER_PORT"] == "50000" and cfg["IMEX_CMD_PORT"] == "50005" and cfg["BIND_INTERFACE_IP"] == ""
    assert "Description" not in " ".join(cfg)
    assert imexc.parse_node_list(fixture("nodes_config.cfg")) == ["172.27.58.70", "172.27.58.71", "172.27.58.72",
                                                                  "172.27.58.73"]


# -- collector ---------------------------------------------------------------------------------------------


def imex_node(tmp_path: Path, unit: str | None, ctl: tuple[str, str, int] | None, files: bool = True,
              channels: list[str] | None = None) -> NodeReader:
    tree = {"/etc/nvidia-imex/config.cfg": fixture("config.cfg"),
            "/etc/nvidia-imex/nodes_config.cfg": fixture("nodes_config.cfg")} if files else {}
    reader = nodetree.node(tmp_path, tree)
    if channels is not None:
        chan = tmp_path / "root" / "dev" / "nvidia-caps-imex-channels"
        chan.mkdir(parents=True)
        for name in channels:
            (chan / name).write_text("", encoding="utf-8")
    if unit is None:
        fake_command(tmp_path / "bin", "systemctl", [("show*", "", fm_fixture("systemctl_show_no_systemd.stderr"), 1)])
    else:
        fake_command(tmp_path / "bin", "systemctl", [("show*", FM_FAILED.rstrip("\n") + "\n\n" + unit + "\n", "", 0)])
    if ctl is not None:
        fake_command(tmp_path / "bin", "nvidia-imex-ctl", [("-N", *ctl)])
    return reader


def collected(reader: NodeReader) -> dict[str, Any]:
    facts = imexc.collect_imex(reader)
    ImexFacts.model_validate(facts)
    return facts


def host_with(imex: dict[str, Any] | None, uuid: str = DOMAIN) -> HostFacts:
    gpus = [{"index": i, "fabric_state": "completed", "fabric_cluster_uuid": uuid, "fabric_clique_id": 32766}
            for i in range(4)]
    return HostFacts.model_validate({"host": "tray", "driver": {"status": "ok", "gpus": gpus}, "imex": imex})


def test_ready_node(tmp_path: Path) -> None:
    f = collected(imex_node(tmp_path, IMEX_ACTIVE, (READY, "", 0), channels=["channel0"]))
    assert f["status"] == "ok" and f["installed"] is True
    assert f["unit"] == {"installed": True, "active": "active", "enabled": "enabled"}
    assert f["config"]["IMEX_NODE_CONFIG_FILE"] == "/etc/nvidia-imex/nodes_config.cfg"
    assert f["nodes_file_present"] is True and len(f["node_list"]) == 4
    assert f["channels"] == [0] and f["domain_state"] == "UP" and len(f["nodes"]) == 18
    assert imex_state(host_with(f)).ready is True


@pytest.mark.parametrize(("unit", "ctl", "channels", "problem"), [
    # The daemon did not start: the unit failed, every node UNAVAILABLE, the domain DOWN.
    (IMEX_FAILED, (DOWN, "", 0), ["channel0"], "nvidia-imex.service is failed"),
    (IMEX_ACTIVE, (PEER_DOWN, "", 0), ["channel0"], "1 of 18 IMEX node(s) not READY (#5 172.31.50.44 UNAVAILABLE)"),
    (IMEX_ACTIVE, (READY, "", 0), [], "no IMEX channel0 (/dev/nvidia-caps-imex-channels/channel0)"),
])
def test_imex_not_ready(tmp_path: Path, unit: str, ctl: tuple[str, str, int], channels: list[str],
                        problem: str) -> None:
    f = collected(imex_node(tmp_path, unit, ctl, channels=channels))
    assert f["status"] == "ok"
    state = imex_state(host_with(f))
    assert state.ready is False
    assert problem in state.problems


def test_down_domain_names_the_domain_state_and_links(tmp_path: Path) -> None:
    f = collected(imex_node(tmp_path, IMEX_FAILED, (DOWN, "", 0), channels=["channel0"]))
    problems = imex_state(host_with(f)).problems
    assert "IMEX Domain State DOWN" in problems
    assert any(p.startswith("324 IMEX link(s) not Connected") for p in problems)
    assert any(p.startswith("18 of 18 IMEX node(s) not READY") for p in problems)


def test_not_installed(tmp_path: Path) -> None:
    reader = imex_node(tmp_path, IMEX_NOT_FOUND, None, files=False)
    f = collected(reader)
    assert f["status"] == "absent" and f["installed"] is False and f["channels"] == []
    assert [c["argv"][0] for c in reader.commands] == ["systemctl"]
    state = imex_state(host_with(f))
    assert state.ready is False and "IMEX is not installed" in state.problems[0]


def test_ctl_that_cannot_read_its_node_config_is_unknown_not_a_pass(tmp_path: Path) -> None:
    # nvidia-imex-ctl exits 255 when it cannot read its node config (tests/fixtures/imex/SOURCES.md).
    f = collected(imex_node(tmp_path, IMEX_ACTIVE, ("", "", 255), channels=["channel0"]))
    assert f["status"] == "unknown" and "exit 255" in f["ctl_reason"]
    state = imex_state(host_with(f))
    assert state.ready is None and "exit 255" in (state.unknown or "")


def test_without_systemd_and_without_imex_nothing_is_claimed(tmp_path: Path) -> None:
    f = collected(imex_node(tmp_path, None, None, files=False))
    assert f["status"] == "unknown" and f["installed"] is None and "systemd not running" in f["reason"]


def test_facts_without_the_imex_reading_are_unknown() -> None:
    state = imex_state(host_with(None))
    assert state.ready is None and "IMEX not read" in (state.unknown or "")


# -- the all-to-all judgement -----------------------------------------------------------------------------


def summary(**kw: object) -> InterconnectSummary:
    return InterconnectSummary.model_validate({"serving_hosts": 2, "multi_node": True, **kw})


ONE = {f"{DOMAIN} clique 32766": 2}


@pytest.mark.parametrize(("s", "want"), [
    (summary(nvlink_domains=ONE), None),
    (summary(nvlink_domains=ONE, imex_not_ready={"n2": "nvidia-imex.service is failed"}), "fail"),
    (summary(nvlink_domains=ONE, imex_unknown={"n2": "IMEX not read"}), "unknown"),
    # One node: the backend's NVLink path stays inside it, IMEX is not needed.
    (summary(multi_node=False, nvlink_domains={f"{DOMAIN} clique 32766": 1}, imex_not_ready={"n1": "x"}), None),
    # Two cliques of one cluster are two domains.
    (summary(nvlink_domains={f"{DOMAIN} clique 32766": 1, f"{DOMAIN} clique 32767": 1}), "fail"),
])
def test_judge_with_imex(s: InterconnectSummary, want: str | None) -> None:
    got = all2all.judge("flashinfer_nvlink_one_sided", s)
    assert (got.kind if got else None) == want
    if want == "fail" and s.imex_not_ready:
        assert got is not None and "IMEX is not ready on 1 of 2" in got.message
        assert "nodes_config.cfg" in got.fix and "nvidia-imex-ctl -N" in got.fix


def test_deepep_does_not_need_imex() -> None:
    assert all2all.judge("deepep_v2", summary(nvlink_domains=ONE, imex_not_ready={"n2": "x"})) is None


# -- the lab: GB200 NVL72 trays --------------------------------------------------------------------------

# Four ready trays (16 GPUs, what the strategy needs for the weights) and one whose IMEX peer is down.
LAB_HOSTS = {"gpu-n01": "gb200-nvl72-r580", "gpu-n02": "gb200-nvl72-r580", "gpu-n03": "gb200-nvl72-r580",
             "gpu-n04": "gb200-nvl72-r580", "gpu-n05": "gb200-nvl72-r580-imex-peer-down"}
READY_TRAYS = ("gpu-n01", "gpu-n02", "gpu-n03", "gpu-n04")


@pytest.fixture(scope="module")
def nvl72(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HostFacts]:
    return nodetree.lab_facts(tmp_path_factory.mktemp("nvl72"), LAB_HOSTS)


def nvl72_target(flags: list[str]) -> Target:
    # A site target for 4-GPU trays with four rails (the default target describes 8-GPU HGX nodes).
    t = load_target()
    return t.model_copy(update={"gpus": t.gpus.model_copy(update={"per_node": 4}),
                                "rdma": t.rdma.model_copy(update={"rails_per_node": 4}),
                                "serve": t.serve.model_copy(update={"flags": [*t.serve.flags, *flags]})})


def test_lab_ctl_output_is_the_real_layout() -> None:
    profile = ProfileLoader(PROFILES).load("gb200-nvl72-r580")
    text = ProfileRenderer(profile, default_image()).imex.imex_ctl_nodes()
    # The ready tray's domain is the AWS capture's: the same text but for the clock and the version.
    assert text.replace(CTL_TIMESTAMP, "5/4/2026 06:08:10.580").replace("580.95.05", "570.172") == READY


def test_lab_trays_carry_their_domain_and_imex(nvl72: dict[str, HostFacts]) -> None:
    f = nvl72["gpu-n01"]
    assert {(g.fabric_state, g.fabric_cluster_uuid, g.fabric_clique_id) for g in f.driver.gpus} == {
        ("completed", DOMAIN, 32766)}
    assert f.imex is not None and f.imex.status == "ok" and f.imex.domain_state == "UP"
    assert f.imex.channels == [0] and len(f.imex.node_list) == 18
    down = nvl72["gpu-n05"].imex
    assert down is not None and down.domain_state == "DEGRADED"
    assert [(n.index, n.status) for n in down.nodes if n.status != "READY"] == [(5, "UNAVAILABLE")]


def test_lab_peer_down_fails_the_host_and_the_backend(nvl72: dict[str, HostFacts]) -> None:
    verdict = evaluate_fleet(nvl72, nvl72_target(["--all2all-backend", "flashinfer_nvlink_one_sided"]))
    imex = {h: [f for f in v.findings if f.check_id == "fabric.imex"] for h, v in verdict.hosts.items()}
    assert all(imex[h] == [] for h in READY_TRAYS)
    (finding,) = imex["gpu-n05"]
    assert finding.kind == "fail" and finding.severity == "error"
    assert "#5 172.31.50.44 UNAVAILABLE" in finding.message and DOMAIN in finding.message
    assert "systemctl enable --now nvidia-imex" in (finding.fix or "")
    (a2a,) = [f for f in verdict.fleet_findings if f.check_id == "fleet.all2all_topology"]
    assert a2a.kind == "fail" and a2a.evidence["hosts"] == ["gpu-n05"]
    assert "IMEX is not ready on 1 of 5 serving host(s)" in a2a.message
    assert verdict.outcome == "rebuild_environment"


def test_lab_ready_trays_fit_the_nvlink_backend(nvl72: dict[str, HostFacts]) -> None:
    good = {h: nvl72[h] for h in READY_TRAYS}
    verdict = evaluate_fleet(good, nvl72_target(["--all2all-backend", "flashinfer_nvlink_one_sided"]))
    assert [f for f in verdict.fleet_findings if f.check_id == "fleet.all2all_topology"] == []
    assert verdict.interconnect is not None
    assert verdict.interconnect.nvlink_domains == {f"{DOMAIN} clique 32766": 4}
    assert not any(f.check_id == "fabric.imex" for v in verdict.hosts.values() for f in v.findings)
