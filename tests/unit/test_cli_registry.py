"""The CLI imports only the command module a command line needs (k3fleet/cli/base.py
COMMAND_OWNERS): the table must name, for every top-level command, the modules that define it."""

from __future__ import annotations

import subprocess
import sys

import typer.main

from k3fleet.cli import app
from k3fleet.cli.base import _COMMAND_MODULES, COMMAND_OWNERS


def _module_of(command: object) -> set[str]:
    """The k3fleet.cli modules a registered command (or every command of a group) comes from."""
    callback = getattr(command, "callback", None)
    mods = {callback.__module__} if callback is not None and callback.__module__.startswith("k3fleet.cli.") else set()
    for sub in getattr(command, "commands", {}).values():
        mods |= _module_of(sub)
    return mods


def test_every_command_is_in_the_table_with_its_modules() -> None:
    group = typer.main.get_command(app)
    commands = group.commands  # type: ignore[attr-defined]
    assert set(commands) == set(COMMAND_OWNERS)
    for name, command in commands.items():
        owners = {f"k3fleet.cli.{m}" for m in COMMAND_OWNERS[name]}
        assert _module_of(command) <= owners, name
    assert {m for mods in COMMAND_OWNERS.values() for m in mods} <= set(_COMMAND_MODULES)


def test_a_command_imports_only_its_own_group() -> None:
    code = ("import sys; from k3fleet.cli import main; rc = main(['checks', '--json']);"
            "print(sorted(m for m in sys.modules if m.startswith('k3fleet.cli.')), file=sys.stderr);"
            "print('aiohttp' in sys.modules, file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    mods_line, aiohttp_line = res.stderr.strip().splitlines()[-2:]
    assert "k3fleet.cli.audit" in mods_line
    assert "k3fleet.cli.accept" not in mods_line and "k3fleet.cli.decide" not in mods_line
    assert aiohttp_line == "False"


def test_help_and_an_unknown_command_still_see_every_command() -> None:
    res = subprocess.run([sys.executable, "-c", "import sys; from k3fleet.cli import main; sys.exit(main(['--help']))"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0
    for name in COMMAND_OWNERS:
        assert name in res.stdout, name
    # Every command is registered for --help, but no flow loads: not the HTTP clients of the probes.
    code = ("import sys; from k3fleet.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('httpx', 'aiohttp', 'k3fleet.accept.load') if m in sys.modules),"
            " file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.stderr.strip().splitlines()[-1] == "[]", res.stderr[-2000:]
    res = subprocess.run([sys.executable, "-c", "import sys; from k3fleet.cli import main; sys.exit(main(['audti']))"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2
    assert "No such command 'audti'" in res.stderr
