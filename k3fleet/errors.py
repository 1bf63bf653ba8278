"""k3fleet's exceptions, in one place, with the exit code each one maps to.

The exit codes and the rule that combines them are owned by ``k3fleet.contracts`` and imported from
there only (this module does not pass them on); a pydantic error becomes one line through
``validation_line`` here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from k3fleet.contracts import EXIT_INCOMPLETE, EXIT_USAGE

__all__ = ["IncompleteError", "K3FleetError", "UsageError", "error_location", "error_message", "validated",
           "validation_line"]


class K3FleetError(Exception):
    """Base class: every error the CLI turns into one line and an exit code."""

    exit_code = EXIT_USAGE


class UsageError(K3FleetError):
    """Bad input: arguments, inventory, target file, run directory."""

    exit_code = EXIT_USAGE


class IncompleteError(K3FleetError):
    """The run could not gather the evidence it needs (interrupted, Ansible failed to start)."""

    exit_code = EXIT_INCOMPLETE


# -- pydantic errors as one line ---------------------------------------------------------------------
# Every place that reports a pydantic ValidationError to a person goes through validation_line (or, to
# build a line of another shape, its two parts): one wording for the field, the message and the count.


def error_location(loc: Iterable[object], *, at: str = "", option: bool = False) -> str:
    """A pydantic error's field path: ``a.b.0``, after ``at`` (a prefix such as ``data.cases.``);
    ``option`` spells the first part as the command-line option it came from (``--base-url``)."""
    parts = [str(p) for p in loc]
    if option and parts:
        return "--" + parts[0].replace("_", "-") + "".join(f".{p}" for p in parts[1:])
    return at + ".".join(parts) if parts else (at.rstrip(".") or "(top level)")


def error_message(error: Mapping[str, Any], *, show_input: bool = False) -> str:
    """A pydantic error's message in k3fleet's words: an extra key is ``unknown key (misspelt?)``, a
    validator's message loses pydantic's ``Value error,`` prefix; ``show_input`` adds the value given
    where pydantic's own message does not quote it."""
    if error.get("type") == "extra_forbidden":
        return "unknown key (misspelt?)"
    msg = str(error.get("msg", "")).removeprefix("Value error, ")
    got = error.get("input")
    if (show_input and "input" in error and error.get("type") not in ("missing", "value_error")
            and not isinstance(got, dict | list)):
        msg += f" (got {got!r})"
    return msg


def validation_line(exc: Any, label: str | None = None, *, at: str = "", show_input: bool = False,
                    option: bool = False) -> str:
    """The first error of a pydantic ValidationError as one line, ``[label: ]field.path: message (+N more)``."""
    errs = exc.errors(include_url=False)
    if not errs:
        line = str(exc).splitlines()[0]
    else:
        e = errs[0]
        line = f"{error_location(e.get('loc', ()), at=at, option=option)}: {error_message(e, show_input=show_input)}"
        if len(errs) > 1:
            line += f" (+{len(errs) - 1} more)"
    return f"{label}: {line}" if label else line


_M = TypeVar("_M", bound=BaseModel)


def validated(model: type[_M], data: Any, label: str, expected: str) -> _M:
    """``data`` (parsed from a user's file) as ``model``; not a mapping, or not valid, is one UsageError line:
    ``label: expected`` or ``label: field.path: message``."""
    if not isinstance(data, dict):
        raise UsageError(f"{label}: {expected}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UsageError(validation_line(exc, label)) from None
