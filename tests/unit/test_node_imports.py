"""What a node compiles for one k3fleet_host_info run: each module_util once, and on a plain audit
(no probe, no active checks) none of the probe's, the active checks' or the GPU source it does not ask;
and of the NVML paths only the one that runs (pynvml's, k3fleet's own binding, nvidia-smi).

AnsiballZ ships the module_utils a module imports anywhere (in functions too) as sources in a zip; a
node compiles those it imports, and zipimport compiles each twice (k3fleet_load says why). The payload
here is that zip as AnsiballZ lays it out (the module_utils of the collection under their package path,
empty package __init__ files), run by a fresh interpreter on a generated lab host. What is shipped is
what Ansible's own dependency finder (ansible.executor.module_common.ModuleDepFinder) finds.
Structure only: no timing is asserted (scripts/bench_audit.py --node measures it).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from ansible.executor.module_common import ModuleDepFinder
from nodetree import NO_NVML_LIBRARY, LabHost, counting_compiles

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
from k3fleet.lab.fleet import default_image
from k3fleet.lab.standin import compile_shim, gpus_conf

COLLECTION = Path(__file__).resolve().parents[2] / "ansible_collections" / "k3fleet" / "gpu"
PACKAGE = "ansible_collections.k3fleet.gpu.plugins.module_utils"
MODULE = "ansible_collections.k3fleet.gpu.plugins.modules.k3fleet_host_info"
IMAGE = default_image()
# Only an audit with --active, a probe, or a node where NVML is asked needs these.
NOT_ON_A_PLAIN_AUDIT = {"k3fleet_active", "k3fleet_probe", "k3fleet_nvml", "k3fleet_nvml_lib"}

# One module run's collection, as the module does it, from the payload on sys.path[0]. Prints what was
# compiled (per module_util file), which loader loaded each module_util, and the facts. A library path
# (argv[7]) is the one k3fleet's NVML binding loads instead of the system's libnvidia-ml.so.1.
_RUN = counting_compiles('name.rsplit("/", 1)[1] if "/module_utils/" in name else None') + r"""
import json, sys
payload, root, image, probe, use_nvml, finder, library = sys.argv[1:8]
sys.path.insert(0, payload)
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load
installed = k3fleet_load.install() if finder == "1" else None
if library:
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_nvml_lib
    k3fleet_nvml_lib.LIBRARY = library
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
facts = collect_host(NodeReader(root=root, path=root + "/bin"), host="lab", image=image, probe=probe == "1",
                     use_nvml=use_nvml == "1")
package = "ansible_collections.k3fleet.gpu.plugins.module_utils."
loaders = {name[len(package):]: type(mod.__loader__).__name__ for name, mod in sys.modules.items()
           if name.startswith(package)}
print(json.dumps({"installed": installed is not None, "compiles": compiles, "loaders": loaders, "facts": facts}))
"""

# pynvml as a node without the NVML library has it: the bindings import, nvmlInit fails.
_PYNVML_WITHOUT_LIBRARY = '''
class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


def nvmlInit():
    raise NVMLError_LibraryNotFound()
'''


def _payload(dest: Path, pynvml: str | None = None) -> Path:
    """The module_utils as AnsiballZ zips them: their sources under the package path, empty __init__s."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "payload.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        parts = PACKAGE.split(".")
        for depth in range(1, len(parts) + 1):
            zf.writestr("/".join(parts[:depth]) + "/__init__.py", "")
        for source in sorted((COLLECTION / "plugins" / "module_utils").glob("*.py")):
            zf.write(source, "/".join(parts) + "/" + source.name)
        if pynvml is not None:
            zf.writestr("pynvml.py", pynvml)
    return path


def _run(payload: Path, root: Path, *, probe: bool = False, use_nvml: bool = False,
         finder: bool = True, library: str = "", env: dict[str, str] | None = None) -> dict[str, Any]:
    # -I -S: nothing but the standard library and the payload, as on a node (no site-packages, no cwd).
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _RUN, str(payload), str(root), IMAGE,
                           "1" if probe else "0", "1" if use_nvml else "0", "1" if finder else "0", library],
                          capture_output=True, text=True, check=False, timeout=120,
                          env=dict(os.environ, **(env or {})))
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _shipped() -> set[str]:
    """The module_utils AnsiballZ ships with k3fleet_host_info: every one an import statement names,
    at module level or in a function, found from the module onward with Ansible's own finder."""
    shipped: set[str] = set()
    todo = [(MODULE, COLLECTION / "plugins" / "modules" / "k3fleet_host_info.py")]
    while todo:
        fqn, path = todo.pop()
        finder = ModuleDepFinder(fqn, ast.parse(path.read_text(encoding="utf-8")))
        for parts in finder.submodules:
            if ".".join(parts[:5]) != PACKAGE or len(parts) < 6:
                continue
            source = COLLECTION / "plugins" / "module_utils" / f"{parts[5]}.py"
            if source.is_file() and parts[5] not in shipped:
                shipped.add(parts[5])
                todo.append((f"{PACKAGE}.{parts[5]}", source))
    return shipped


def _comparable(facts: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in facts.items() if k not in ("collected_at", "duration_s")}
    out["commands"] = [{k: v for k, v in c.items() if k != "duration"} for c in facts["commands"]]
    return out


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _payload(tmp_path_factory.mktemp("payload"))


def test_each_module_util_compiles_once_from_the_payload(payload: Path, lab_host: LabHost) -> None:
    run = _run(payload, lab_host.root)
    assert run["installed"]
    imported = set(run["loaders"]) - {"k3fleet_load"}
    assert {"k3fleet_host", "k3fleet_driver", "k3fleet_smi", "k3fleet_container"} <= imported
    # k3fleet_load itself is imported before it can help: zipimport compiles it as it compiles any.
    assert {name: run["loaders"][name] for name in imported} == {name: "PayloadSourceLoader" for name in imported}
    assert {name: run["compiles"].get(f"{name}.py") for name in imported} == {name: 1 for name in imported}
    # The facts are those of the same collection imported from the checkout.
    local = collect_host(NodeReader(root=str(lab_host.root), path=str(lab_host.root / "bin")), host="lab", image=IMAGE,
                         use_nvml=False)
    assert _comparable(run["facts"]) == _comparable(local)


def test_without_the_finder_zipimport_loads_them_and_the_facts_are_the_same(payload: Path, lab_host: LabHost) -> None:
    run = _run(payload, lab_host.root, finder=False)
    assert not run["installed"]
    assert set(run["loaders"].values()) == {"zipimporter"}
    with_finder = _run(payload, lab_host.root)
    assert _comparable(run["facts"]) == _comparable(with_finder["facts"])


def test_install_outside_a_payload_installs_nothing() -> None:
    # Here the module_utils come from the checkout: nothing to change, nothing on sys.meta_path.
    assert k3fleet_load.install() is None
    assert k3fleet_load.installed() is None


def test_a_plain_audit_compiles_no_probe_active_or_unused_gpu_source(payload: Path, lab_host: LabHost) -> None:
    shipped = _shipped()
    # Lazy imports stay visible to AnsiballZ: everything a run can import is in the payload.
    assert NOT_ON_A_PLAIN_AUDIT | {"k3fleet_load", "k3fleet_host", "k3fleet_smi", "k3fleet_gpu_common"} <= shipped
    plain = _run(payload, lab_host.root)
    imported = set(plain["loaders"])
    assert imported <= shipped
    assert not imported & NOT_ON_A_PLAIN_AUDIT, imported & NOT_ON_A_PLAIN_AUDIT
    assert plain["facts"]["container"]["probe"]["message"] == "not run (probe=false)"
    # Each is there when its path runs, imported from the payload like the rest.
    probed = _run(payload, lab_host.root, probe=True)
    assert probed["loaders"].get("k3fleet_probe") == "PayloadSourceLoader"
    assert probed["facts"]["container"]["probe"]["ran"] is True
    assert set(probed["loaders"]) <= shipped


def _nvidia_smi_runs(run: dict[str, Any]) -> list[list[str]]:
    return [c["argv"] for c in run["facts"]["commands"] if c["argv"][0].endswith("nvidia-smi")]


def test_nvml_source_is_compiled_only_when_nvml_bindings_load(tmp_path: Path, lab_host: LabHost) -> None:
    # No pynvml and no libnvidia-ml.so.1: the binding is compiled (it looked), the NVML source is not.
    without = _run(_payload(tmp_path / "a"), lab_host.root, use_nvml=True, library=NO_NVML_LIBRARY)
    driver = without["facts"]["driver"]
    assert (driver["nvml"]["status"], driver["nvml"]["bindings"], driver["source"]) == (
        "library_not_found", None, "nvidia-smi")
    assert without["loaders"].get("k3fleet_nvml_lib") == "PayloadSourceLoader"
    assert without["compiles"].get("k3fleet_nvml_lib.py") == 1
    assert "k3fleet_nvml" not in without["loaders"]
    # pynvml imports (its library missing): the NVML source runs through it, the binding is never compiled.
    with_bindings = _run(_payload(tmp_path / "b", pynvml=_PYNVML_WITHOUT_LIBRARY), lab_host.root, use_nvml=True)
    assert with_bindings["loaders"].get("k3fleet_nvml") == "PayloadSourceLoader"
    assert "k3fleet_nvml_lib" not in with_bindings["loaders"]
    driver = with_bindings["facts"]["driver"]
    # NVML did not answer, so nvidia-smi was asked as well.
    assert (driver["nvml"]["status"], driver["nvml"]["bindings"], driver["source"]) == (
        "library_not_found", "pynvml", "nvidia-smi")
    assert "k3fleet_smi" in with_bindings["loaders"]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to compile the stand-in libnvidia-ml.so.1")
def test_without_pynvml_nvml_answers_through_the_binding_and_nvidia_smi_never_runs(
        tmp_path: Path, lab_host: LabHost) -> None:
    # The stand-in libnvidia-ml.so.1 of the lab host's driver (575.57.08), reading the host's
    # /proc/driver/nvidia/version; eight H200 as the lab host has.
    shim = compile_shim(tmp_path / "shim", "575.57.08")
    conf = tmp_path / "gpus.conf"
    conf.write_text(gpus_conf(8, "NVIDIA H200"), encoding="utf-8")
    (tmp_path / "machine-id").write_text("3d1219c7c4c5404aaa1f6d2a48adfda4\n", encoding="utf-8")
    env = {"NVIDIA_SIM_PROC": str(lab_host.root / "proc"), "NVIDIA_SIM_GPUS_CONF": str(conf),
           "NVIDIA_SIM_FABRIC_STATE": str(tmp_path / "fabricmanager.state"),
           "NVIDIA_SIM_MACHINE_ID": str(tmp_path / "machine-id")}
    payload = _payload(tmp_path / "payload")
    run = _run(payload, lab_host.root, use_nvml=True, library=str(shim), env=env)
    driver = run["facts"]["driver"]
    assert (driver["nvml"], driver["source"], driver["gpu_count"]) == (
        {"status": "ok", "error": None, "bindings": "k3fleet"}, "nvml", 8)
    assert {name: run["loaders"].get(name) for name in ("k3fleet_nvml_lib", "k3fleet_nvml")} == {
        "k3fleet_nvml_lib": "PayloadSourceLoader", "k3fleet_nvml": "PayloadSourceLoader"}
    assert {name: run["compiles"].get(f"{name}.py") for name in ("k3fleet_nvml_lib", "k3fleet_nvml")} == {
        "k3fleet_nvml_lib": 1, "k3fleet_nvml": 1}
    # NVML answered: nvidia-smi runs only for what NVML cannot say, the GPU/NIC topology (topo -m), where the
    # same host without the library runs it six times: its query, -q and nvlink -s, topo -m, and nvlink -e
    # at the start and the end of the visit (the NVLink error counters sampled twice).
    assert [argv[1:] for argv in _nvidia_smi_runs(run)] == [["topo", "-m"]]
    without = _run(payload, lab_host.root, use_nvml=True, library=NO_NVML_LIBRARY)
    assert [argv[1:] for argv in _nvidia_smi_runs(without)][2:] == [["-q"], ["nvlink", "-s"], ["topo", "-m"],
                                                                    ["nvlink", "-e"]]
    assert len(_nvidia_smi_runs(without)) == 6


@pytest.mark.parametrize("module", sorted(p.name for p in (COLLECTION / "plugins" / "modules").glob("k3fleet_*.py")))
def test_every_module_installs_the_finder_before_any_other_module_util(module: str) -> None:
    tree = ast.parse((COLLECTION / "plugins" / "modules" / module).read_text(encoding="utf-8"))
    order: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            order.append("import k3fleet_load" if node.module == PACKAGE and [a.name for a in node.names] == [
                "k3fleet_load"] else "import other")
        elif isinstance(node, ast.Expr) and ast.unparse(node) == "k3fleet_load.install()":
            order.append("install")
    assert order[:2] == ["import k3fleet_load", "install"] and "import other" in order[2:], order
