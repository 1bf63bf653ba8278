"""Evidence privacy on a real run: ``accept all`` against the simulator writes a run directory only its
owner can enter (0700) and read (0600), with the probes' request bodies in ``requests/*.jsonl``;
with ``--no-bodies`` none of those bodies is anywhere in the run directory, only their size and digest."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from decide_helpers import k3fleet

pytestmark = pytest.mark.integration


def _accept(sim: Any, out: Path, *extra: str) -> Path:
    proc = k3fleet("accept", "all", "--base-url", sim.base_url, "--model", "moonshotai/Kimi-K3", "--skip", "load",
                   "--skip", "startup", "--agent-repeats", "1", "--prefix-repeats", "1", "--out", str(out), "--quiet",
                   *extra)
    assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
    assert (out / "manifest.json").is_file(), proc.stderr[-3000:]
    return out


def _modes(run: Path) -> tuple[set[str], set[str]]:
    dirs, files = {oct(stat.S_IMODE(run.stat().st_mode))}, set()
    for root, dnames, fnames in os.walk(run):
        dirs |= {oct(stat.S_IMODE((Path(root) / d).stat().st_mode)) for d in dnames}
        files |= {oct(stat.S_IMODE((Path(root) / f).stat().st_mode)) for f in fnames}
    return dirs, files


def _user_texts(rows: list[dict[str, Any]]) -> set[str]:
    """The user turns the probes sent: what a production prompt would be."""
    out = set()
    for row in rows:
        for msg in (row.get("request") or {}).get("messages") or []:
            if msg.get("role") == "user" and isinstance(msg.get("content"), str) and len(msg["content"]) >= 24:
                out.add(msg["content"])
    return out


def test_bodies_modes_and_no_bodies(simulator: Any, tmp_path: Path) -> None:
    sim = simulator(itl_ms=2.0, prefill_ms_per_token=0.005)
    old = os.umask(0o022)  # the usual umask: world-readable unless the writer says otherwise
    try:
        full = _accept(sim, tmp_path / "full")
        bare = _accept(sim, tmp_path / "bare", "--no-bodies")
    finally:
        os.umask(old)
    for run in (full, bare):
        assert _modes(run) == ({"0o700"}, {"0o600"}), run
    rows = [json.loads(line) for p in sorted((full / "requests").glob("*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]
    planted = _user_texts(rows)
    assert rows and planted, "the probes sent no user turn"
    bare_rows = [json.loads(line) for p in sorted((bare / "requests").glob("*.jsonl"))
                 for line in p.read_text().splitlines() if line.strip()]
    assert bare_rows and all("request" not in r and "response" not in r and r["bodies"]["kept"] is False
                             and len(r["bodies"]["request"]["sha256"]) == 64 for r in bare_rows)
    # No user turn the probes sent survives anywhere in the run directory kept without bodies.
    everything = "\n".join(p.read_text(errors="replace") for p in bare.rglob("*") if p.is_file())
    leaked = [t for t in planted if json.dumps(t)[1:-1] in everything or t in everything]
    assert not leaked, leaked[:2]


def _age(run: Path, days: int) -> None:
    """Make a run directory ``days`` old, as time does (its recorded start)."""
    import datetime as _dt

    command = json.loads((run / "command.json").read_text())
    command["started_at"] = (_dt.datetime.now(_dt.UTC) - _dt.timedelta(days=days)).isoformat(timespec="seconds")
    (run / "command.json").write_text(json.dumps(command))


def test_prune_removes_old_runs_but_never_the_evidence_of_an_accepted_decision(
        matched_audit: Path, healthy_audit: Path, accept_run: Any, evidence_keys: Any, tmp_path: Path) -> None:
    import shutil

    from decide_helpers import LAB_PROFILE

    runs = tmp_path / "runs"
    runs.mkdir()
    audit, accept, stale, fresh = runs / "audit-cited", runs / "accept-cited", runs / "audit-old", runs / "audit-new"
    shutil.copytree(matched_audit, audit)
    shutil.copytree(accept_run("healthy"), accept)
    shutil.copytree(healthy_audit, stale)
    shutil.copytree(healthy_audit, fresh)
    decision = runs / "decision"
    proc = k3fleet("decide", str(audit), str(accept), "--reviewer", "carol", "--out", str(decision), "--sign-key",
                   str(evidence_keys.key), "--profile", str(LAB_PROFILE), "--rollback-owner", "erin")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((decision / "decision.json").read_text())["approved"] is True
    for run in (audit, accept, stale, decision):
        _age(run, 45)
    _age(fresh, 3)
    package = runs / "decision.tar.gz"
    assert package.is_file()

    dry = k3fleet("prune", "--older-than", "30d", "--runs-dir", str(runs), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove {stale} (audit): 45d old" in dry.stdout
    assert all(p.exists() for p in (audit, accept, stale, fresh, decision))

    done = k3fleet("prune", "--older-than", "30d", "--runs-dir", str(runs))
    assert done.returncode == 0, done.stderr
    assert f"removed {stale} (audit): 45d old" in done.stdout and not stale.exists()
    assert f"kept {audit} (audit): cited by the accepted decision decision" in done.stdout
    assert f"kept {accept} (accept): cited by the accepted decision decision" in done.stdout, done.stdout
    assert f"kept {decision} (decision): an accepted decision" in done.stdout
    assert f"kept {fresh} (audit): 3d old, newer than the limit" in done.stdout
    assert f"kept {package}: not a run directory" in done.stdout
    assert all(p.exists() for p in (audit, accept, fresh, decision, package))
    assert "1 run directory removed, 5 kept" in done.stderr


@pytest.mark.parametrize("value", ["soon", "0", "-3d", "inf", "99999d"])
def test_prune_bad_age_is_one_line(value: str, tmp_path: Path) -> None:
    proc = k3fleet("prune", "--older-than", value, "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--older-than" in proc.stderr, \
        proc.stderr
