"""The stand-in driver apt repository, resolved by the real apt.

apt-get runs against the built repository with its own state directory and a dpkg
status file that says which driver is "installed", in simulation mode (-s): the
resolver does the real work (conflicts, exact-version dependencies, holds) without
touching this machine. The in-guest install with maintainer scripts and reboots is the
testbed's job.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from k3fleet.lab.standin import build_repo, install_pins, release

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in ("gcc", "dpkg-deb", "dpkg-scanpackages", "apt-ftparchive", "apt-get")),
        reason="needs gcc, dpkg-dev (dpkg-deb, dpkg-scanpackages), apt-utils (apt-ftparchive) and apt-get",
    ),
]

# Packages a minimal Debian guest already has, which the stand-in packages depend on.
BASE_SYSTEM = ("python3", "libc6")
FIELDS_DROPPED = re.compile(r"^(Filename|Size|MD5sum|SHA1|SHA256|SHA512|Description-md5):")


def stanzas(repo: Path) -> list[dict[str, str]]:
    out = []
    for block in (repo / "Packages").read_text(encoding="utf-8").strip().split("\n\n"):
        out.append(dict(re.findall(r"^([\w-]+): (.*)$", block, re.M)) | {"_raw": block})
    return out


@dataclass
class Apt:
    """apt-get with private state: sources = the stand-in repo, status = what we say is installed."""

    root: Path
    repo: Path

    def __post_init__(self) -> None:
        for d in (
            "etc/apt/sources.list.d",
            "etc/apt/preferences.d",
            "etc/apt/apt.conf.d",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
        ):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{self.repo} ./\n", encoding="utf-8")
        self.installed([])
        done = self.run("update")
        assert done.returncode == 0, done.stdout + done.stderr

    def installed(self, pins: list[str], *, held: bool = False) -> None:
        """Writes the dpkg status file: the base system plus these name=version packages."""
        wanted = dict(p.split("=", 1) for p in pins)
        blocks = [
            f"Package: {name}\nStatus: install ok installed\nPriority: optional\nArchitecture: amd64\n"
            f"Version: 1\nDescription: base system"
            for name in BASE_SYSTEM
        ]
        state = "hold" if held else "install"
        for s in stanzas(self.repo):
            if wanted.get(s["Package"]) == s["Version"] or (pins and s["Package"] == "nvidia-sim-hardware"):
                lines = [x for x in s["_raw"].splitlines() if not FIELDS_DROPPED.match(x)]
                lines.insert(1, f"Status: {state} ok installed")
                blocks.append("\n".join(lines))
        (self.root / "status").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        r = self.root
        opts = {
            "Dir": r,
            "Dir::State::status": r / "status",
            "Dir::Etc": r / "etc/apt",
            "Dir::Etc::sourcelist": r / "etc/apt/sources.list",
            "Dir::Etc::sourceparts": r / "etc/apt/sources.list.d",
            "Dir::Etc::preferencesparts": r / "etc/apt/preferences.d",
            "Dir::Etc::parts": r / "etc/apt/apt.conf.d",
            "Dir::State": r / "var/lib/apt",
            "Dir::Cache": r / "var/cache/apt",
            "APT::Architecture": "amd64",
            "Debug::NoLocking": "1",
            "APT::Sandbox::User": "root",
        }
        argv = ["apt-get", *[x for k, v in opts.items() for x in ("-o", f"{k}={v}")], *args]
        env = dict(os.environ, LC_ALL="C", APT_CONFIG="/dev/null")
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)

    def simulate(self, *args: str) -> tuple[int, dict[str, str], dict[str, str], str]:
        """``apt-get install -s``: (rc, {installed name: version}, {removed name: version}, output)."""
        done = self.run("install", "-s", *args)
        text = done.stdout + done.stderr
        inst = dict(re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ", text, re.M))
        remv = dict(re.findall(r"^Remv (\S+) \[(\S+)\]", text, re.M))
        return done.returncode, inst, remv, text


def pin_map(pins: list[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in pins)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repo(tmp_path_factory.mktemp("standin") / "repo")


@pytest.fixture
def apt(repo: Path, tmp_path: Path) -> Apt:
    return Apt(tmp_path / "apt", repo)


def test_repository_has_every_branch_and_point_release(repo: Path) -> None:
    have = {(s["Package"], s["Version"]) for s in stanzas(repo)}
    for version in ("575.57.08", "580.82.07", "580.95.05"):
        for pin in install_pins(version) + install_pins(version, open_kernel=True):
            assert tuple(pin.split("=", 1)) in have, pin
    cuda_fm = {s["Version"]: s["Depends"] for s in stanzas(repo) if s["Package"] == "cuda-drivers-fabricmanager-580"}
    assert cuda_fm == {
        "580.82.07-1": "nvidia-fabricmanager-580 (= 580.82.07-1)",
        "580.95.05-1": "nvidia-fabricmanager-580 (= 580.95.05-1)",
    }
    assert (repo / "Release").read_text(encoding="utf-8").count("Packages") >= 2
    assert (repo / "pynvml" / "pynvml.py").read_bytes()[:200] == Path(__import__("pynvml").__file__).read_bytes()[:200]


def test_rebuild_is_skipped_when_nothing_changed(repo: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in repo.iterdir() if p.is_file()}
    build_repo(repo)
    assert {p.name: p.stat().st_mtime_ns for p in repo.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("version", ["575.57.08", "580.95.05"])
def test_each_compute_package_carries_nvml_of_its_own_version(repo: Path, tmp_path: Path, version: str) -> None:
    r = release(version)
    deb = repo / f"libnvidia-compute-{r.branch}_{r.driver_deb_version}_amd64.deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    libs = list(tmp_path.glob("usr/lib/*/libnvidia-ml.so.1"))
    assert len(libs) == 1 and os.readlink(libs[0]) == f"libnvidia-ml.so.{version}"
    lib = ctypes.CDLL(str(libs[0].resolve()))
    buf = ctypes.create_string_buffer(80)
    assert lib.nvmlSystemGetNVMLVersion(buf, ctypes.c_uint(80)) == 0
    assert buf.value.decode() == f"{r.cuda // 1000}.{version}"


def test_maintainer_scripts_are_valid_shell(repo: Path, tmp_path: Path) -> None:
    deb = repo / "nvidia-fabricmanager-580_580.95.05-1_amd64.deb"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "ctl")], check=True)
    for name in ("postinst", "prerm", "postrm"):
        script = tmp_path / "ctl" / name
        assert os.access(script, os.X_OK)
        assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
        assert "@" not in script.read_text(encoding="utf-8").replace("k3fleet", "")


def test_fresh_install_of_575(apt: Apt) -> None:
    pins = install_pins("575.57.08")
    rc, inst, remv, out = apt.simulate(*pins)
    assert rc == 0, out
    assert remv == {}
    assert pin_map(pins).items() <= inst.items()
    assert "nvidia-sim-hardware" in inst


def test_upgrade_575_to_580_swaps_every_package(apt: Apt) -> None:
    old = install_pins("575.57.08")
    apt.installed(old)
    rc, inst, remv, out = apt.simulate(
        "nvidia-driver-580-server", "nvidia-fabricmanager-580", "cuda-drivers-fabricmanager-580"
    )
    assert rc == 0, out
    assert remv == pin_map(old)
    # newest point release of the branch by default
    assert pin_map(install_pins("580.95.05")).items() <= inst.items()


def test_downgrade_580_to_575_with_exact_versions(apt: Apt) -> None:
    new = install_pins("580.95.05")
    apt.installed(new)
    rc, inst, remv, out = apt.simulate(*install_pins("575.57.08"))
    assert rc == 0, out
    assert remv == pin_map(new)
    assert pin_map(install_pins("575.57.08")).items() <= inst.items()


def test_point_release_downgrade_inside_the_branch(apt: Apt) -> None:
    apt.installed(install_pins("580.95.05"))
    rc, inst, remv, out = apt.simulate("--allow-downgrades", *install_pins("580.82.07"))
    assert rc == 0, out
    assert remv == {}
    assert pin_map(install_pins("580.82.07")).items() <= inst.items()
    assert re.search(r"\b6 downgraded\b", out)


def test_held_driver_blocks_the_branch_swap(apt: Apt) -> None:
    # docs/facts.md section 4: a held package cannot be swapped by apt install alone.
    apt.installed(install_pins("575.57.08"), held=True)
    rc, _, _, out = apt.simulate(*install_pins("580.95.05"))
    assert rc != 0
    assert "pkgProblemResolver::Resolve generated breaks, this may be caused by held packages." in out


def test_fabric_manager_must_match_its_meta_package_exactly(apt: Apt) -> None:
    rc, _, _, out = apt.simulate("cuda-drivers-fabricmanager-580=580.95.05-1", "nvidia-fabricmanager-580=580.82.07-1")
    assert rc != 0
    assert "cuda-drivers-fabricmanager-580 : Depends: nvidia-fabricmanager-580 (= 580.95.05-1)" in out
    rc, inst, _, out = apt.simulate(
        "cuda-drivers-fabricmanager-580=580.82.07-1", "nvidia-fabricmanager-580=580.82.07-1"
    )
    assert rc == 0, out
    assert inst["nvidia-fabricmanager-580"] == "580.82.07-1"


def test_open_flavour_replaces_the_proprietary_kernel_module(apt: Apt) -> None:
    apt.installed(install_pins("580.95.05", fabricmanager=False))
    rc, inst, remv, out = apt.simulate("nvidia-driver-580-server-open")
    assert rc == 0, out
    assert {"nvidia-driver-580-server", "nvidia-kernel-sim-580"} <= remv.keys()
    assert inst["nvidia-kernel-sim-580-open"] == "580.95.05-0ubuntu1"


def test_broken_fabric_manager_build_only_breaks_that_version(tmp_path: Path) -> None:
    repo = build_repo(tmp_path / "broken", broken_fm="580.95.05", gpus=4)
    for deb, broken in (
        ("nvidia-fabricmanager-580_580.95.05-1_amd64.deb", True),
        ("nvidia-fabricmanager-580_580.82.07-1_amd64.deb", False),
    ):
        out = tmp_path / deb
        subprocess.run(["dpkg-deb", "-x", str(repo / deb), str(out)], check=True)
        script = (out / "usr/bin/nv-fabricmanager").read_text(encoding="utf-8")
        assert ('SIM_FAULT = "nvswitch"' in script) is broken
    conf = [s for s in stanzas(repo) if s["Package"] == "nvidia-sim-hardware"]
    assert len(conf) == 1 and conf[0]["Version"].startswith("1.0+4gpu.")
    assert len(list(repo.glob("nvidia-sim-hardware_*.deb"))) == 1
