"""The outcomes contract (docs/decision.md "Precedence"): the outcome names, their words, their report
status and the audit's and the decision's orders are defined in k3fleet/contracts.py alone; the audit,
the decision, the reports and the schemas read them there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from k3fleet import contracts
from k3fleet.contracts import (
    AUDIT_OUTCOMES,
    AUDIT_PRECEDENCE,
    DECISION_PRECEDENCE,
    OUTCOME_RANK,
    OUTCOME_STATUS,
    OUTCOME_TEXT,
    OUTCOMES,
    first_outcome,
    worst_outcome,
)
from k3fleet.models.evidence import Decision
from k3fleet.models.findings import FleetVerdict

ROOT = Path(__file__).resolve().parents[2]
NAMES = set(AUDIT_OUTCOMES)


def _spelt_together(node: ast.AST) -> list[str]:
    """Outcome names spelt as string constants directly inside one literal collection or subscript."""
    if isinstance(node, ast.Dict):
        items: list[ast.expr | None] = list(node.keys)
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = list(node.elts)
    elif isinstance(node, ast.Subscript):
        s = node.slice
        items = list(s.elts) if isinstance(s, ast.Tuple) else [s]
    else:
        return []
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in NAMES]


def test_outcome_names_are_defined_in_one_module() -> None:
    """No module but contracts.py lists two outcome names in one literal (a Literal, tuple, set or dict)."""
    offenders: list[str] = []
    for path in sorted((ROOT / "k3fleet").rglob("*.py")):
        if path == ROOT / "k3fleet" / "contracts.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if len(_spelt_together(node)) >= 2:
                offenders.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}")
    assert offenders == []
    # And no stylesheet or template names them as classes either (a grep: name after "o-" or in a CSS rule).
    spelt = [str(p.relative_to(ROOT)) for p in (ROOT / "k3fleet").rglob("*.py")
             if re.search(r"[.-]o-(go_live|observe_with_limits|rebuild_environment|expand_capacity)\b",
                          p.read_text(encoding="utf-8"))]
    assert spelt == []


def test_each_outcome_has_its_words_and_status() -> None:
    assert set(OUTCOME_TEXT) == set(OUTCOME_STATUS) == set(AUDIT_OUTCOMES) == {*OUTCOMES, "incomplete"}
    assert sorted(AUDIT_PRECEDENCE) == sorted(AUDIT_OUTCOMES)
    assert sorted(DECISION_PRECEDENCE) == sorted(OUTCOMES)
    assert [o for o in sorted(OUTCOME_RANK, key=OUTCOME_RANK.__getitem__, reverse=True)] == list(DECISION_PRECEDENCE)


def test_the_two_orders_differ_only_where_said() -> None:
    """The audit gives expand_capacity before rebuild_environment, the decision ranks them the other way."""
    assert first_outcome(["rebuild_environment", "expand_capacity", "observe_with_limits"]) == "expand_capacity"
    assert worst_outcome(["expand_capacity", "rebuild_environment", "observe_with_limits"]) == "rebuild_environment"
    audit = [o for o in AUDIT_PRECEDENCE if o != "incomplete"]
    assert audit[2:] == list(DECISION_PRECEDENCE[2:])
    assert audit[:2] == list(reversed(DECISION_PRECEDENCE[:2]))
    assert worst_outcome([], floor="observe_with_limits") == "observe_with_limits"
    assert worst_outcome(["go_live"], floor="observe_with_limits") == "observe_with_limits"


def test_docs_state_both_orders_and_the_reason() -> None:
    text = (ROOT / "docs" / "decision.md").read_text(encoding="utf-8")
    section = text.split("### Precedence", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    for name in ("AUDIT_PRECEDENCE", "DECISION_PRECEDENCE"):
        order = getattr(contracts, name)
        line = next(chunk for chunk in section.split("\n- ")[1:] if f"`{name}`" in chunk)
        assert [o for o in re.findall(r"`([a-z_]+)`", line) if o in NAMES] == list(order)
    assert "after* the planned driver change" in section and "measured again" in section


def test_schemas_carry_the_contract_outcomes() -> None:
    verdict = FleetVerdict.model_json_schema()["properties"]["outcome"]
    assert tuple(verdict["enum"]) == AUDIT_OUTCOMES
    decision = Decision.model_json_schema()["properties"]["outcome"]
    assert tuple(decision["enum"]) == OUTCOMES
