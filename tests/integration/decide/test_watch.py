"""``k3fleet watch`` against the vLLM simulator, with the baseline of a real approved, signed decision.

Idle (only the watch's own probe) and healthy (real traffic): no trigger for the whole window. Each
trigger fires in a test that provokes it: the engine dies as on an OOM, the queue grows at a flat
request rate, the prefix cache drops while prefill gets slower, tool calls fail, a node's kernel log
gains an Xid line. Windows end after a number of samples (``--samples``), never after a time, so a
loaded machine stretches a window, not its verdict. A baseline is taken only from an evidence package
whose signature verifies against --allowed-signers: an audit run, an unsigned package, a forged
package or a run directory rewritten with a regenerated manifest is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from decide_helpers import LAB_PROFILE, k3fleet, load_probe_ran, signed_unapproved

pytestmark = pytest.mark.integration

INTERVAL = 1.5


@pytest.fixture(scope="module")
def approved(matched_audit: Path, accept_run: Any, evidence_keys: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = accept_run("healthy")
    if not load_probe_ran(run):
        pytest.skip("the load probe is not in this build: no decision can be approved without it")
    out = tmp_path_factory.mktemp("watch") / "decision"
    proc = k3fleet("decide", str(matched_audit), str(run), "--reviewer", "carol", "--out", str(out),
                   "--sign-key", str(evidence_keys.key), "--profile", str(LAB_PROFILE), "--rollback-owner", "erin")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (out / "baseline.json").is_file()
    return out


@pytest.fixture(scope="module")
def unapproved(healthy_audit: Path, evidence_keys: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real signed decision that was not approved (no acceptance run), as a forger finds it."""
    out = tmp_path_factory.mktemp("watch-unapproved") / "decision"
    return signed_unapproved(healthy_audit, evidence_keys.key, out)


class Traffic:
    """Agent-like traffic with one long shared system prompt, as production sends between samples."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.stop = threading.Event()
        self.sent = 0
        prefix = " ".join(f"Rule {i}: answer with the facts of the shared context only." for i in range(400))
        self.body = {"model": "moonshotai/Kimi-K3", "max_tokens": 4, "messages": [
            {"role": "system", "content": prefix}, {"role": "user", "content": "status?"}]}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    client.post(f"{self.base_url}/v1/chat/completions", json=self.body)
                    self.sent += 1
                except httpx.HTTPError:
                    pass
                self.stop.wait(0.2)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(15)


def _watch(base_url: str, baseline: Path, allowed: Path, out: Path, samples: int, *extra: str,
           interval: float = INTERVAL) -> subprocess.Popen[str]:
    bindir = Path(sys.executable).parent
    return subprocess.Popen([str(bindir / "k3fleet"), "watch", "--base-url", base_url, "--baseline", str(baseline),
                             "--allowed-signers", str(allowed), "--samples", str(samples), "--for", "2h",
                             "--interval", str(interval), "--min-requests", "5", "--json", "--out", str(out),
                             *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class OpenLoop:
    """Requests sent on a fixed schedule whether or not the last one was answered (as production clients
    do): a server that slows down queues them, at the same arrival rate."""

    def __init__(self, base_url: str, every_s: float = 0.1, most: int = 400) -> None:
        self.base_url, self.every_s, self.most = base_url, every_s, most
        self.stop = threading.Event()
        self.body = {"model": "moonshotai/Kimi-K3", "max_tokens": 4,
                     "messages": [{"role": "user", "content": "status?"}]}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _one(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{self.base_url}/v1/chat/completions", json=self.body, timeout=120)

    def _run(self) -> None:
        for _ in range(self.most):
            if self.stop.wait(self.every_s):
                return
            threading.Thread(target=self._one, daemon=True).start()

    def __enter__(self) -> OpenLoop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(15)


def _package(run: Path) -> Path:
    return run.with_name(run.name + ".tar.gz")


def _samples(out: Path) -> list[dict[str, Any]]:
    p = out / "samples.jsonl"
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _wait_for_samples(out: Path, proc: subprocess.Popen[str], n: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while len(_samples(out)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the watch took no samples"
        time.sleep(0.2)


@pytest.fixture
def sim(simulator: Any) -> Iterator[Any]:
    yield simulator()


CASES = {"one_required_arg": "pass", "streaming_deltas": "pass", "structured_output": "pass"}


def test_idle_approved_server_fires_no_trigger(approved: Path, evidence_keys: Any, sim: Any, tmp_path: Path) -> None:
    """Nothing but the watch's own probe reaches the server: its synthetic prompts share no prefix, so
    the server's hit ratio is its own; a watch that judged it cried wolf within 30 s."""
    proc = _watch(sim.base_url, approved, evidence_keys.allowed, tmp_path / "w", 8, interval=0.5)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    data = json.loads(stdout)
    assert data["triggers"] == [] and data["rollback"] is None and data["samples"] == 8
    samples = _samples(tmp_path / "w")
    assert all(s["agent"] == CASES and s["probe_requests"] >= 3 for s in samples), samples
    # The probe's requests were counted and left out: no real request in any interval.
    assert all(s["window"]["requests"] == 0 for s in samples[1:]), [s.get("window") for s in samples]


def test_healthy_server_fires_no_trigger(approved: Path, evidence_keys: Any, sim: Any, tmp_path: Path) -> None:
    # The run directory, with its signed package beside it.
    with Traffic(sim.base_url):
        proc = _watch(sim.base_url, approved, evidence_keys.allowed, tmp_path / "w", 8)
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    data = json.loads(stdout)
    assert data["triggers"] == [] and data["rollback"] is None and data["samples"] == 8
    samples = _samples(tmp_path / "w")
    assert all(s["health"] == 200 and s["agent"] == CASES for s in samples), samples
    # Real traffic was judged: pools of at least --min-requests real requests with their hit ratio.
    pools = [s["window"] for s in samples[1:] if s["window"].get("pool_requests")]
    assert pools and all(p["pool_requests"] >= 5 and p["pool_hit_ratio"] > 0.5 for p in pools), pools
    assert "-> ok" in stderr


def _fault_run(sim: Any, baseline: Path, allowed: Path, out: Path, fault: Any, *extra: str,
               traffic: Any = None) -> tuple[dict[str, Any], float]:
    """Watch, provoke ``fault`` after 3 samples, and return the watch's JSON and the time of the fault."""
    with traffic or contextlib.nullcontext():
        proc = _watch(sim.base_url, baseline, allowed, out, 40, *extra)
        _wait_for_samples(out, proc, 3)
        t_fault = time.time()
        fault()
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-3000:]
    data = json.loads(stdout)
    assert json.loads((out / "watch.json").read_text())["exit_code"] == 1
    return data, t_fault


def _fired_within(data: dict[str, Any], out: Path, want: str, t_fault: float, samples: int) -> None:
    fired = {t["id"]: t for t in data["triggers"]}
    assert want in fired, data["triggers"]
    # Counted in samples, not seconds: a loaded machine stretches an interval, never the count.
    after = [s["at"] for s in _samples(out) if s["at"] >= t_fault]
    assert fired[want]["at"] in after[:samples], (fired[want]["at"] - t_fault, after)


def test_crash_fires_restart_or_oom_with_the_rollback(approved: Path, evidence_keys: Any, sim: Any,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "w"
    # The signed package itself.
    data, t_fault = _fault_run(sim, _package(approved), evidence_keys.allowed, out, lambda: sim.call(sim.engine._crash),
                               "--agent-every", "0", traffic=Traffic(sim.base_url))
    _fired_within(data, out, "process_restart_or_oom", t_fault, 2)
    rollback = data["rollback"]
    baseline = json.loads((approved / "baseline.json").read_text())
    assert rollback["image"] == f"{baseline['image']}@{baseline['image_digest']}"
    assert rollback["launch_command"] == baseline["launch_command"]
    assert rollback["parallel"]["data_parallel_size"] == 2


def test_cache_drop_with_prefill_rise_fires_cache_regression(approved: Path, evidence_keys: Any, sim: Any,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "w"
    data, t_fault = _fault_run(sim, approved, evidence_keys.allowed, out,
                               lambda: sim.call(lambda: setattr(sim.engine.kv, "prefix_caching", False)),
                               "--agent-every", "0", traffic=Traffic(sim.base_url))
    # --repeat 2 pools of --min-requests 5 real requests (slower prefill: fewer requests an interval, up to 3
    # intervals a pool), and the first pool after the fault may straddle it.
    _fired_within(data, out, "cache_hit_regression", t_fault, 8)
    message = next(t["message"] for t in data["triggers"] if t["id"] == "cache_hit_regression")
    assert "real requests" in message and "prefill" in message


def test_queue_growth_at_a_flat_rate_fires(approved: Path, evidence_keys: Any, sim: Any, tmp_path: Path) -> None:
    out = tmp_path / "w"

    def slow_down() -> None:
        def apply() -> None:
            sim.engine.cfg.max_num_seqs = 1
            sim.engine.cfg.itl_ms = 100.0
        sim.call(apply)

    data, t_fault = _fault_run(sim, approved, evidence_keys.allowed, out, slow_down, "--agent-every", "0",
                               traffic=OpenLoop(sim.base_url))
    _fired_within(data, out, "queue_growth", t_fault, 5)


def test_tool_call_failures_fire(approved: Path, evidence_keys: Any, sim: Any, tmp_path: Path) -> None:
    out = tmp_path / "w"
    data, t_fault = _fault_run(sim, approved, evidence_keys.allowed, out,
                               lambda: sim.call(lambda: sim.engine.cfg.defects.update(invalid_arguments=1.0)))
    _fired_within(data, out, "schema_invalid_tool_calls", t_fault, 3)
    message = next(t["message"] for t in data["triggers"] if t["id"] == "schema_invalid_tool_calls")
    assert "one_required_arg" in message


def test_node_error_line_fires(approved: Path, evidence_keys: Any, sim: Any, tmp_path: Path) -> None:
    """An Xid line appended to a node's kernel log during the watch fires; the Xid 79 dated before the
    approval that the file held from the start does not."""
    log = tmp_path / "gpu-b01-kern.log"
    log.write_text("2020-01-01T00:00:00+0000 gpu-b01 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off "
                   "the bus\n[  12.000000] nvidia-nvlink: Nvlink Core is being initialized\n")
    out = tmp_path / "w"

    def xid() -> None:
        with log.open("a") as f:
            f.write("[ 5012.345678] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n")

    data, t_fault = _fault_run(sim, approved, evidence_keys.allowed, out, xid, "--node-log", str(log),
                               "--agent-every", "0")
    _fired_within(data, out, "node_errors", t_fault, 2)
    before = [s for s in _samples(out) if s["at"] < t_fault]
    assert before and all(not s.get("node_errors") for s in before)
    message = next(t["message"] for t in data["triggers"] if t["id"] == "node_errors")
    assert "gpu-b01-kern.log" in message and "Xid 79" in message


def test_the_log_is_judged_by_the_decisions_own_target(approved: Path) -> None:
    """The signed package carries the target its audit recorded; watch judges node logs by that one."""
    from k3fleet.decide.package import verify_package
    from k3fleet.decide.watch import package_target
    from k3fleet.evidence import layout
    from k3fleet.evidence.reader import RunReader

    summary = RunReader(approved).object(layout.SUMMARY)
    ref = summary["target"]["ref"]
    assert ref["file"] == layout.TARGET
    target = package_target(verify_package(layout.package_beside(approved), keep=True))
    assert target is not None and target.name == summary["target"]["name"]


def _watch_once(baseline: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return k3fleet("watch", "--base-url", "http://127.0.0.1:9", "--baseline", str(baseline), "--for", "3s",
                   "--interval", "1", "--runs-dir", str(tmp_path / "r"), *extra)


def _refused(proc: subprocess.CompletedProcess[str], tmp_path: Path, code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, lines
    assert not (tmp_path / "r").exists()  # refused before any run directory is written
    return lines[0]


def test_unapproved_decision_and_unreachable_endpoint(unapproved: Path, evidence_keys: Any, tmp_path: Path) -> None:
    line = _refused(_watch_once(unapproved, tmp_path, "--allowed-signers", str(evidence_keys.allowed)), tmp_path)
    assert "was not approved" in line


def test_unreachable_endpoint_is_exit_3(approved: Path, evidence_keys: Any, tmp_path: Path) -> None:
    proc = _watch_once(approved, tmp_path, "--allowed-signers", str(evidence_keys.allowed))
    assert proc.returncode == 3 and "cannot watch" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("extra", "want"), [
    (("--base-url", "ftp://x"), "--base-url: Value error, 'ftp://x' is not an http(s) URL with a host"),
    (("--base-url", "http://127.0.0.1:9", "--api-key-env", "K3FLEET_TEST_UNSET_KEY"), "K3FLEET_TEST_UNSET_KEY"),
])
def test_a_bad_endpoint_is_refused_before_the_run_exists(approved: Path, evidence_keys: Any, tmp_path: Path,
                                                          extra: tuple[str, ...], want: str) -> None:
    """Issue 35: `watch --base-url ftp://x` left a half-written run directory; now it is a usage error first."""
    proc = k3fleet("watch", "--baseline", str(approved), "--allowed-signers", str(evidence_keys.allowed),
                   "--for", "3s", "--interval", "1", "--runs-dir", str(tmp_path / "r"), *extra)
    line = _refused(proc, tmp_path)
    assert want.split(": Value error, ")[-1] in line, line


def test_an_audit_run_is_not_a_baseline(healthy_audit: Path, evidence_keys: Any, tmp_path: Path) -> None:
    line = _refused(_watch_once(healthy_audit, tmp_path, "--allowed-signers", str(evidence_keys.allowed)), tmp_path)
    assert f"--baseline {healthy_audit} is an audit run, not a decision" in line
    assert "signed evidence package (.tar.gz)" in line


def test_allowed_signers_are_required(unapproved: Path, tmp_path: Path) -> None:
    line = _refused(_watch_once(_package(unapproved), tmp_path), tmp_path)
    assert "--allowed-signers FILE is required" in line


def _signed_meta(when: _dt.datetime) -> dict[str, Any]:
    """What PACKAGE.json says of an approval: the decision, its reviewer (the signer's principal) and time."""
    return {"decision": {"outcome": "go_live", "approved": True}, "reviewer": "carol",
            "reviewed_at": when.replace(microsecond=0).isoformat()}


def _approve(run: Path) -> None:
    """What a forger does to a run directory: approve it, add a baseline, regenerate its manifest."""
    from k3fleet.evidence import RunDir, verify_run

    decision = json.loads((run / "decision.json").read_text())
    decision.update(outcome="go_live", approved=True, exit_code=0)
    (run / "decision.json").write_text(json.dumps(decision))
    (run / "baseline.json").write_text(json.dumps({"image": "registry.example/forged:latest",
                                                   "model": "moonshotai/Kimi-K3", "concurrency_ceiling": 10_000}))
    RunDir.open(run).write_manifest()
    assert verify_run(run).ok


def test_forged_baseline_with_a_regenerated_manifest_is_refused(unapproved: Path, evidence_keys: Any,
                                                                tmp_path: Path) -> None:
    forged = tmp_path / "decision"
    shutil.copytree(unapproved, forged)
    _approve(forged)
    # Without the package: a run directory alone proves nothing.
    line = _refused(_watch_once(forged, tmp_path, "--allowed-signers", str(evidence_keys.allowed)), tmp_path)
    assert "no evidence package decision.tar.gz beside it" in line
    # With the original signed package beside it: the manifest is not the one that was signed.
    shutil.copy(_package(unapproved), _package(forged))
    line = _refused(_watch_once(forged, tmp_path, "--allowed-signers", str(evidence_keys.allowed)), tmp_path)
    assert "is not the decision its signed package decision.tar.gz holds" in line


def _rebuild(archive: Path, dest: Path, change: dict[str, bytes], drop: tuple[str, ...] = ()) -> None:
    """The package with members replaced and PACKAGE.json rewritten to match them (the signature kept)."""
    with tarfile.open(archive, "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    root = next(iter(members)).split("/", 1)[0]
    members.update({f"{root}/{k}": v for k, v in change.items()})
    for name in drop:
        members.pop(f"{root}/{name}", None)
    manifest = json.loads(members[f"{root}/PACKAGE.json"])
    listed = {f["path"] for f in manifest["files"]}
    manifest["files"] = [f for f in manifest["files"] if f"{root}/{f['path']}" in members]
    for rel in change:
        if rel not in listed:
            manifest["files"].append({"path": rel, "sha256": "", "bytes": 0})
    for f in manifest["files"]:
        data = members[f"{root}/{f['path']}"]
        f["sha256"], f["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    if "PACKAGE.json.sig" in drop:
        manifest["signer"] = None
    members[f"{root}/PACKAGE.json"] = json.dumps(manifest, indent=2).encode()
    with tarfile.open(dest, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("attack, words", [
    ("signature_kept", "the evidence package's signature fails: the signature does not match PACKAGE.json"),
    ("unsigned", "is unsigned: nothing proves who approved it"),
])
def test_forged_package_is_refused(unapproved: Path, evidence_keys: Any, tmp_path: Path, attack: str,
                                   words: str) -> None:
    forged = tmp_path / "decision"
    shutil.copytree(unapproved, forged)
    _approve(forged)
    change = {f"decision/{n}": (forged / n).read_bytes() for n in ("decision.json", "baseline.json", "manifest.json")}
    bad = tmp_path / "forged.tar.gz"
    _rebuild(_package(unapproved), bad, change, drop=("PACKAGE.json.sig",) if attack == "unsigned" else ())
    line = _refused(_watch_once(bad, tmp_path, "--allowed-signers", str(evidence_keys.allowed)), tmp_path)
    assert words in line


def test_only_the_signature_makes_a_baseline_trusted(unapproved: Path, evidence_keys: Any, tmp_path: Path) -> None:
    """The same approved run directory, packaged and signed by the key the allowed-signers file names:
    accepted (the watch gets as far as the endpoint); signed by a stranger: refused."""
    from k3fleet.decide.package import write_package
    from k3fleet.decide.signing import signing_key

    run = tmp_path / "decision"
    shutil.copytree(unapproved, run)
    _approve(run)
    now = _dt.datetime.now(_dt.UTC)
    meta = _signed_meta(now)
    write_package(_package(run), run.name, run, [], meta, mtime=now, sign=signing_key(evidence_keys.key))
    proc = _watch_once(run, tmp_path, "--allowed-signers", str(evidence_keys.allowed))
    assert proc.returncode == 3 and "cannot watch" in proc.stderr, proc.stderr
    shutil.rmtree(tmp_path / "r")
    stranger = tmp_path / "by-stranger.tar.gz"
    write_package(stranger, run.name, run, [], meta, mtime=now, sign=signing_key(evidence_keys.stranger))
    line = _refused(_watch_once(stranger, tmp_path, "--allowed-signers", str(evidence_keys.allowed)), tmp_path)
    assert f"signed by ED25519 key {evidence_keys.stranger_fingerprint}, which is not in" in line


def test_the_watch_samples_the_gpus(approved: Path, evidence_keys: Any, sim: Any, tmp_path: Path) -> None:
    """--telemetry-url: each sample keeps every GPU's memory, power and utilisation (the simulator's DCGM page)."""
    proc = _watch(sim.base_url, approved, evidence_keys.allowed, tmp_path / "w", 3, "--agent-every", "0",
                  "--telemetry-url", sim.base_url + "/dcgm/metrics", interval=0.5)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    samples = _samples(tmp_path / "w")
    assert len(samples) == 3 and all(s["telemetry_error"] is None for s in samples), samples
    gpu = samples[-1]["gpus"]["vllm-sim/0"]
    assert gpu["used_mib"] + gpu["free_mib"] == 143771 and gpu["power_w"] >= 91
    bad = _watch(sim.base_url, approved, evidence_keys.allowed, tmp_path / "b", 1, "--agent-every", "0",
                 "--telemetry-url", "ftp://x")
    _, err = bad.communicate(timeout=120)
    assert bad.returncode == 2 and "--telemetry-url" in err


def _approved_package(unapproved: Path, tmp_path: Path, evidence_keys: Any, when: _dt.datetime) -> Path:
    """An approved decision (as _approve makes it) packaged in a runs tree and signed by carol at ``when``."""
    from k3fleet.decide.package import write_package
    from k3fleet.decide.signing import signing_key

    tree = tmp_path / "runs"
    tree.mkdir(exist_ok=True)
    run = tree / "decision"
    shutil.copytree(unapproved, run)
    _approve(run)
    write_package(_package(run), run.name, run, [], _signed_meta(when), mtime=when,
                  sign=signing_key(evidence_keys.key))
    return _package(run)


def test_an_approval_replaced_by_a_later_decision_is_refused(unapproved: Path, healthy_audit: Path,
                                                             evidence_keys: Any, tmp_path: Path) -> None:
    """Replay: an older genuine approval, after a later decision in the same runs tree (whatever its outcome)."""
    package = _approved_package(unapproved, tmp_path, evidence_keys, _dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=1))
    later = k3fleet("decide", str(healthy_audit), "--reviewer", "dave", "--out", str(package.parent / "no-go"))
    assert later.returncode == 3, later.stderr[-2000:]
    line = _refused(_watch_once(package, tmp_path, "--allowed-signers", str(evidence_keys.allowed)), tmp_path)
    assert "a later decision no-go (" in line and "replaces it" in line


def test_an_approval_older_than_max_age_is_refused(unapproved: Path, evidence_keys: Any, tmp_path: Path) -> None:
    package = _approved_package(unapproved, tmp_path, evidence_keys, _dt.datetime.now(_dt.UTC) - _dt.timedelta(days=2))
    line = _refused(_watch_once(package, tmp_path, "--allowed-signers", str(evidence_keys.allowed), "--max-age", "1d"),
                    tmp_path)
    assert "older than --max-age (1 days)" in line
    proc = _watch_once(package, tmp_path, "--allowed-signers", str(evidence_keys.allowed), "--max-age", "3d")
    assert proc.returncode == 3 and "cannot watch" in proc.stderr, proc.stderr


def test_the_baseline_used_is_the_one_verified(unapproved: Path, evidence_keys: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The package swapped on disk for an unsigned one (another image) right after its signature was checked:
    watch uses the copy it verified, never the swapped-in file."""
    from k3fleet.decide import watch

    package = _approved_package(unapproved, tmp_path, evidence_keys, _dt.datetime.now(_dt.UTC))
    swapped = tmp_path / "swapped.tar.gz"
    change = {"decision/baseline.json": json.dumps({"image": "registry.example/other:latest",
                                                    "model": "moonshotai/Kimi-K3"}).encode()}
    _rebuild(package, swapped, change, drop=("PACKAGE.json.sig",))
    verify = watch.verify_package

    def verify_then_swap(*args: Any, **kwargs: Any) -> Any:
        check = verify(*args, **kwargs)
        shutil.copyfile(swapped, package)
        return check

    monkeypatch.setattr(watch, "verify_package", verify_then_swap)
    baseline, decision, _ = watch.load_baseline(package, evidence_keys.allowed)
    assert baseline.image == "registry.example/forged:latest" and decision["approved"] is True
    assert package.read_bytes() == swapped.read_bytes()  # the file on disk was swapped after the check
