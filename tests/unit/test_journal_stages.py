"""The journal stages are one list, the journal format's (module_utils/k3fleet_journal_format.py):
the module's documented choices, its argument spec, the controller's reader and every stage a
playbook or role journals are held to it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import yaml

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_journal_format as fmt
from ansible_collections.k3fleet.gpu.plugins.modules import k3fleet_journal
from k3fleet.change import journal
from k3fleet.paths import collection_root, data_dir

_MODULE_NAMES = ("k3fleet.gpu.k3fleet_journal", "k3fleet_journal")


def test_module_documentation_choices_are_the_format_stages() -> None:
    doc = yaml.safe_load(k3fleet_journal.DOCUMENTATION)
    assert doc["options"]["stage"]["choices"] == list(fmt.STAGES)
    assert k3fleet_journal.ARGUMENT_SPEC["stage"]["choices"] == list(fmt.STAGES)


def test_reader_takes_the_format_stages() -> None:
    assert journal.STAGES is fmt.STAGES
    assert get_args(journal.JournalEntry.model_fields["stage"].annotation) == fmt.STAGES


def test_stage_subsets_are_stages() -> None:
    for subset in (fmt.OUT_STAGES, fmt.TOUCHED_STAGES, fmt.CHANGED_STAGES):
        assert subset and set(subset) <= set(fmt.STAGES), subset


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _tasks(value)
    elif isinstance(node, list):
        for item in node:
            yield from _tasks(item)


def _journaled_stages(path: Path) -> set[str]:
    """Every stage the file's k3fleet_journal calls name; a templated stage names its quoted choices."""
    found: set[str] = set()
    for task in _tasks(yaml.safe_load(path.read_text(encoding="utf-8"))):
        for name in _MODULE_NAMES:
            args = task.get(name)
            if isinstance(args, dict) and "stage" in args:
                stage = str(args["stage"])
                found.update(re.findall(r"'([a-z_]+)'", stage) if "{{" in stage else [stage])
    return found


def test_every_journaled_stage_is_a_format_stage() -> None:
    files = sorted(data_dir("playbooks").glob("*.yml")) + sorted((collection_root() / "roles").rglob("*.yml"))
    # Keyed by path: every stage role journals from its own tasks/main.yml.
    per_file = {str(p): _journaled_stages(p) for p in files}
    used = set().union(*per_file.values())
    # The change night's stage roles and the rollback journal the whole way through, so most stages are named.
    assert {"snapshot", "draining", "returned", "failed", "rolled_back", "held"} <= used, per_file
    assert used <= set(fmt.STAGES), sorted(used - set(fmt.STAGES))
