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
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, Field

import k3fleet

StateT = TypeVar("StateT", bound="SavedState")


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
    """The paths every lab work directory has; each harness adds its own in a subclass, and says
    where its work directory is by default (``default_parts`` below the checkout)."""

    workdir: Path
    default_parts: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def default_workdir(cls) -> Path:
        return default_workdir(*cls.default_parts)

    @classmethod
    def resolve(cls, workdir: Path | None) -> Path:
        """Absolute work directory; the default one when None."""
        return resolve_workdir(workdir, cls.default_workdir)

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


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A lab state or stamp file's JSON object; None when it is missing, unreadable, half-written or not an
    object (the lab then treats it as not there)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_atomic(path: Path, text: str, *, prefix: str) -> None:
    """Replace ``path`` in one rename: a reader (status, down after kill -9) never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


class SavedState(BaseModel):
    """What every lab harness saves of itself: where, how far it got, its supervisor, what failed.

    Written before anything is created and updated as pieces come up, so ``down`` knows what to
    remove even when ``up`` died half-way or everything was killed with SIGKILL.
    """

    version: int = 1
    workdir: Path
    phase: str
    supervisor_pid: int | None = None
    supervisor_start_time: int | None = Field(default=None, description="guards against pid reuse")
    error: str | None = None


def save_state(state: SavedState) -> None:
    """Atomic write: a reader (status, down after kill -9) never sees half a file."""
    state.workdir.mkdir(parents=True, exist_ok=True)
    write_atomic(WorkdirLayout(state.workdir).state_file, state.model_dump_json(indent=2), prefix=".state-")


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
