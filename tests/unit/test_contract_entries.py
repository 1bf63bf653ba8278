"""One way into each contract (docs/architecture.md "Contracts"): the exit codes and the code of one
result come from k3fleet.contracts, a pydantic error becomes one line through k3fleet.errors'
validation_line. Source scans hold that no module goes round them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_host
from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, result_code
from k3fleet.errors import error_location, validation_line
from k3fleet.models import facts

ROOT = Path(__file__).resolve().parents[2]
CODES = {"EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INCOMPLETE", "EXIT_CODES", "combine", "result_code"}


def _modules() -> list[Path]:
    return sorted((ROOT / "k3fleet").rglob("*.py"))


def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_exit_codes_are_imported_from_contracts_only() -> None:
    wrong: list[str] = []
    for path in [*_modules(), *sorted((ROOT / "tests").rglob("*.py"))]:
        for node in ast.walk(ast.parse(_source(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "k3fleet.errors":
                wrong += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name in CODES]
    assert wrong == []


def test_no_module_computes_a_result_code_itself() -> None:
    """``1 if ... else 0`` (or the other way round) as an exit code is result_code()'s job."""
    pattern = re.compile(r"\b(return|exit_code\s*=)\s*[0-3] if .+ else [0-3]\s*$", re.M)
    found = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}" for p in _modules()
             if "lab/testbed/files" not in str(p) for m in pattern.finditer(_source(p))
             if "exit" in _source(p)[max(0, m.start() - 300):m.start()]]
    assert found == []


@pytest.mark.parametrize(("failed", "incomplete", "want"), [
    (False, False, EXIT_OK), (True, False, EXIT_FAILED), (False, True, EXIT_INCOMPLETE), (True, True, EXIT_FAILED)])
def test_result_code(failed: bool, incomplete: bool, want: int) -> None:
    assert result_code(failed=failed, incomplete=incomplete) == want


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str
    timeout_s: float = 1.0


def _error(data: dict[str, object]) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        _Options.model_validate(data)
    return info.value


def test_validation_line_words() -> None:
    assert validation_line(_error({"base_url": "x", "timeout_s": "soon"})) == \
        "timeout_s: Input should be a valid number, unable to parse string as a number"
    assert validation_line(_error({"base_url": "x", "timeout_s": "soon"}), "options", show_input=True) == \
        "options: timeout_s: Input should be a valid number, unable to parse string as a number (got 'soon')"
    assert validation_line(_error({"timeout_s": 1, "extra": 1}), option=True) == "--base-url: Field required (+1 more)"
    assert validation_line(_error({"base_url": "x", "colour": 1}), at="data.") == "data.colour: unknown key (misspelt?)"
    assert error_location(()) == "(top level)" and error_location((), at="data.") == "data"


def test_pydantic_errors_are_formatted_in_one_place() -> None:
    """No module but errors.py words a pydantic error's message or counts its errors (a module may walk
    the errors, as the target loader does to name every field, and words each through errors.py)."""
    pattern = re.compile(r"""\[["']msg["']\]|\.error_count\(\)""")
    found = [str(p.relative_to(ROOT)) for p in _modules()
             if p.name != "errors.py" and pattern.search(_source(p))]
    assert found == []


def test_redaction_has_one_way_in() -> None:
    """The controller reaches the collection's redaction rules through k3fleet.evidence.redact only, and
    that module imports no private name of the rules module."""
    rules = "ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_redact"
    direct: list[str] = []
    private: list[str] = []
    for path in _modules():
        for node in ast.walk(ast.parse(_source(path))):
            if isinstance(node, ast.ImportFrom) and node.module == rules:
                if path != ROOT / "k3fleet" / "evidence" / "redact.py":
                    direct.append(str(path.relative_to(ROOT)))
                private += [a.name for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Import) and any(a.name == rules for a in node.names):
                direct.append(str(path.relative_to(ROOT)))
    assert (direct, private) == ([], [])


def test_the_facts_schema_version_is_defined_once_and_checked_once() -> None:
    """Its value is written in the collection's k3fleet_sources (nodes stamp it; the controller reads it
    from there), and only k3fleet.models.facts compares major versions."""
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_host, k3fleet_sources
    from k3fleet.models import facts

    assert facts.SCHEMA_VERSION == k3fleet_host.SCHEMA_VERSION == k3fleet_sources.FACTS_SCHEMA_VERSION
    literal = re.compile(r"""^\s*(FACTS_)?SCHEMA_VERSION(: str)? = ["']\d""", re.M)
    utils = ROOT / "ansible_collections" / "k3fleet" / "gpu" / "plugins" / "module_utils"
    defined = [p.name for p in [ROOT / "k3fleet" / "models" / "facts.py", *utils.glob("*.py")]
               if literal.search(_source(p))]
    assert defined == ["k3fleet_sources.py"]
    split = re.compile(r"schema_version.{0,40}\.split\(|SCHEMA_VERSION\.split\(")
    assert [str(p.relative_to(ROOT)) for p in _modules()
            if p.name != "facts.py" and split.search(_source(p))] == []
    assert facts.readable_schema({"schema_version": "1.0"}) and facts.readable_schema("1.9")
    assert not facts.readable_schema({"schema_version": "2.0"}) and not facts.readable_schema({})
    assert facts.schema_mismatch("h", {"schema_version": "2.0"}) == \
        f"host h: facts schema '2.0' from the node, controller expects {facts.SCHEMA_VERSION}"


def test_one_run_directory_reader() -> None:
    """RunReader is the one class that reads a run directory back; every run-file name is the layout's."""
    readers = [f"{p.relative_to(ROOT)}:{n.name}" for p in _modules() for n in ast.walk(ast.parse(_source(p)))
               if isinstance(n, ast.ClassDef) and n.name.endswith("Reader") and "evidence" in str(p)]
    assert readers == ["k3fleet/evidence/reader.py:RunReader"]
    from k3fleet.evidence import RunDir

    assert not [m for m in vars(RunDir) if m.startswith("read")]
    names = {v for k, v in vars(__import__("k3fleet.evidence.layout", fromlist=["x"])).items()
             if k.isupper() and isinstance(v, str) and "." in v and "/" not in v and not v.startswith(".")}
    spelt: list[str] = []
    for path in _modules():
        if path.name == "layout.py":
            continue
        for node in ast.walk(ast.parse(_source(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hits = [n for n in names if node.value == n or node.value.endswith("/" + n)
                        or node.value.startswith("/" + n)]
                spelt += [f"{path.relative_to(ROOT)}:{node.lineno}: {h}" for h in hits]
    assert spelt == []


def test_the_packaged_target_is_only_the_clis_default() -> None:
    """A flow takes the run's target (given, or recorded by the runs it reads); only the CLI names the
    packaged default outright."""
    found = [str(p.relative_to(ROOT)) for p in _modules()
             if "/cli/" not in str(p) and "load_target(None)" in _source(p).replace("``load_target(None)``", "")]
    assert found == []


def test_run_files_are_written_through_their_models() -> None:
    """run.json, accept.json and triage.json are written as their model's dump (models/evidence.py), never
    as a dict literal that only a reader models."""
    from k3fleet.models import evidence

    written = {"RUN": "RunRecord", "ACCEPT": "AcceptRecord", "TRIAGE": "TriageRecord"}
    literal: list[str] = []
    writes = 0
    for path in _modules():
        for node in ast.walk(ast.parse(_source(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("write_json", "json") and len(node.args) == 2):
                continue
            name = ast.unparse(node.args[0]).removeprefix("layout.")
            if name in written:
                writes += 1
                if isinstance(node.args[1], ast.Dict):
                    literal.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert literal == [] and writes >= 7
    for model in written.values():
        assert getattr(evidence, model).__module__ == "k3fleet.models.evidence"
    # One model of each: no other module defines a class of these names.
    others = [f"{p.relative_to(ROOT)}:{n.name}" for p in _modules() if p.name != "evidence.py"
              for n in ast.walk(ast.parse(_source(p))) if isinstance(n, ast.ClassDef) and n.name in written.values()]
    assert others == []


def test_report_views_and_targets_are_typed() -> None:
    """The report views take the evidence models (models/evidence.py sits below report), and a target is
    a Target wherever it is passed: no ``: Any`` parameter in report/view.py, no ``target: Any``."""
    untyped = [f"{p.relative_to(ROOT)}:{a.lineno}" for p in _modules() for n in ast.walk(ast.parse(_source(p)))
               if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for a in n.args.args + n.args.kwonlyargs
               if a.annotation is not None and ast.unparse(a.annotation) == "Any"
               and ((p.name == "view.py" and p.parent.name == "report") or a.arg == "target")]
    assert untyped == []


def test_node_module_and_controller_agree_on_schema_version() -> None:
    assert k3fleet_host.SCHEMA_VERSION == facts.SCHEMA_VERSION
