"""Builds the stand-in NVIDIA driver apt repository for the real testbed.

The repository is flat (``deb [trusted=yes] file:/srv/k3fleet-repo ./``) and holds, for
each driver release, packages named and related like Ubuntu's ``-server`` driver
packages and NVIDIA's Fabric Manager packages (docs/facts.md sections 3-4), so that apt's
resolver does the same work it does on a real node: a 575 -> 580 upgrade, an
exact-version downgrade back, and Fabric Manager pinned to the exact driver version.

What the packages install is a stand-in: a C ``libnvidia-ml.so.1`` per version, a
``nvidia-smi`` and ``nv-fabricmanager`` built on it, and boot-time units that "load" the
installed kernel module by writing a simulated /proc view (see files/nvidia_sim_proc.py).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = HERE / "files"
SHIM_SOURCE = HERE / "src" / "nvml_shim.c"

# Bump when the layout of the repository changes in a way the fingerprint cannot see.
BUILD_SCHEMA = 1
STAMP = ".standin-build.json"
MAINTAINER = "k3fleet lab <lab@k3fleet.invalid>"
OPEN_BUILDER = "dvs-builder@U16-I3-B03-4-3"
GCC_LINE = "gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)"


class StandinBuildError(RuntimeError):
    """A repository could not be built; the message names the step and the object."""


@dataclass(frozen=True)
class DriverRelease:
    """One driver point release and the CUDA version its driver reports.

    ``cuda`` is nvmlSystemGetCudaDriverVersion's integer (docs/facts.md section 2: R575 is
    CUDA 12.9, R580 is CUDA 13.0). ``build_date`` only fills the date field of the
    simulated /proc/driver/nvidia/version line; it is the stand-in's stamp, not NVIDIA's.
    """

    version: str
    cuda: int
    build_date: str

    @property
    def branch(self) -> str:
        return self.version.split(".", 1)[0]

    @property
    def driver_deb_version(self) -> str:
        # Ubuntu archive style revision of the driver packages.
        return f"{self.version}-0ubuntu1"

    @property
    def fm_deb_version(self) -> str:
        # NVIDIA CUDA repository style revision of the Fabric Manager packages.
        return f"{self.version}-1"


RELEASES: tuple[DriverRelease, ...] = (
    DriverRelease("575.57.08", 12090, "Thu May 29 10:12:41 UTC 2025"),
    DriverRelease("580.82.07", 13000, "Tue Sep  2 08:41:27 UTC 2025"),
    DriverRelease("580.95.05", 13000, "Tue Sep 23 09:51:11 UTC 2025"),
)


@dataclass(frozen=True)
class GpuModel:
    """What NVML reports for one GPU model."""

    name: str
    memory_mib: int
    compute_cap: str
    pci_device_id: int
    pci_subsystem_id: int
    nvlinks: int
    # The GPU's PCIe link: H100 and H200 SXM are Gen 5 x16 (the H100 capture in tests/fixtures/driver).
    pcie_gen_max: int = 5
    pcie_width_max: int = 16


# H200 SXM: 143771 MiB and cc 9.0 as nvidia-smi prints them, PCI 10de:2335 subsystem
# 10de:18be (NVIDIA mig-parted's device filters; nvidia-smi -q captures). H100 SXM5:
# 81559 MiB (nvidia-smi), PCI 10de:2330 (pci.ids); its subsystem id is not recorded.
# Both have 18 NVLink 4 links per GPU.
GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("NVIDIA H200", 143771, "9.0", 0x233510DE, 0x18BE10DE, 18),
        GpuModel("NVIDIA H100 80GB HBM3", 81559, "9.0", 0x233010DE, 0x0, 18),
    )
}

# PCI bus numbers of the GPUs on an 8-GPU baseboard and of its NVSwitch chips. The
# numbers are platform specific; these only need to be stable and well formed.
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
NVSWITCH_BUSES = (0x09, 0x0A, 0x0B, 0x0C)
# HGX H100/H200 8-GPU boards carry four NVSwitch chips; 4-GPU boards link GPUs directly.
NVSWITCHES_PER_BOARD = 4
GPUS_PER_BOARD = 8


@dataclass
class Package:
    name: str
    version: str
    architecture: str
    description: str
    depends: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    # path inside the package -> (content, mode); symbolic links separately
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    unit: str | None = None
    start_unit: bool = False
    stop_unit: bool = False
    triggers: str | None = None
    # path another package owns -> where dpkg-divert moves it while this package is installed
    diverts: dict[str, str] = field(default_factory=dict)

    @property
    def deb_name(self) -> str:
        return f"{self.name}_{self.version}_{self.architecture}.deb"


def release(version: str) -> DriverRelease:
    """The release with this exact driver version; StandinBuildError when unknown."""
    for r in RELEASES:
        if r.version == version:
            return r
    known = ", ".join(r.version for r in RELEASES)
    raise StandinBuildError(f"stand-in driver release {version!r} is unknown (known: {known})")


def install_pins(version: str, *, open_kernel: bool = False, fabricmanager: bool = True) -> list[str]:
    """``name=debversion`` arguments that install one release exactly with apt.

    The order is the one an operator would type: driver, then Fabric Manager.
    """
    r = release(version)
    flavour = "-open" if open_kernel else ""
    pins = [
        f"nvidia-driver-{r.branch}-server{flavour}={r.driver_deb_version}",
        f"nvidia-utils-{r.branch}-server={r.driver_deb_version}",
        f"libnvidia-compute-{r.branch}={r.driver_deb_version}",
        f"nvidia-kernel-sim-{r.branch}{flavour}={r.driver_deb_version}",
    ]
    if fabricmanager:
        pins += [
            f"nvidia-fabricmanager-{r.branch}={r.fm_deb_version}",
            f"cuda-drivers-fabricmanager-{r.branch}={r.fm_deb_version}",
        ]
    return pins


def render_template(name: str, **values: str) -> str:
    """A file from files/ with every ``@KEY@`` replaced; refuses to leave one unreplaced."""
    text = (FILES / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    leftover = re.search(r"@([A-Z][A-Z0-9_]*)@", text)
    if leftover:
        raise StandinBuildError(f"template {name}: no value for @{leftover.group(1)}@")
    return text


def gpus_conf(gpus: int, gpu_name: str) -> str:
    """The GPU inventory the stand-in NVML reads (/etc/nvidia-sim/gpus.conf)."""
    model = gpu_model(gpu_name)
    if not 1 <= gpus <= 64:
        raise StandinBuildError(f"stand-in GPU count {gpus} is out of range (1..64)")
    buses = []
    for i in range(gpus):
        board, slot = divmod(i, GPUS_PER_BOARD)
        # Further baseboards sit behind their own root ports: shift the bus numbers.
        buses.append(f"00000000:{(GPU_BUSES[slot] + board) & 0xFF:02X}:00.0")
    switches = []
    for board in range(gpus // GPUS_PER_BOARD):
        for bus in NVSWITCH_BUSES:
            switches.append(f"0000:{bus + board * NVSWITCHES_PER_BOARD:02x}:00.0")
    lines = [
        "# Simulated GPU inventory of this node (k3fleet stand-in driver). Read by the",
        "# stand-in libnvidia-ml.so.1 and by nvidia-sim-proc; not part of any real driver.",
        f"count={gpus}",
        f"name={model.name}",
        f"memory_mib={model.memory_mib}",
        f"compute_cap={model.compute_cap}",
        f"pci_device_id=0x{model.pci_device_id:08X}",
        f"pci_subsystem_id=0x{model.pci_subsystem_id:08X}",
        f"nvlinks={model.nvlinks}",
        f"pcie_gen_max={model.pcie_gen_max}",
        f"pcie_width_max={model.pcie_width_max}",
        "persistence_mode=1",
        "bus_ids=" + ",".join(buses),
        "nvswitch_bus_ids=" + ",".join(switches),
    ]
    return "\n".join(lines) + "\n"


def gpu_model(gpu_name: str) -> GpuModel:
    try:
        return GPU_MODELS[gpu_name]
    except KeyError:
        known = ", ".join(sorted(GPU_MODELS))
        raise StandinBuildError(f"stand-in GPU model {gpu_name!r} is unknown (known: {known})") from None


def _run(argv: Sequence[str], *, cwd: Path | None = None, what: str) -> str:
    try:
        proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False,
                              timeout=300)
    except FileNotFoundError:
        raise StandinBuildError(f"{what}: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise StandinBuildError(f"{what}: {argv[0]} timed out") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise StandinBuildError(f"{what}: {' '.join(argv)} exited {proc.returncode}: "
                                f"{detail[-1] if detail else 'no output'}")
    return proc.stdout


def compile_shim(out_dir: Path, version: str) -> Path:
    """Compiles libnvidia-ml.so.<version> into out_dir plus the libnvidia-ml.so.1 link.

    Returns the path of the link, the name every NVML client loads.
    """
    r = release(version)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"libnvidia-ml.so.{r.version}"
    _run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden",
          f'-DSTANDIN_DRIVER_VERSION="{r.version}"', f"-DSTANDIN_CUDA_VERSION={r.cuda}",
          "-Wl,-soname,libnvidia-ml.so.1", "-o", str(target), str(SHIM_SOURCE), "-lpthread"],
         what=f"compiling the stand-in NVML {r.version}")
    link = out_dir / "libnvidia-ml.so.1"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target.name)
    return link


def _pynvml_source() -> Path:
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise StandinBuildError("copying pynvml: nvidia-ml-py is not installed on the controller")
    return Path(spec.origin)


def _machine() -> tuple[str, str]:
    arch = _run(["dpkg", "--print-architecture"], what="reading the dpkg architecture").strip()
    multiarch = _run(["gcc", "-print-multiarch"], what="reading the multiarch triplet").strip()
    if not multiarch:
        raise StandinBuildError("reading the multiarch triplet: gcc -print-multiarch printed nothing")
    return arch, multiarch


def _maint_scripts(pkg: Package) -> dict[str, str]:
    if pkg.unit is None:
        return {}
    divert = [f"--package {pkg.name} --rename --divert {to} {path}" for path, to in sorted(pkg.diverts.items())]
    values = {"PACKAGE": pkg.name, "UNIT": pkg.unit, "START": "yes" if pkg.start_unit else "no",
              "STOP": "yes" if pkg.stop_unit else "no",
              "DIVERTS": "\n".join(f"    dpkg-divert --quiet --add {d}" for d in divert) or "    :",
              "UNDIVERTS": "\n".join(f"    dpkg-divert --quiet --remove {d}" for d in divert)}
    names = ("postinst", "prerm", "postrm", *(("preinst",) if divert else ()))
    return {name: render_template(f"maint/{name}", **values) for name in names}


def _control(pkg: Package) -> str:
    lines = [f"Package: {pkg.name}", f"Version: {pkg.version}", f"Architecture: {pkg.architecture}",
             f"Maintainer: {MAINTAINER}", "Section: non-free/libs", "Priority: optional"]
    for key, values in (("Depends", pkg.depends), ("Provides", pkg.provides),
                        ("Conflicts", pkg.conflicts), ("Replaces", pkg.replaces)):
        if values:
            lines.append(f"{key}: {', '.join(values)}")
    summary, _, rest = pkg.description.partition("\n")
    lines.append(f"Description: {summary}")
    for line in (rest or "Stand-in package of the k3fleet testbed; contains no NVIDIA software.").splitlines():
        lines.append(" " + (line or "."))
    return "\n".join(lines) + "\n"


def _build_deb(pkg: Package, work: Path, out: Path) -> Path:
    root = work / f"{pkg.name}_{pkg.version}"
    if root.exists():
        shutil.rmtree(root)
    (root / "DEBIAN").mkdir(parents=True)
    for rel, (content, mode) in pkg.files.items():
        path = root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    for rel, target in pkg.links.items():
        path = root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    (root / "DEBIAN" / "control").write_text(_control(pkg), encoding="utf-8")
    for name, text in _maint_scripts(pkg).items():
        script = root / "DEBIAN" / name
        script.write_text(text, encoding="utf-8")
        script.chmod(0o755)
    if pkg.triggers:
        (root / "DEBIAN" / "triggers").write_text(pkg.triggers, encoding="utf-8")
    # dpkg-deb refuses group-writable control directories (umask 002 systems).
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    deb = out / pkg.deb_name
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(root), str(deb)],
         what=f"building package {pkg.name} {pkg.version}")
    return deb


def _driver_packages(r: DriverRelease, arch: str, multiarch: str, shim: Path,
                     broken_fm: str | None) -> list[Package]:
    b, dv, fv = r.branch, r.driver_deb_version, r.fm_deb_version
    pkgs: list[Package] = []
    for flavour, suffix in (("proprietary", ""), ("open", "-open")):
        module_conf = (f"# The kernel module this package 'loads' at boot (k3fleet stand-in).\n"
                       f"version={r.version}\nflavour={flavour}\nbuild_date={r.build_date}\n"
                       f"builder={OPEN_BUILDER}\ngcc={GCC_LINE}\n")
        unit = render_template("nvidia-sim-load.service", VERSION=r.version, FLAVOUR=flavour)
        pkgs.append(Package(
            name=f"nvidia-kernel-sim-{b}{suffix}", version=dv, architecture=arch,
            description=(f"Stand-in NVIDIA {flavour} kernel module {r.version}\n"
                         "Writes the simulated /proc/driver/nvidia view at boot; the loaded driver\n"
                         "changes only after a reboot, like a real kernel module."),
            depends=["nvidia-sim-hardware"],
            provides=["nvidia-kernel-sim"], conflicts=["nvidia-kernel-sim"], replaces=["nvidia-kernel-sim"],
            files={"/usr/lib/nvidia-sim/kernel-module.conf": (module_conf.encode(), 0o644),
                   "/lib/systemd/system/nvidia-sim-load.service": (unit.encode(), 0o644)},
            unit="nvidia-sim-load.service"))
    pkgs.append(Package(
        name=f"libnvidia-compute-{b}", version=dv, architecture=arch,
        description=f"Stand-in NVIDIA compute libraries {r.version} (NVML only)",
        depends=["nvidia-sim-hardware", "libc6"],
        provides=["libnvidia-compute", "libnvidia-ml.so.1"],
        conflicts=["libnvidia-compute"], replaces=["libnvidia-compute"],
        files={f"/usr/lib/{multiarch}/libnvidia-ml.so.{r.version}": (shim.read_bytes(), 0o644)},
        links={f"/usr/lib/{multiarch}/libnvidia-ml.so.1": f"libnvidia-ml.so.{r.version}"},
        triggers="activate-noawait ldconfig\n"))
    pkgs.append(Package(
        name=f"nvidia-utils-{b}-server", version=dv, architecture=arch,
        description=f"Stand-in NVIDIA driver support binaries {r.version} (nvidia-smi)",
        depends=[f"libnvidia-compute-{b} (= {dv})", "python3"],
        provides=["nvidia-utils"], conflicts=["nvidia-utils"], replaces=["nvidia-utils"],
        files={"/usr/bin/nvidia-smi": (render_template("nvidia_smi.py").encode(), 0o755)}))
    for flavour, suffix in (("proprietary", ""), ("open", "-open")):
        pkgs.append(Package(
            name=f"nvidia-driver-{b}-server{suffix}", version=dv, architecture=arch,
            description=f"Stand-in NVIDIA server driver metapackage {r.version} ({flavour} kernel module)",
            depends=[f"nvidia-utils-{b}-server (= {dv})", f"libnvidia-compute-{b} (= {dv})",
                     f"nvidia-kernel-sim-{b}{suffix} (= {dv})"],
            provides=["nvidia-driver-binary"], conflicts=["nvidia-driver-binary"],
            replaces=["nvidia-driver-binary"]))
    fault = "nvswitch" if broken_fm == r.version else ""
    fm_script = render_template("nv_fabricmanager.py", FM_VERSION=r.version, SIM_FAULT=fault)
    pkgs.append(Package(
        name=f"nvidia-fabricmanager-{b}", version=fv, architecture=arch,
        description=(f"Stand-in NVIDIA Fabric Manager {r.version}"
                     + ("\nThis build is broken on purpose: its service never starts." if fault else "")),
        depends=["python3"],
        provides=["nvidia-fabricmanager"], conflicts=["nvidia-fabricmanager"],
        replaces=["nvidia-fabricmanager"],
        files={"/usr/bin/nv-fabricmanager": (fm_script.encode(), 0o755),
               "/lib/systemd/system/nvidia-fabricmanager.service":
                   (render_template("nvidia-fabricmanager.service").encode(), 0o644),
               "/usr/share/nvidia/nvswitch/fabricmanager.cfg":
                   (render_template("fabricmanager.cfg").encode(), 0o644)},
        unit="nvidia-fabricmanager.service", start_unit=True, stop_unit=True))
    pkgs.append(Package(
        name=f"cuda-drivers-fabricmanager-{b}", version=fv, architecture=arch,
        description=f"Stand-in meta-package pinning Fabric Manager {r.version} to its exact version",
        depends=[f"nvidia-fabricmanager-{b} (= {fv})"]))
    return pkgs


def _hardware_package(gpus: int, gpu_name: str) -> Package:
    conf = gpus_conf(gpus, gpu_name)
    # The version follows the inventory so that apt replaces it when the lab changes.
    digest = hashlib.sha256(conf.encode()).hexdigest()[:8]
    return Package(
        name="nvidia-sim-hardware", version=f"1.0+{gpus}gpu.{digest}", architecture="all",
        description=(f"Simulated GPU hardware of a k3fleet testbed node: {gpus}x {gpu_name}\n"
                     "Inventory for the stand-in NVML and the boot-time /proc view. Stays installed\n"
                     "when the driver is removed, like the hardware itself."),
        depends=["python3"],
        files={"/etc/nvidia-sim/gpus.conf": (conf.encode(), 0o644),
               "/usr/lib/nvidia-sim/nvidia-sim-proc": (render_template("nvidia_sim_proc.py").encode(), 0o755),
               "/lib/systemd/system/nvidia-sim-proc.service":
                   (render_template("nvidia-sim-proc.service").encode(), 0o644),
               # The simulated hardware's kernel log (see files/dmesg.py), in util-linux's place:
               # bookworm's util-linux owns /bin/dmesg (merged /usr makes it /usr/bin/dmesg too).
               "/bin/dmesg": (render_template("dmesg.py").encode(), 0o755)},
        diverts={"/bin/dmesg": "/bin/dmesg.util-linux"},
        unit="nvidia-sim-proc.service", start_unit=True)


def _fingerprint(params: Mapping[str, object], arch: str, multiarch: str, pynvml: Path) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"schema": BUILD_SCHEMA, "params": params, "arch": arch,
                         "multiarch": multiarch}, sort_keys=True).encode())
    sources = [Path(__file__), SHIM_SOURCE, pynvml, *sorted(p for p in FILES.rglob("*") if p.is_file())]
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _up_to_date(dest: Path, fingerprint: str) -> bool:
    try:
        stamp = json.loads((dest / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if stamp.get("fingerprint") != fingerprint:
        return False
    return all((dest / name).is_file() for name in stamp.get("files", []))


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    # Append mode: taking the lock must not touch the file (an unchanged repo stays unchanged).
    with open(dest / ".standin-build.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _index(repo: Path) -> None:
    packages = _run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=repo,
                    what=f"indexing {repo}")
    (repo / "Packages").write_text(packages, encoding="utf-8")
    with gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages.encode())
    release_text = _run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=k3fleet-standin",
                         "-o", "APT::FTPArchive::Release::Label=k3fleet stand-in NVIDIA driver",
                         "release", "."], cwd=repo, what=f"writing the Release file of {repo}")
    (repo / "Release").write_text(release_text, encoding="utf-8")


def build_repo(dest: Path, *, broken_fm: str | None = None, gpus: int = 8,
               gpu_name: str = "NVIDIA H200", without: Sequence[str] = ()) -> Path:
    """Builds (or confirms up to date) the flat stand-in apt repository in ``dest``.

    ``broken_fm`` names a driver version whose Fabric Manager package is built so that
    its service never starts, even on a matching driver (rollback tests). ``without`` names
    driver versions the repository leaves out, as a mirror that keeps only the newest
    releases does (the rollback kit's tests). ``gpus`` and
    ``gpu_name`` describe the simulated hardware. Also writes ``dest/pynvml/pynvml.py``,
    copied from the controller's nvidia-ml-py, for guests that have no pip.
    Returns ``dest``. Raises StandinBuildError naming the failed step.
    """
    dest = Path(dest)
    if broken_fm is not None:
        release(broken_fm)
    dropped = sorted({release(v).version for v in without})
    gpus_conf(gpus, gpu_name)
    dest.mkdir(parents=True, exist_ok=True)
    arch, multiarch = _machine()
    pynvml = _pynvml_source()
    releases = [r for r in RELEASES if r.version not in dropped]
    params = {"broken_fm": broken_fm, "gpus": gpus, "gpu_name": gpu_name,
              "releases": [(r.version, r.cuda, r.build_date) for r in releases]}
    fingerprint = _fingerprint(params, arch, multiarch, pynvml)
    with _locked(dest):
        if _up_to_date(dest, fingerprint):
            return dest
        # Build beside the final files, then move them in: dest itself keeps its inode,
        # so a guest that bind-mounts it sees the new repository without a remount.
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=dest))
        try:
            work, repo = staging / "work", staging / "repo"
            work.mkdir()
            repo.mkdir()
            debs = [_build_deb(_hardware_package(gpus, gpu_name), work, repo)]
            for r in releases:
                shim = compile_shim(work / "shim" / r.version, r.version).resolve()
                debs += [_build_deb(p, work, repo)
                         for p in _driver_packages(r, arch, multiarch, shim, broken_fm)]
            _index(repo)
            (repo / "pynvml").mkdir()
            shutil.copyfile(pynvml, repo / "pynvml" / "pynvml.py")
            files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
            for rel in files:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(repo / rel, target)
            for old in dest.glob("*.deb"):
                if old.name not in {d.name for d in debs}:
                    old.unlink()
            stamp = {"fingerprint": fingerprint, "params": params, "files": files,
                     "packages": [d.name for d in debs]}
            (dest / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return dest
