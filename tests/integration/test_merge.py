"""`k3fleet merge`: slices audited apart, merged into one verdict.

The lab fleet is audited once as a whole (`k3fleet audit`), and again as three slices, each by
its own `ansible-runner` process run the way AWX runs a project (project directory = this
repository, its ansible.cfg, no k3fleet CLI, no image passed: the play's defaults read it from
the target file). Merging the three artifact directories must give the whole run's verdict.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
K3FLEET = str(BIN / "k3fleet")
# Fields that differ between two audits of the same hosts without meaning anything.
_VOLATILE = {"collected_at", "duration_s", "generated_at", "wall_s"}


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}


def k3fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([K3FLEET, *args], capture_output=True, text=True, env=_env(), timeout=600, check=False)


def _stable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _stable(v) for k, v in obj.items() if k not in _VOLATILE}
    if isinstance(obj, list):
        return [_stable(v) for v in obj]
    return obj


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("merge")
    gen = k3fleet("lab", "generate", str(base / "lab"))
    assert gen.returncode == 0, gen.stderr
    inventory = Path(gen.stdout.strip())
    data = yaml.safe_load(inventory.read_text())
    hosts = list(data["all"]["children"]["lab"]["hosts"])
    # An AWX inventory does not carry the CLI's image: the play must read it from the target file.
    for hostvars in data["all"]["children"]["lab"]["hosts"].values():
        hostvars.pop("k3fleet_image", None)
    awx_inventory = base / "awx-inventory.yml"
    awx_inventory.write_text(yaml.safe_dump(data))
    whole = k3fleet("audit", "-i", str(inventory), "--json", "--out", str(base / "whole"), "-q")
    assert whole.stdout, whole.stderr[-2000:]
    return {"base": base, "inventory": inventory, "awx_inventory": awx_inventory, "hosts": hosts,
            "whole": json.loads(whole.stdout), "whole_dir": base / "whole", "whole_rc": whole.returncode}


def _slices(hosts: list[str], n: int) -> list[list[str]]:
    return [hosts[i::n] for i in range(n)]


@pytest.fixture(scope="module")
def runner_slices(lab: dict[str, Any]) -> list[Path]:
    """Three ansible-runner processes at once, one slice each, as an AWX sliced job runs them."""
    dirs = []
    procs = []
    for i, part in enumerate(_slices(lab["hosts"], 3)):
        pd = lab["base"] / f"slice{i}"
        pd.mkdir()
        dirs.append(pd)
        procs.append(subprocess.Popen(
            [str(BIN / "ansible-runner"), "run", str(pd), "-p", "playbooks/audit.yml", "--project-dir", str(REPO),
             "--inventory", str(lab["awx_inventory"]), "--limit", ",".join(part), "--ident", f"slice{i}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(REPO)))
    for p in procs:
        _, err = p.communicate(timeout=600)
        # 0 or 4 (the profile's unreachable host): the play ran.
        assert p.returncode in (0, 2, 4), err[-2000:]
    return dirs


def _stats_event(job: Path) -> dict[str, Any]:
    for p in (job / "job_events").glob("*.json"):
        event = json.loads(p.read_text())
        if event.get("event") == "playbook_on_stats":
            return event
    raise AssertionError(f"no playbook_on_stats event in {job}")


def test_runner_artifacts_hold_each_hosts_facts(lab: dict[str, Any], runner_slices: list[Path]) -> None:
    target_image = lab["whole"]["target"]["image"] if isinstance(lab["whole"].get("target"), dict) else None
    published: set[str] = set()
    for pd, part in zip(runner_slices, _slices(lab["hosts"], 3), strict=True):
        job = pd / "artifacts" / pd.name
        artifact = _stats_event(job)["event_data"]["artifact_data"]["k3fleet_audit"]
        assert set(artifact["hosts"]) == set(part)
        for host, facts in artifact["facts"].items():
            assert facts["schema_version"].startswith("1.")
            assert facts["host"] == host
            if target_image:
                assert facts["container"]["image"]["ref"] == target_image
        published |= set(artifact["facts"])
    unreachable = {h for h, v in lab["whole"]["hosts"].items() if v["status"] == "unreachable"}
    assert published == set(lab["hosts"]) - unreachable


def test_three_runner_slices_merge_to_the_whole_runs_verdict(lab: dict[str, Any], runner_slices: list[Path]) -> None:
    out = lab["base"] / "merged"
    proc = k3fleet("merge", *map(str, runner_slices), "--json", "--out", str(out))
    assert proc.returncode == lab["whole_rc"], proc.stderr
    merged = json.loads(proc.stdout)
    assert _stable(merged) == _stable(lab["whole"])
    # The merged run is a run directory like any other: its manifest verifies.
    from k3fleet.evidence import verify_run

    assert verify_run(out).ok, verify_run(out).summary()
    reachable = [h for h, v in lab["whole"]["hosts"].items() if v["status"] != "unreachable"]
    assert sorted(p.stem for p in (out / "facts").glob("*.json")) == sorted(reachable)
    sources = json.loads((out / "inputs" / "sources.json").read_text())
    assert [s["kind"] for s in sources] == ["runner"] * 3
    assert all("not verifiable" in s["verified"] for s in sources)


def test_mixed_inputs_and_a_host_seen_twice(lab: dict[str, Any], runner_slices: list[Path]) -> None:
    """A k3fleet run directory plus a later runner slice: the verified run directory wins although the
    runner's facts are newer (runner artifacts have no manifest), and merge.json and stderr say so."""
    time.sleep(1.1)  # collected_at has one-second resolution
    later = lab["base"] / "later"
    later.mkdir()
    part = _slices(lab["hosts"], 3)[0]
    redo = subprocess.run(
        [str(BIN / "ansible-runner"), "run", str(later), "-p", "playbooks/audit.yml", "--project-dir", str(REPO),
         "--inventory", str(lab["awx_inventory"]), "--limit", ",".join(part), "--ident", "redo"],
        capture_output=True, text=True, env=_env(), cwd=str(REPO), timeout=600, check=False)
    assert redo.returncode in (0, 2, 4), redo.stderr[-2000:]
    out = lab["base"] / "merged-twice"
    proc = k3fleet("merge", str(lab["whole_dir"]), str(later), "--json", "--out", str(out))
    assert proc.returncode == lab["whole_rc"], proc.stderr
    assert _stable(json.loads(proc.stdout)) == _stable(lab["whole"])
    record = json.loads((out / "merge.json").read_text())
    dup_hosts = {d["host"] for d in record["duplicates"]}
    assert dup_hosts == set(part)
    for d in record["duplicates"]:
        assert d["kept"]["source"] == str(lab["whole_dir"]) and d["kept"]["verified"], d
        (dropped,) = d["dropped"]
        assert dropped["source"].endswith("redo") and not dropped["verified"]
        assert dropped["why"].startswith("not verifiable (no manifest: ansible-runner artifacts")
        if d["host"] in record["verified_of"]:
            assert record["verified_of"][d["host"]] is True
    # Newer, yet ignored: the runner's facts were collected after the run directory's.
    assert any(d["dropped"][0]["when"] > d["kept"]["when"] for d in record["duplicates"] if d["kept"]["kind"] ==
               "facts")
    ignored = [line for line in proc.stderr.splitlines() if line.startswith("ignored ")]
    assert len(ignored) == 1 and "redo" in ignored[0] and "not verifiable" in ignored[0], proc.stderr


def _artifacts_file(path: Path, facts: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"k3fleet_audit": {"hosts": sorted(facts), "facts": facts}}))
    return path


def test_an_unverifiable_artifacts_file_never_overrides_a_verified_slice(lab: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    """The attack: an AWX artifacts file saying a failing host passes. Dated now it loses to the
    verified run; dated 2999 (so that it would win on time) it refuses the merge."""
    whole = lab["whole_dir"]
    failing = next(h for h, v in lab["whole"]["hosts"].items() if v["status"] == "fail")
    better = next(h for h, v in lab["whole"]["hosts"].items() if v["status"] in ("pass", "warn"))
    from k3fleet.evidence import host_file_name

    facts = json.loads((whole / "facts" / f"{host_file_name(better)}.json").read_text())
    facts["host"] = failing
    facts["collected_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    forged = _artifacts_file(tmp_path / "job-4711-artifacts.json", {failing: facts})
    out = tmp_path / "merged"
    proc = k3fleet("merge", str(whole), str(forged), "--json", "--out", str(out))
    assert proc.returncode == lab["whole_rc"], proc.stderr
    merged = json.loads(proc.stdout)
    assert merged["hosts"][failing]["status"] == "fail"
    assert _stable(merged) == _stable(lab["whole"])
    assert f"ignored {forged} for 1 host(s) ({failing}): not verifiable" in proc.stderr
    record = json.loads((out / "merge.json").read_text())
    (dup,) = record["duplicates"]
    assert dup["kept"]["source"] == str(whole) and dup["dropped"][0]["source"] == str(forged)
    # The same file dated 2999, so that the newest would win: refused, nothing written.
    facts["collected_at"] = "2999-01-01T00:00:00Z"
    _artifacts_file(forged, {failing: facts})
    out2 = tmp_path / "merged-2999"
    proc = k3fleet("merge", str(whole), str(forged), "--out", str(out2))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert f"slice {forged}: host {failing}: collected_at '2999-01-01T00:00:00Z'" in lines[0]
    assert "ahead of this controller's clock" in lines[0]
    assert not out2.exists()


def test_a_merge_run_keeps_the_trust_of_its_sources(lab: dict[str, Any], runner_slices: list[Path],
                                                    tmp_path: Path) -> None:
    """Merging unverifiable slices into a run directory does not make them verified: merged again
    beside a verified run, the verified run's hosts still win."""
    laundered = tmp_path / "laundered"
    proc = k3fleet("merge", *map(str, runner_slices), "--out", str(laundered))
    assert proc.returncode == lab["whole_rc"], proc.stderr
    marks = json.loads((laundered / "merge.json").read_text())["verified_of"]
    assert marks and not any(marks.values())
    out = tmp_path / "again"
    proc = k3fleet("merge", str(lab["whole_dir"]), str(laundered), "--out", str(out))
    assert proc.returncode == lab["whole_rc"], proc.stderr
    record = json.loads((out / "merge.json").read_text())
    assert record["duplicates"]
    assert all(d["kept"]["source"] == str(lab["whole_dir"]) for d in record["duplicates"])
    assert all(record["verified_of"].values())


def test_two_verified_slices_the_newer_wins(lab: dict[str, Any], tmp_path: Path) -> None:
    part = _slices(lab["hosts"], 3)[2]
    time.sleep(1.1)  # collected_at has one-second resolution
    later = tmp_path / "later"
    proc = k3fleet("audit", "-i", str(lab["inventory"]), "--limit", ",".join(part), "--out", str(later), "-q")
    assert proc.returncode in (0, 1, 3), proc.stderr
    out = tmp_path / "merged"
    proc = k3fleet("merge", str(later), str(lab["whole_dir"]), "--out", str(out))
    assert proc.returncode == lab["whole_rc"], proc.stderr
    record = json.loads((out / "merge.json").read_text())
    facts_dups = [d for d in record["duplicates"] if d["kept"]["kind"] == "facts"]
    assert facts_dups and all(d["kept"]["source"] == str(later) for d in facts_dups)
    assert all(d["dropped"][0]["why"].startswith("older") for d in facts_dups)
    assert not [line for line in proc.stderr.splitlines() if line.startswith("ignored ")]


def test_awx_job_artifacts_file_as_input(lab: dict[str, Any], runner_slices: list[Path]) -> None:
    """The job's artifacts as AWX shows them (the set_stats data), saved to a file, one per slice."""
    files = []
    for pd in runner_slices:
        data = _stats_event(pd / "artifacts" / pd.name)["event_data"]["artifact_data"]
        f = lab["base"] / f"{pd.name}-artifacts.json"
        f.write_text(json.dumps(data))
        files.append(f)
    # The unreachable host is in no slice's facts: the artifacts alone cannot know about it.
    proc = k3fleet("merge", *map(str, files), "--json", "--out", str(lab["base"] / "merged-files"))
    assert proc.stdout, proc.stderr
    merged = json.loads(proc.stdout)
    for host, verdict in lab["whole"]["hosts"].items():
        if verdict["status"] != "unreachable":
            assert _stable(merged["hosts"][host]) == _stable(verdict)


def test_tampered_slice_is_refused(lab: dict[str, Any], tmp_path: Path) -> None:
    part = _slices(lab["hosts"], 3)[1]
    run = tmp_path / "slice"
    proc = k3fleet("audit", "-i", str(lab["inventory"]), "--limit", ",".join(part), "--out", str(run), "-q")
    assert proc.returncode in (0, 1, 3), proc.stderr
    victim = next(iter(sorted((run / "facts").glob("*.json"))))
    facts = json.loads(victim.read_text())
    facts["driver"]["driver_version"] = "580.95.05"
    victim.write_text(json.dumps(facts))
    out = tmp_path / "merged"
    proc = k3fleet("merge", str(lab["whole_dir"]), str(run), "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "changed" in lines[0] and victim.name in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("make, code, words", [
    (lambda d: d / "nope", 2, "no such slice"),
    (lambda d: (d / "empty").mkdir() or d / "empty", 2, "neither"),
    (lambda d: (d / "x.json").write_text('{"other": 1}') and d / "x.json", 2, "no k3fleet_audit"),
    (lambda d: (d / "bad.json").write_text("{not json") and d / "bad.json", 2, "not readable JSON"),
])
def test_bad_inputs_one_line(tmp_path: Path, make: Any, code: int, words: str) -> None:
    path = make(tmp_path)
    proc = k3fleet("merge", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _facts_file(d: Path, collected_at: Any) -> Path:
    """An AWX artifacts file whose one host's facts carry ``collected_at`` as given (raw JSON)."""
    f = d / "artifacts.json"
    f.write_text('{"k3fleet_audit": {"facts": {"gpu-x01": {"schema_version": "1.0", "host": "gpu-x01", '
                 f'"collected_at": {collected_at}}}}}}}}}')
    return f


def _runner_job(d: Path, events: list[Any], status: bytes = b"successful") -> Path:
    """An ansible-runner artifact directory with these job events (raw JSON text each)."""
    job = d / "artifacts" / "job"
    (job / "job_events").mkdir(parents=True)
    for i, event in enumerate(events, 1):
        (job / "job_events" / f"{i}-event.json").write_text(event)
    (job / "status").write_bytes(status)
    return d


_OK_EVENT = ('{"counter": 1, "event": "runner_on_unreachable", "created": "2025-06-01T10:00:00", '
             '"event_data": {"host": "gpu-x01", "res": {"msg": "timed out"}}}')


# Each of these was a traceback; each is now one line naming the slice, what is wrong and where.
@pytest.mark.parametrize("make, words", [
    (lambda d: _facts_file(d, "1e300"), "collected_at 1e+300: out of the range of a date"),
    (lambda d: _facts_file(d, "NaN"), "collected_at nan: not a finite number"),
    (lambda d: _facts_file(d, "Infinity"), "collected_at inf: not a finite number"),
    (lambda d: _facts_file(d, '"2999-01-01T00:00:00Z"'), "ahead of this controller's clock"),
    (lambda d: _runner_job(d, [_OK_EVENT.replace('"2025-06-01T10:00:00"', "NaN")]),
     "event created nan: not a finite number"),
    (lambda d: _runner_job(d, [_OK_EVENT.replace('"counter": 1', '"counter": "one"')]),
     "counter 'one' is not an integer"),
    (lambda d: _runner_job(d, [_OK_EVENT.replace('"counter": 1', '"counter": 1.5')]),
     "counter 1.5 is not an integer"),
    (lambda d: _runner_job(d, ['{"counter": 1, "event": "runner_on_ok", "event_data": ["gpu-x01"]}']),
     "event_data is a list, not an object"),
    (lambda d: _runner_job(d, ['{"counter": 1, "event": "playbook_on_stats", "event_data": '
                               '{"artifact_data": [1]}}']),
     "artifact_data is a list, not an object"),
    (lambda d: _runner_job(d, [_OK_EVENT], status=b"\x00\x01\xffELF"), "is binary, not an ansible-runner status"),
    (lambda d: _runner_job(d, [_OK_EVENT], status=b"succ\xffessful"), "is not UTF-8 text"),
])
def test_malformed_slices_one_line_exit_2(tmp_path: Path, make: Any, words: str) -> None:
    path = make(tmp_path)
    proc = k3fleet("merge", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert words in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_merge_benchmark_prints_the_merge_and_its_floor_side_by_side() -> None:
    """`scripts/bench_verdict.py --merge N` (make bench-merge, docs/scale.md): the merge as its own
    process, then the floor on the same slices (sha256sum, cp -r, json.loads), as a ratio. Figures
    are printed, never asserted; what is checked is that both ran and the merged run verified."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_verdict.py"), "--merge", "60",
                           "--slices", "3"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert re.search(r"^merge 60 hosts: [0-9.]+ s wall, [0-9]+ MB peak RSS$", out, re.M), out
    assert "manifest verified" in out and "exit 1, the verdict's" in out, out
    assert re.search(r"^floor on the same slices, no k3fleet: sha256sum of every slice file [0-9.]+ s wall, "
                     r"[0-9.]+ s CPU; cp -r of the facts .*; json.loads of each facts file ", out, re.M), out
    assert re.search(r"merge / floor \(CPU\): [0-9.]+$", out, re.M), out
