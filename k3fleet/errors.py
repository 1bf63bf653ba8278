"""k3fleet's exceptions, in one place, with the exit code each one maps to.

The exit codes and the rule that combines them are owned by ``k3fleet.contracts``.
"""

from __future__ import annotations

from pathlib import Path

from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, combine

__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "EXIT_OK", "EXIT_USAGE", "IncompleteError", "K3FleetError",
           "UsageError", "combine", "read_input"]


class K3FleetError(Exception):
    """Base class: every error the CLI turns into one line and an exit code."""

    exit_code = EXIT_USAGE


class UsageError(K3FleetError):
    """Bad input: arguments, inventory, target file, run directory."""

    exit_code = EXIT_USAGE


class IncompleteError(K3FleetError):
    """The run could not gather the evidence it needs (interrupted, Ansible failed to start)."""

    exit_code = EXIT_INCOMPLETE


# How far a text input is searched for a NUL byte before it is taken for text.
_BINARY_PROBE = 65536


def read_input(path: Path, what: str, *, kind: str, max_bytes: int | None = None, text: bool = False) -> bytes:
    """The bytes of a file the user named (a journal, a log, a capture); every way it can fail is
    one line naming ``what``, the path and ``kind`` (what the file should have been)."""
    label = f"{what} {path}" if what else str(path)
    try:
        if max_bytes is not None and (size := path.stat().st_size) > max_bytes:
            raise UsageError(f"{label} is {size} bytes: too large for {kind} (limit {max_bytes})")
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise UsageError(f"{label} does not exist") from exc
    except IsADirectoryError as exc:
        raise UsageError(f"{label} is a directory, not {kind}") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {label}: {exc.strerror or exc}") from exc
    if text and b"\x00" in data[:_BINARY_PROBE]:
        raise UsageError(f"{label} is binary, not {kind}")
    return data
