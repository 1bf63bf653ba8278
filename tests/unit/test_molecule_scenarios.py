"""Every role of the k3fleet.gpu collection has its molecule scenario (the scenarios themselves run on the
real testbed: tests/system/test_molecule.py), and each scenario's playbooks name what they test."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (REPO / "ansible_collections" / "k3fleet" / "gpu" / "roles").iterdir() if p.is_dir())
SCENARIOS = REPO / "molecule"
# k3_preflight's scenario is molecule/default, which also creates and destroys the shared testbed.
SCENARIO_OF = {role: ("default" if role == "k3_preflight" else role) for role in ROLES}


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("role", ROLES)
def test_each_role_has_a_scenario_that_converges_and_verifies_it(role: str) -> None:
    scenario = SCENARIOS / SCENARIO_OF[role]
    assert (scenario / "molecule.yml").is_file(), f"{role}: no molecule/{scenario.name}/molecule.yml"
    converge = _text(scenario / "converge.yml")
    assert f"k3fleet.gpu.{role}" in converge, f"{role}: molecule/{scenario.name}/converge.yml does not run the role"
    verify = yaml.safe_load(_text(scenario / "verify.yml")) or []
    asserts = [t for play in verify for t in play.get("tasks") or [] if "ansible.builtin.assert" in t]
    assert asserts, f"{role}: molecule/{scenario.name}/verify.yml asserts nothing"


def test_no_scenario_without_its_role() -> None:
    names = {p.parent.name for p in SCENARIOS.glob("*/molecule.yml")}
    assert names == set(SCENARIO_OF.values())


def test_the_shared_config_shares_the_testbed_and_each_prepare_resets_the_guests() -> None:
    base = yaml.safe_load((REPO / ".config" / "molecule" / "config.yml").read_text())
    assert base["shared_state"] is True
    assert [p["name"] for p in base["platforms"]] == ["tb-node01", "tb-node02"]
    for name in set(SCENARIO_OF.values()) - {"default"}:
        prepare = _text(SCENARIOS / name / "prepare.yml")
        assert "../resources/r575.yml" in prepare, f"molecule/{name}/prepare.yml does not put the guests on R575 first"
