"""Work directory of a lab harness: where it is, its common layout, its state file and its lock."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

import k3fleet

StateT = TypeVar("StateT", bound=BaseModel)


def default_workdir(*parts: str) -> Path:
    """<checkout>/PARTS when running from a checkout, else ./PARTS (installed from a wheel)."""
    checkout = Path(k3fleet.__file__).resolve().parent.parent
    base = checkout if (checkout / "pyproject.toml").exists() else Path.cwd()
    return base.joinpath(*parts)


def resolve_workdir(workdir: Path | None, default: Callable[[], Path]) -> Path:
    """Absolute work directory; ``default()`` when None."""
    return (workdir if workdir is not None else default()).expanduser().resolve()


@dataclass(frozen=True)
class WorkdirLayout:
    """The paths every lab work directory has; each harness adds its own in a subclass."""

    workdir: Path

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.workdir / ".lock"

    @property
    def inventory(self) -> Path:
        return self.workdir / "inventory.yml"

    @property
    def ssh_dir(self) -> Path:
        return self.workdir / "ssh"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def hosts_dir(self) -> Path:
        return self.workdir / "hosts"

    def host_dir(self, name: str) -> Path:
        return self.hosts_dir / name

    @property
    def run_dir(self) -> Path:
        return self.workdir / "run"

    @property
    def supervisor_spec(self) -> Path:
        return self.run_dir / "supervisor-spec.json"

    @property
    def supervisor_live(self) -> Path:
        return self.run_dir / "supervisor-live.json"

    @property
    def supervisor_log(self) -> Path:
        return self.run_dir / "supervisor.log"


def write_atomic(path: Path, text: str, *, prefix: str) -> None:
    """Replace ``path`` in one rename: a reader (status, down after kill -9) never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def save_state(state: BaseModel, workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    write_atomic(WorkdirLayout(workdir).state_file, state.model_dump_json(indent=2), prefix=".state-")


def load_state(workdir: Path, model: type[StateT], error: type[Exception], label: str) -> StateT | None:
    """The saved state, None when there is none; ``error`` naming the file when it is unreadable."""
    path = WorkdirLayout(workdir).state_file
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return model.model_validate(json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise error(f"{label}: state file {path} is unreadable: {exc}") from exc


@contextmanager
def locked(layout: WorkdirLayout, busy: Exception) -> Iterator[None]:
    """Hold the work directory's lock; raise ``busy`` at once when another process holds it."""
    layout.workdir.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise busy from exc
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
