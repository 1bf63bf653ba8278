"""``k3fleet prune`` cannot escape its tree (docs/safety.md "Evidence privacy", "Retention").

- the runs an approved decision cites are kept by their recorded identity (their manifest's sha256), also
  after the runs tree was moved (``mv``) and the decision's recorded paths point nowhere;
- a bind mount inside an old run: nothing outside the runs tree is deleted through it;
- a run is removed whole or not at all: one that cannot be renamed aside is left whole (exit 3), one
  whose deletion stops half-way stays under its trash name and the next prune finishes it.

Run directories are written by the project's own writer (``RunDir``), as every command writes them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3fleet.evidence import RunDir, sha256_file
from k3fleet.evidence.prune import KEEP, REMOVE, TRASH_PREFIX, apply_prune, plan_prune

NOW = _dt.datetime(2026, 12, 5, 12, 0, tzinfo=_dt.UTC)
MONTH = 30 * 86400.0


def _run(parent: Path, name: str, kind: str, days_old: int, files: dict[str, Any] | None = None) -> Path:
    rd = RunDir.create(parent, kind, ["k3fleet", kind], out=parent / name)
    command = json.loads((rd.path / "command.json").read_text())
    command["started_at"] = (NOW - _dt.timedelta(days=days_old)).isoformat(timespec="seconds")
    rd.write_json("command.json", command)
    for rel, data in (files or {"verdict.json": {"outcome": "ready"}}).items():
        rd.write_json(rel, data)
    rd.write_manifest()
    return rd.path


def _decision(parent: Path, cites: list[Path], days_old: int = 45) -> Path:
    runs = [{"label": p.name, "kind": "audit", "path": os.path.relpath(p), "manifest_sha256":
             sha256_file(p / "manifest.json")} for p in cites]
    return _run(parent, "decision", "decision", days_old, {"decision.json": {"approved": True, "outcome": "go_live"},
                                                           "summary.json": {"runs": runs}})


def _verdicts(runs: Path) -> dict[str, tuple[str, str]]:
    return {v.path.name: (v.action, v.why) for v in plan_prune(runs, MONTH, NOW)}


def test_cited_runs_are_kept_by_identity_after_the_tree_was_moved(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    cited = _run(runs, "audit-cited", "audit", 45)
    _run(runs, "audit-old", "audit", 45, {"verdict.json": {"outcome": "other"}})
    _decision(runs, [cited])
    moved = tmp_path / "archive" / "runs"
    moved.parent.mkdir()
    shutil.move(str(runs), moved)
    assert not cited.exists()  # the decision's recorded path now points nowhere
    plan = _verdicts(moved)
    assert plan["audit-cited"] == (KEEP, "cited by the accepted decision decision")
    assert plan["decision"] == (KEEP, "an accepted decision")
    assert plan["audit-old"][0] == REMOVE
    assert apply_prune(plan_prune(moved, MONTH, NOW)) == {}
    assert sorted(p.name for p in moved.iterdir()) == ["audit-cited", "decision"]


def _listing(run: Path) -> list[str]:
    return sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))


@dataclasses.dataclass
class MountedRun:
    runs: Path
    run: Path
    mnt: Path
    outside: Path
    before: list[str]  # the run's files before the mount

    def unmount(self) -> None:
        subprocess.run(["umount", str(self.mnt)], capture_output=True, check=False)


@pytest.fixture
def mounted_run(tmp_path: Path) -> Iterator[MountedRun]:
    """An old run (45 days) with a folder outside the runs tree, holding precious.txt, bind-mounted inside it;
    skipped where this machine cannot bind-mount (not root). Unmounted afterwards, and what lay behind the
    mount must still be there."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("not evidence\n")
    runs = tmp_path / "runs"
    old = _run(runs, "audit-old", "audit", 45)
    mnt = old / "inputs" / "mnt"
    mnt.mkdir(parents=True)
    mounted_run = MountedRun(runs, old, mnt, outside, _listing(old))
    mounted = subprocess.run(["mount", "--bind", str(outside), str(mnt)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield mounted_run
    finally:
        mounted_run.unmount()
    # The mount point itself as an entry of the runs tree is never touched either.
    assert (outside / "precious.txt").is_file()


def test_a_bind_mount_inside_a_run_is_never_crossed(mounted_run: MountedRun) -> None:
    m = mounted_run
    action, why = _verdicts(m.runs)["audit-old"]
    assert action == KEEP and "holds a mount point" in why and str(m.mnt) in why
    assert apply_prune(plan_prune(m.runs, MONTH, NOW)) == {}
    assert (m.outside / "precious.txt").read_text() == "not evidence\n"
    assert (m.run / "command.json").is_file()


def test_prune_of_a_run_holding_a_bind_mount_leaves_it_untouched_and_exits_3(
        mounted_run: MountedRun, capsys: pytest.CaptureFixture[str]) -> None:
    """The command itself: an old run with a bind mount inside was kept but prune exited 0, as if it had done
    all it was asked. It leaves the run untouched (every file, and what lies behind the mount), says so in
    one line, and exits 3 (docs/safety.md "Retention"); --dry-run says and exits the same."""
    from k3fleet.cli import main

    m = mounted_run
    for dry in (["--dry-run"], []):
        capsys.readouterr()
        assert main(["prune", "--older-than", "30d", "--runs-dir", str(m.runs), *dry]) == 3
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("left ")]
        # The command ages the run by the real clock (the fixture dates it from NOW): 45 days or more.
        kept = re.escape(f"left {m.run} untouched: ") + r"(\d+)d" + re.escape(
            f" old, but it holds a mount point ({m.mnt}): never removed, left whole")
        found = re.fullmatch(kept, lines[0]) if len(lines) == 1 else None
        assert found is not None and int(found[1]) >= 45, err
        assert "0 run directories" in err
        assert (m.outside / "precious.txt").read_text() == "not evidence\n"
    m.unmount()
    assert _listing(m.run) == m.before


def test_a_run_that_cannot_be_renamed_aside_is_left_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    old = _run(runs, "audit-old", "audit", 45)
    before = _listing(old)
    plan = plan_prune(runs, MONTH, NOW)

    def refuse(src: Any, dst: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("k3fleet.evidence.prune.os.rename", refuse)
    problems = apply_prune(plan)
    assert "cannot rename it aside (Operation not permitted): left whole" in problems[old]
    assert _listing(old) == before


def test_a_deletion_that_stops_half_way_is_finished_by_the_next_prune(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    old = _run(runs, "audit-old", "audit", 45, {"verdict.json": {"outcome": "ready"}, "facts/a.json": {}})
    unlink = os.unlink

    def stuck(name: Any, *args: Any, **kwargs: Any) -> None:
        if name == "a.json":
            raise PermissionError(1, "Operation not permitted")  # an immutable file
        unlink(name, *args, **kwargs)

    monkeypatch.setattr("k3fleet.evidence.prune.os.unlink", stuck)
    problems = apply_prune(plan_prune(runs, MONTH, NOW))
    assert "renamed aside to " in problems[old] and "the next prune tries again" in problems[old]
    assert not old.exists()  # never half a run under its name
    trash = [p for p in runs.iterdir() if p.name.startswith(TRASH_PREFIX + "audit-old.")]
    assert len(trash) == 1
    monkeypatch.setattr("k3fleet.evidence.prune.os.unlink", unlink)
    again = plan_prune(runs, MONTH, NOW)
    assert [(v.path, v.action, v.kind) for v in again] == [(trash[0], REMOVE, "trash")]
    assert apply_prune(again) == {}
    assert list(runs.iterdir()) == []
