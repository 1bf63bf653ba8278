"""The collection's action plugins: Ansible's normal action, each source in a k3fleet module's payload compiled once.

zipimport compiles every source module it imports twice (python/cpython#141276; k3fleet_load says
why), and AnsiballZ's wrapper imports Ansible's own module_utils before any module code runs. The
action (plugins/plugin_utils/k3fleet_action.py) inserts a guarded ``k3fleet_load.install_payload()``
into the wrapper right before that import, only at ansible-core 2.19's anchor found exactly once.

The wrappers here are the real ones: Ansible builds them for a generated lab host (ad-hoc ``ansible``
with ANSIBLE_KEEP_REMOTE_FILES, through the collection's action; and the same module by its legacy
name, which Ansible runs with its own normal action). The unpatched wrapper is the action's with the
inserted call taken out, which the test shows is exactly what it inserted. Each wrapper runs in a bare
interpreter (-I -S: the standard library and the payload, as on a node). Structure only: what
compiles how often and what the module returns; no timing is asserted (scripts/bench_audit.py --node
measures it).
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from ansible.executor import module_common
from ansible.plugins.action import ActionBase
from ansible.release import __version__ as ANSIBLE_CORE
from nodetree import LabHost, counting_compiles

from ansible_collections.k3fleet.gpu.plugins.plugin_utils import k3fleet_action
from ansible_collections.k3fleet.gpu.plugins.plugin_utils.k3fleet_action import (
    ANCHOR,
    MARKER,
    SNIPPET,
    K3fleetModuleAction,
    patch_built,
    patch_wrapper,
)
from k3fleet.audit.runner import ansible_env
from k3fleet.lab.fleet import default_image

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "ansible_collections" / "k3fleet" / "gpu"
MODULES = COLLECTION / "plugins" / "modules"
FIXTURES = REPO / "tests" / "fixtures" / "ansiballz"
BIN = Path(sys.executable).parent
HOST = "gpu-0001"
IMAGE = default_image()
LOAD = "ansible_collections/k3fleet/gpu/plugins/module_utils/k3fleet_load.py"
# What the inserted call imports before its finder exists: k3fleet_load and its packages (zipimport).
BEFORE_THE_FINDER = {LOAD} | {"/".join(LOAD.split("/")[:depth]) + "/__init__.py" for depth in range(1, 6)}
# The wrapper the action patches is ansible-core 2.19's (k3fleet_action.ANCHOR); 2.17 and 2.18 build another
# (its own _ansiballz_main, no _BuiltModule), which the action ships as built. make collection-matrix runs
# this file under each series.
CORE = tuple(int(part) for part in ANSIBLE_CORE.split(".")[:2])
anchored = pytest.mark.skipif(CORE < (2, 19), reason=f"ansible-core {ANSIBLE_CORE}: no 2.19 wrapper to patch; "
                              "test_before_2_19_the_action_ships_ansibles_wrapper_as_built holds it")

# Runs an AnsiballZ file as `python AnsiballZ_x.py [explode|execute]` does, counting each compile of a
# payload source (by its path inside the payload zip) into the JSON file argv[2].
_COUNTED = counting_compiles('name.split("_payload.zip/", 1)[1] if "_payload.zip/" in name else None') + r"""
import json, runpy, sys
wrapper, report = sys.argv[1], sys.argv[2]
sys.argv = [wrapper] + sys.argv[3:]
try:
    runpy.run_path(wrapper, run_name="__main__")
finally:
    with open(report, "w") as out:
        json.dump(compiles, out)
"""


@dataclasses.dataclass
class WrapperRun:
    stdout: str
    counts: dict[str, int]


def _run_wrapper(wrapper: Path, report: Path, *argv: str) -> WrapperRun:
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _COUNTED, str(wrapper), str(report), *argv],
                          capture_output=True, text=True, check=False, timeout=120, cwd=wrapper.parent)
    # A module exits 0 with its JSON on stdout (also a failed one: "failed" is in the JSON).
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-2000:]
    counts: dict[str, int] = json.loads(report.read_text())
    return WrapperRun(done.stdout, counts)


def _timeless(stdout: str) -> str:
    """A module's output with the values that are clock readings taken out, every other byte as it was."""
    out = re.sub(r'"(duration|duration_s)": [0-9.e-]+', r'"\1": 0', stdout)
    return re.sub(r'"collected_at": "[^"]*"', '"collected_at": ""', out)


def _comparable(facts: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in facts.items() if k not in ("collected_at", "duration_s")}
    out["commands"] = [{k: v for k, v in c.items() if k != "duration"} for c in facts["commands"]]
    return out


def _zip_of(wrapper: bytes) -> tuple[str, bytes]:
    """(base64 text, zip bytes) of the payload an AnsiballZ wrapper carries (its zip_data argument)."""
    for node in ast.walk(ast.parse(wrapper)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_ansiballz_main":
            for keyword in node.keywords:
                if keyword.arg == "zip_data":
                    text = ast.literal_eval(keyword.value)
                    return text, base64.b64decode(text)
    raise AssertionError("no _ansiballz_main(zip_data=...) in the wrapper")


def _audit_args(lab: LabHost) -> dict[str, Any]:
    # As the audit play passes them on the lab (playbooks/audit.yml), without the probe.
    return {"host": lab.name, "image": IMAGE, "root": str(lab.root), "path": str(lab.root / "bin"),
            "use_nvml": False, "probe": False}


def _adhoc(lab: LabHost, tmp: Path, *, module: str = "k3fleet.gpu.k3fleet_host_info", pipelining: bool,
           keep: bool = False, library: Path | None = None) -> tuple[dict[str, Any], Path | None]:
    """One ad-hoc ``ansible`` run of ``module`` on the lab host: (its result, the kept AnsiballZ file or None)."""
    remote = tmp / "remote"
    env = {**os.environ, **ansible_env(), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "ANSIBLE_PIPELINING": str(pipelining), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_REMOTE_TMP": str(remote)}
    if keep:
        env["ANSIBLE_KEEP_REMOTE_FILES"] = "1"
    if library is not None:
        env["ANSIBLE_LIBRARY"] = str(library)
    done = subprocess.run([str(BIN / "ansible"), lab.name, "-i", str(lab.inventory), "-m", module,
                           "-a", json.dumps(_audit_args(lab))], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # Ad-hoc output is "gpu-0001 | SUCCESS => {json}".
    head, _, body = done.stdout.partition(" => ")
    assert head.strip() == f"{lab.name} | SUCCESS", done.stdout[-2000:]
    kept = sorted(remote.glob("ansible-tmp-*/AnsiballZ_*.py")) if keep else []
    if keep:
        assert len(kept) == 1, kept
    result: dict[str, Any] = json.loads(body)
    return result, kept[0] if kept else None


@dataclasses.dataclass
class Wrappers:
    patched: Path
    unpatched: Path
    result: dict[str, Any]


@pytest.fixture(scope="module")
def wrappers(lab_host: LabHost, tmp_path_factory: pytest.TempPathFactory) -> Wrappers:
    """The AnsiballZ file the collection's action built for k3fleet_host_info (not pipelined, kept),
    and the same without the call the action inserted."""
    tmp = tmp_path_factory.mktemp("kept")
    result, kept = _adhoc(lab_host, tmp, pipelining=False, keep=True)
    assert kept is not None
    patched = tmp / "AnsiballZ_k3fleet_host_info.py"
    shutil.copyfile(kept, patched)
    unpatched = tmp_path_factory.mktemp("unpatched") / "AnsiballZ_k3fleet_host_info.py"
    unpatched.write_bytes(patched.read_bytes().replace(SNIPPET, b""))
    return Wrappers(patched, unpatched, result)


@pytest.fixture(scope="module")
def runs(wrappers: Wrappers, tmp_path_factory: pytest.TempPathFactory) -> dict[str, WrapperRun]:
    tmp = tmp_path_factory.mktemp("runs")
    return {"patched": _run_wrapper(wrappers.patched, tmp / "patched.json"),
            "unpatched": _run_wrapper(wrappers.unpatched, tmp / "unpatched.json")}


@anchored
def test_the_action_inserts_the_call_once_right_before_ansibles_module_utils(wrappers: Wrappers) -> None:
    patched = wrappers.patched.read_bytes()
    unpatched = wrappers.unpatched.read_bytes()
    assert patched.count(MARKER) == 1 and patched.count(SNIPPET) == 1
    # What the action changed is exactly what patch_wrapper inserts at the anchor: Ansible's normal
    # action would have shipped the unpatched file.
    assert unpatched.count(ANCHOR) == 1 and MARKER not in unpatched
    assert patch_wrapper(unpatched) == patched
    assert b"sys.path.insert(0, modlib_path)\n" + SNIPPET + b"\n        from ansible.module_utils._internal" in patched


@anchored
def test_the_patched_payload_compiles_every_source_once(wrappers: Wrappers, runs: dict[str, WrapperRun]) -> None:
    patched, unpatched = runs["patched"].counts, runs["unpatched"].counts
    # The same sources are imported either way.
    assert set(patched) == set(unpatched)
    # Without the call zipimport compiles each twice: Ansible's basic, the module itself, the rest.
    module = "ansible_collections/k3fleet/gpu/plugins/modules/k3fleet_host_info.py"
    assert unpatched["ansible/module_utils/basic.py"] == 2 and unpatched[module] == 2
    assert sum(unpatched.values()) > sum(patched.values())
    # With it every one compiles once, except what the call itself imports before its finder exists and
    # the packages whose __init__ asks every importer on sys.path again (pkgutil.extend_path: zipimport's
    # find_spec compiles the source to name the file).
    with zipfile.ZipFile(io.BytesIO(_zip_of(wrappers.patched.read_bytes())[1])) as zf:
        extend_path = {name for name in zf.namelist() if name.endswith("/__init__.py")
                       and b"extend_path(" in zf.read(name)}
    twice = {name for name, count in patched.items() if count > 1}
    assert twice <= BEFORE_THE_FINDER | extend_path, twice - BEFORE_THE_FINDER - extend_path
    assert all(count <= 2 for count in patched.values())
    ansible_modules = {name: count for name, count in patched.items()
                       if name.startswith("ansible/module_utils/") and not name.endswith("/__init__.py")}
    assert {"ansible/module_utils/basic.py", "ansible/module_utils/_internal/_ansiballz/_loader.py"} <= set(
        ansible_modules)
    assert set(ansible_modules.values()) == {1}
    assert patched[module] == 1


@pytest.mark.skipif(CORE >= (2, 19), reason="ansible-core 2.19 and later: the action patches the wrapper")
def test_before_2_19_the_action_ships_ansibles_wrapper_as_built(wrappers: Wrappers) -> None:
    built = wrappers.patched.read_bytes()
    # The kept file is what the action sent: Ansible's own wrapper, with no call inserted and no 2.19 anchor.
    assert b"_ansiballz_main" in built and MARKER not in built and ANCHOR not in built
    assert patch_wrapper(built) == built
    assert wrappers.result["k3fleet"]["host"] == HOST


def test_the_module_returns_the_same_bytes_with_and_without_the_call(runs: dict[str, WrapperRun]) -> None:
    patched, unpatched = runs["patched"].stdout, runs["unpatched"].stdout
    assert json.loads(patched)["k3fleet"]["host"] == HOST
    # Byte for byte, once the clock readings (collected_at, durations) are set aside.
    assert _timeless(patched) == _timeless(unpatched)


@anchored
def test_an_exception_in_the_inserted_call_leaves_the_run_as_ansible_built_it(
        wrappers: Wrappers, runs: dict[str, WrapperRun], tmp_path: Path) -> None:
    # The payload's k3fleet_load fails in install_payload: the module runs as unpatched, compiles included.
    data = wrappers.patched.read_bytes()
    text, zip_bytes = _zip_of(data)
    source = zipfile.ZipFile(io.BytesIO(zip_bytes))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as broken:
        for info in source.infolist():
            body = source.read(info)
            if info.filename == LOAD:
                body += b"\n\ndef install_payload():\n    raise RuntimeError('install_payload failed')\n"
            broken.writestr(info, body)
    assert data.count(text.encode()) == 1
    wrapper = tmp_path / "AnsiballZ_k3fleet_host_info.py"
    wrapper.write_bytes(data.replace(text.encode(), base64.b64encode(out.getvalue())))
    run = _run_wrapper(wrapper, tmp_path / "broken.json")
    assert _timeless(run.stdout) == _timeless(runs["unpatched"].stdout)
    assert run.counts == runs["unpatched"].counts


def test_kept_remote_files_explode_and_execute_as_before(wrappers: Wrappers, runs: dict[str, WrapperRun],
                                                          tmp_path: Path) -> None:
    wrapper = tmp_path / wrappers.patched.name
    shutil.copyfile(wrappers.patched, wrapper)
    exploded = _run_wrapper(wrapper, tmp_path / "explode.json", "explode")
    assert exploded.stdout.startswith("Module expanded into:")
    assert (tmp_path / "debug_dir" / "ansible" / "module_utils" / "basic.py").is_file()
    executed = _run_wrapper(wrapper, tmp_path / "execute.json", "execute")
    # The exploded tree runs from files, not from the zip: nothing of the finder, the same result.
    assert executed.counts == {}
    assert _timeless(executed.stdout) == _timeless(runs["unpatched"].stdout)


@anchored
def test_pipelined_and_not_the_result_is_that_of_ansibles_normal_action(
        lab_host: LabHost, wrappers: Wrappers, tmp_path_factory: pytest.TempPathFactory) -> None:
    pipelined, _ = _adhoc(lab_host, tmp_path_factory.mktemp("pipelined"), pipelining=True)
    # The same module by its legacy name (ANSIBLE_LIBRARY): no action plugin of that name, so Ansible's
    # own normal action runs it, and its wrapper is Ansible's, unpatched.
    normal, kept = _adhoc(lab_host, tmp_path_factory.mktemp("normal"), module="k3fleet_host_info", pipelining=False,
                          keep=True, library=MODULES)
    assert kept is not None and MARKER not in kept.read_bytes() and kept.read_bytes().count(ANCHOR) == 1
    expected = _comparable(normal["k3fleet"])
    assert _comparable(pipelined["k3fleet"]) == expected
    assert _comparable(wrappers.result["k3fleet"]) == expected
    # The rest of the task's result (changed, what the callback shows) is the same too.
    rest = {k: v for k, v in normal.items() if k != "k3fleet"}
    assert {k: v for k, v in pipelined.items() if k != "k3fleet"} == rest
    assert {k: v for k, v in wrappers.result.items() if k != "k3fleet"} == rest


# -- the patch itself -------------------------------------------------------------------------------


def test_ansible_cores_wrapper_has_the_anchor_once_with_and_without_comments() -> None:
    ansiballz = pytest.importorskip("ansible._internal._ansiballz")
    code = (Path(ansiballz.__file__).parent / "_wrapper.py").read_text()
    # Ansible strips comments unless remote files are kept (module_common._strip_comments).
    for text in (code, module_common._strip_comments(code)):
        data = text.encode()
        assert data.count(ANCHOR) == 1
        assert patch_wrapper(data).count(SNIPPET) == 1


def test_a_wrapper_without_the_anchor_goes_out_unchanged() -> None:
    # ansible-core 2.17/2.18: invoke_module imports basic itself, there is no _loader import.
    older = (FIXTURES / "ansible-core-2.18.19_invoke_module.txt").read_bytes()
    assert b"sys.path.insert(0, modlib_path)" in older and ANCHOR not in older
    assert patch_wrapper(older) is older
    # Twice (a wrapper this was not written for), or already patched: unchanged as well.
    twice = ANCHOR + b"\n" + ANCHOR
    assert patch_wrapper(twice) is twice
    once = patch_wrapper(ANCHOR)
    assert once != ANCHOR and patch_wrapper(once) is once
    # Another indentation is another wrapper.
    shifted = ANCHOR.replace(b"        ", b"    ")
    assert patch_wrapper(shifted) is shifted


@anchored
def test_only_this_collections_new_style_modules_are_patched() -> None:
    built = module_common._BuiltModule(b_module_data=ANCHOR, module_style="new", shebang="#!/usr/bin/python3",
                                       serialization_profile="legacy")
    ours = str(MODULES / "k3fleet_host_info.py")
    patched = patch_built(built, ours)
    assert patched.b_module_data == patch_wrapper(ANCHOR)
    assert (patched.module_style, patched.shebang, patched.serialization_profile) == (
        "new", "#!/usr/bin/python3", "legacy")
    # Ansible's own modules (the async wrapper _execute_module builds too) and other styles: as built.
    command = str(Path(module_common.__file__).parents[1] / "modules" / "command.py")
    assert patch_built(built, command) is built
    binary = dataclasses.replace(built, module_style="binary")
    assert patch_built(binary, ours) is binary
    assert patch_built(built, None) is built


def test_the_action_takes_both_shapes_of_configure_module(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = str(MODULES / "k3fleet_journal.py")
    action = object.__new__(K3fleetModuleAction)
    # ansible-core 2.17 and 2.18 return (style, shebang, data, path).
    monkeypatch.setattr(ActionBase, "_configure_module", lambda self, module_name, module_args, task_vars: (
        "new", "#!/usr/bin/python3", ANCHOR, ours))
    assert action._configure_module("k3fleet.gpu.k3fleet_journal", {}, {}) == (
        "new", "#!/usr/bin/python3", patch_wrapper(ANCHOR), ours)
    older = (FIXTURES / "ansible-core-2.18.19_invoke_module.txt").read_bytes()
    monkeypatch.setattr(ActionBase, "_configure_module", lambda self, module_name, module_args, task_vars: (
        "new", "#!/usr/bin/python3", older, ours))
    assert action._configure_module("k3fleet.gpu.k3fleet_journal", {}, {})[2] is older


@pytest.mark.parametrize("module", sorted(p.stem for p in MODULES.glob("k3fleet_*.py")))
def test_every_module_has_the_action(module: str) -> None:
    plugin = importlib.import_module(f"ansible_collections.k3fleet.gpu.plugins.action.{module}")
    assert issubclass(plugin.ActionModule, K3fleetModuleAction)
    assert os.path.dirname(os.path.realpath(MODULES / f"{module}.py")) == k3fleet_action.MODULES_DIR


# -- the whole-payload finder against zipimport --------------------------------------------------------

# Imports from a zip first on sys.path, with or without the whole-payload finder, and reports what the
# import system made of each name: loader kind, file, package path, spec, a package resource, compiles.
_FIDELITY = counting_compiles('name.split(".zip/")[-1] if ".zip/" in name else None') + r"""
import json, sys
payload, finder, first = sys.argv[1:4]
sys.path.insert(0, payload)
if first:
    sys.path.insert(0, first)
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load
installed = k3fleet_load.install_payload() if finder == "1" else None
import importlib, importlib.util
import top, pkg, pkg.mod, pkg.sub, pkg.sub.leaf, json as stdlib_json
try:
    from importlib.resources import files
    resource = files("pkg").joinpath("data.txt").read_text()
except ImportError:
    from importlib.resources import read_text
    resource = read_text("pkg", "data.txt")
report = {}
for name in ("top", "pkg", "pkg.mod", "pkg.sub", "pkg.sub.leaf"):
    mod = sys.modules[name]
    spec = mod.__spec__
    report[name] = {"loader": type(mod.__loader__).__name__, "file": mod.__file__,
                    "path": list(getattr(mod, "__path__", [])) or None, "origin": spec.origin,
                    "cached": spec.cached, "locations": list(spec.submodule_search_locations or []) or None,
                    "package": mod.__package__, "source": mod.__loader__.get_source(name),
                    "value": getattr(mod, "VALUE", None),
                    # importlib.resources on Python 3.9 reads a package's files from loader.archive.
                    "archive": getattr(mod.__loader__, "archive", None)}
print(json.dumps({"installed": installed is not None, "report": report, "resource": resource,
                  "json": stdlib_json.__file__, "pkg_sub_leaf": pkg.sub.leaf.VALUE,
                  "compiles": compiles}))
"""


def _fidelity_payload(path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        parts = LOAD.split("/")
        for depth in range(1, len(parts)):
            zf.writestr("/".join(parts[:depth]) + "/__init__.py", "")
        zf.write(COLLECTION / "plugins" / "module_utils" / "k3fleet_load.py", LOAD)
        zf.writestr("top.py", "VALUE = 'top from the zip'\n")
        zf.writestr("pkg/__init__.py", "VALUE = 'pkg'\n")
        zf.writestr("pkg/data.txt", "a resource of pkg\n")
        zf.writestr("pkg/mod.py", "# -*- coding: utf-8 -*-\r\nVALUE = 'caf\xe9'\r\n")
        zf.writestr("pkg/sub/__init__.py", "")
        zf.writestr("pkg/sub/leaf.py", "from .. import mod\nVALUE = mod.VALUE + ' via leaf'\n")
    return path


def _fidelity(payload: Path, *, finder: bool, first: str = "") -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _FIDELITY, str(payload), "1" if finder else "0", first],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_whole_payload_finder_answers_as_zipimport_with_one_compile(tmp_path: Path) -> None:
    payload = _fidelity_payload(tmp_path / "x_payload.zip")
    with_finder = _fidelity(payload, finder=True)
    without = _fidelity(payload, finder=False)
    assert with_finder["installed"] and not without["installed"]
    ours = ["top.py", "pkg/__init__.py", "pkg/mod.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py"]
    assert {name: without["compiles"][name] for name in ours} == dict.fromkeys(ours, 2)
    assert {name: with_finder["compiles"][name] for name in ours} == dict.fromkeys(ours, 1)
    # Everything else the import system shows is the same: files, package paths, specs, sources,
    # a package's resource read from the zip, relative imports, the standard library.
    assert {name: entry["loader"] for name, entry in without["report"].items()} == dict.fromkeys(
        without["report"], "zipimporter")
    assert {name: entry["loader"] for name, entry in with_finder["report"].items()} == dict.fromkeys(
        with_finder["report"], "PayloadSourceLoader")
    for name, entry in without["report"].items():
        assert {k: v for k, v in with_finder["report"][name].items() if k != "loader"} == {
            k: v for k, v in entry.items() if k != "loader"}, name
    assert with_finder["resource"] == without["resource"] == "a resource of pkg\n"
    assert with_finder["pkg_sub_leaf"] == "caf\xe9 via leaf"
    assert with_finder["json"] == without["json"]


def test_the_whole_payload_finder_stands_aside_where_the_zip_is_not_first(tmp_path: Path) -> None:
    payload = _fidelity_payload(tmp_path / "x_payload.zip")
    ahead = tmp_path / "ahead"
    ahead.mkdir()
    (ahead / "top.py").write_text("VALUE = 'top from a directory ahead of the zip'\n")
    run = _fidelity(payload, finder=True, first=str(ahead))
    assert run["installed"]
    # A directory ahead of the zip on sys.path wins, as without the finder; the zip's packages still
    # load through the finder once the search reaches them.
    assert run["report"]["top"]["value"] == "top from a directory ahead of the zip"
    assert run["report"]["top"]["loader"] == "SourceFileLoader"
    # pkg itself is found by the path finder in the zip (the finder answers no top-level name there);
    # its submodules, whose search path is the zip alone, through the finder.
    assert run["report"]["pkg"]["loader"] == "zipimporter"
    assert run["report"]["pkg.mod"]["loader"] == "PayloadSourceLoader"
    assert run["report"]["pkg.sub.leaf"]["value"] == "caf\xe9 via leaf"
