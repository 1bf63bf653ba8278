"""Every command's --help: text for every option and argument, no ``<bool>`` beside a flag, and
usage lines in the usual shape (``RUNS...``, never ``{runs}``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from k3fleet.cli.base import app, register_commands


def _commands() -> Iterator[tuple[list[str], Any]]:
    register_commands()
    root = typer.main.get_command(app)

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    yield from walk(root, [])


COMMANDS = list(_commands())


def test_every_option_and_argument_has_help_text() -> None:
    missing = [f"k3fleet {' '.join(path)} {p.opts[0] if p.opts else p.name}" for path, cmd in COMMANDS
               for p in cmd.params if p.name != "help" and not (getattr(p, "help", None) or "").strip()]
    assert not missing, missing


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS if p], ids=lambda p: " ".join(p))
def test_help_shows_no_bool_metavar_and_a_conventional_usage(path: list[str]) -> None:
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    usage = next(line for line in res.output.splitlines() if "Usage:" in line)
    assert "{" not in usage and "}" not in usage, usage
    assert "<bool>" not in res.output


def test_checks_shows_why_and_fix_and_explains_ids() -> None:
    from k3fleet.verdict import CHECKS

    runner = CliRunner()
    table = runner.invoke(app, ["checks"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "why" in table.output and "fix" in table.output
    one = runner.invoke(app, ["checks", "driver.branch"], env={"COLUMNS": "200"})
    assert one.exit_code == 0, one.output
    assert one.output.startswith("driver.branch (host, critical): ")
    assert "  why: " in one.output and "  fix: Upgrade the driver to " in one.output
    group = runner.invoke(app, ["checks", "gpu.*", "--json"])
    import json

    assert {r["id"] for r in json.loads(group.output)} == {c for c in CHECKS if c.startswith("gpu.")}
    bad = runner.invoke(app, ["checks", "drver.branch"])
    assert bad.exit_code != 0 and "did you mean driver.branch" in str(bad.exception or "") + bad.output
