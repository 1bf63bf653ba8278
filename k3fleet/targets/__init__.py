"""Target files and the CUDA -> driver matrix: loading and validation.

``load_target(None)`` gives the packaged Kimi K3 target. Any problem with a target or
matrix file raises :class:`TargetError`, whose one-line message names the file, the
field and what is wrong with it, e.g.
``target /etc/k3/site.yaml: gpus.per_node: Input should be a valid integer (got 'eight')``.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from k3fleet.bounds import load_yaml, read_input
from k3fleet.errors import UsageError, error_location, error_message
from k3fleet.models.target import CudaDriverMatrix, DcgmErrors, Target, TargetConflict, XidCatalog

DEFAULT_TARGET = "kimi-k3.yaml"
DEFAULT_MATRIX = "cuda_driver_matrix.yaml"
XID_CATALOG = "xid_catalog.yaml"
DCGM_ERRORS = "dcgm_errors.yaml"

__all__ = [
    "DEFAULT_MATRIX",
    "DEFAULT_TARGET",
    "TargetError",
    "dcgm_errors",
    "default_target_path",
    "load_matrix",
    "load_target",
    "xid_catalog",
]


class TargetError(ValueError):
    """A target or matrix file that cannot be used; ``str()`` is one line naming file, field, problem."""

    def __init__(self, file: str, field: str | None, problem: str) -> None:
        self.file = file
        self.field = field
        self.problem = problem
        where = f"{file}: {field}: " if field else f"{file}: "
        super().__init__(where + problem)


_M = TypeVar("_M", bound=BaseModel)


def _packaged(name: str) -> Path:
    return Path(str(resources.files("k3fleet.targets").joinpath(name)))


def default_target_path() -> Path:
    return _packaged(DEFAULT_TARGET)


def _from_validation(label: str, exc: ValidationError) -> TargetError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    conflict = (first.get("ctx") or {}).get("error")
    if isinstance(conflict, TargetConflict):
        # A contradiction between fields: name the field to change, not the top level.
        return TargetError(label, conflict.field, str(conflict))
    field = error_location(first["loc"])
    # Our own validators already quote the bad value; pydantic's built-in messages do not.
    problem = error_message(first, show_input=True)
    if len(errors) > 1:
        rest = ", ".join(error_location(e["loc"]) for e in errors[1:4])
        more = "" if len(errors) <= 4 else f" and {len(errors) - 4} more"
        problem += f"; also invalid: {rest}{more}"
    return TargetError(label, field, problem)


def _read_yaml(label: str, path: Path) -> dict[str, Any]:
    try:
        text = read_input(path, "", kind="a target file", limit="record").decode("utf-8")
    except UsageError as exc:
        raise TargetError(label, None, f"cannot read file: {str(exc).removeprefix(str(path) + ' ')}") from exc
    except UnicodeDecodeError as exc:
        raise TargetError(label, None, f"not UTF-8 text (byte {exc.start})") from exc
    try:
        data = load_yaml(text, label)
    except UsageError as exc:
        raise TargetError(label, None, str(exc).removeprefix(label + ": ")) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TargetError(label, None, f"not valid YAML: {problem}{where}") from exc
    if not isinstance(data, dict):
        raise TargetError(label, None, f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_matrix(path: Path | None = None) -> CudaDriverMatrix:
    """Load and validate a CUDA -> driver matrix file (the packaged one by default)."""
    p = path if path is not None else _packaged(DEFAULT_MATRIX)
    label = f"matrix {p}"
    data = _read_yaml(label, p)
    try:
        return CudaDriverMatrix.model_validate(data)
    except ValidationError as exc:
        raise _from_validation(label, exc) from None


def _load_packaged(model: type[_M], name: str, what: str) -> _M:
    """The packaged YAML file ``name`` validated as ``model``; errors name it as ``what``."""
    p = _packaged(name)
    label = f"{what} {p}"
    try:
        return model.model_validate(_read_yaml(label, p))
    except ValidationError as exc:
        raise _from_validation(label, exc) from None


@functools.cache
def xid_catalog() -> XidCatalog:
    """NVIDIA's Xid catalogue with each code's action (the packaged xid_catalog.yaml, read once)."""
    return _load_packaged(XidCatalog, XID_CATALOG, "Xid catalogue")


@functools.cache
def dcgm_errors() -> DcgmErrors:
    """DCGM's diagnostic failure codes with their severities (the packaged dcgm_errors.yaml, read once)."""
    return _load_packaged(DcgmErrors, DCGM_ERRORS, "DCGM error codes")


def load_target(path: Path | None = None) -> Target:
    """Load and validate a target file; its matrix file is resolved next to it.

    A target file without a matrix of its own beside it (an operator's site target)
    falls back to the packaged matrix.
    """
    p = path if path is not None else default_target_path()
    label = f"target {p}"
    data = _read_yaml(label, p)
    if "matrix" in data:
        raise TargetError(label, "matrix", "the matrix is read from matrix_file, not given inline")
    matrix_name = data.get("matrix_file", DEFAULT_MATRIX)
    if not isinstance(matrix_name, str) or not matrix_name:
        raise TargetError(label, "matrix_file", f"expected a file name, got {matrix_name!r}")
    matrix_path = Path(matrix_name)
    if not matrix_path.is_absolute():
        beside = p.parent / matrix_path
        matrix_path = beside if beside.exists() or matrix_name != DEFAULT_MATRIX else _packaged(DEFAULT_MATRIX)
    matrix = load_matrix(matrix_path)
    try:
        return Target.model_validate({**data, "matrix": matrix})
    except ValidationError as exc:
        raise _from_validation(label, exc) from None
