"""The project's own reference in docs/: the check catalogue equals `k3fleet checks --markdown`,
every check names a facts section that exists, and nothing cites notes outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from k3fleet.cli.base import main
from k3fleet.targets import load_target
from k3fleet.verdict import CHECKS, catalogue_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_checks_md_is_the_cli_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checks", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert (DOCS / "checks.md").read_text(encoding="utf-8") == printed, (
        "docs/checks.md is stale: run `.venv/bin/k3fleet checks --markdown > docs/checks.md`")
    assert printed == catalogue_markdown(load_target(None)) + "\n"


def test_every_check_is_documented_with_a_facts_section_that_exists() -> None:
    text = (DOCS / "checks.md").read_text(encoding="utf-8")
    facts = (DOCS / "facts.md").read_text(encoding="utf-8")
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", facts, flags=re.M)}
    architecture = (DOCS / "architecture.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## (.+)$", architecture, flags=re.M))
    for check_id, check in CHECKS.items():
        assert f"`{check_id}`" in text, check_id
        cited = [int(n) for ref in re.findall(r"docs/facts\.md sections? ([\d ,and-]+)", check.source)
                 for n in re.findall(r"\d+", ref)]
        quoted = re.findall(r'docs/architecture\.md "([^"]+)"', check.source)
        assert cited or quoted, (check_id, check.source)
        assert set(cited) <= sections, (check_id, cited)
        assert set(quoted) <= headings, (check_id, quoted)
        # The facts page says which section each check relies on.
        if cited:
            assert any(f"`{check_id}`" in facts.split(f"## {n}. ", 1)[1].split("\n## ", 1)[0] for n in cited), check_id


def test_docs_index_lists_the_pages() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in ("architecture.md", "facts.md", "checks.md"):
        assert f"]({page})" in index and (DOCS / page).is_file()


CITE = re.compile(r"\.\./shared|\b(DESIGN|FACTS|TESTBED|STYLE)\.md")


def test_nothing_cites_notes_outside_the_repository() -> None:
    offenders = []
    for top in ("k3fleet", "ansible_collections", "playbooks", "tests", "scripts", "inventories", "molecule", "docs"):
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or path.suffix not in (".py", ".md", ".yml", ".yaml", ".txt", ".c", ".j2", ".cfg"):
                continue
            if path == Path(__file__):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1)
                          if CITE.search(line)]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    offenders += [f"README.md:{n}" for n, line in enumerate(readme.splitlines(), 1) if CITE.search(line)]
    assert offenders == []
