"""Installed from a wheel into a fresh venv and run from another directory, k3fleet still finds
its playbooks, roles and modules (docs/architecture.md "Layout")."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist), str(REPO)], check=True)
    wheels = list(dist.glob("k3fleet-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_carries_data_files(wheel: Path) -> None:
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    assert "k3fleet/_data/playbooks/audit.yml" in names
    assert "k3fleet/_data/ansible.cfg" in names
    assert "ansible_collections/k3fleet/gpu/plugins/modules/k3fleet_host_info.py" in names
    assert "ansible_collections/k3fleet/gpu/plugins/module_utils/k3fleet_cmd.py" in names
    assert any(n.startswith("k3fleet/_data/inventories/lab/") for n in names)


def test_fresh_venv_audits_lab_from_another_directory(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # Dependencies resolve from the package index as for any user; the wheel itself is local.
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([str(env_dir / "bin" / "k3fleet"), "audit", "--lab", "--json", "--out", "run"],
                          cwd=elsewhere, capture_output=True, text=True,
                          env={"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin",
                               "HOME": str(tmp_path)})
    assert proc.returncode in (1, 3), proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["summary"]["hosts"] >= 8
    assert verdict["summary"]["hosts"] - verdict["summary"]["unreachable"] >= 7
    assert (elsewhere / "run" / "manifest.json").is_file()
    # The installed package, not this checkout, answered.
    where = subprocess.run([str(py), "-c", "import k3fleet, sys; print(k3fleet.__file__)"], cwd=elsewhere,
                           capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in where
