"""``k3fleet watch`` against the vLLM simulator, with the baseline of a real approved decision.

Healthy: no trigger for the whole window. Made to crash (its engine dies as on an OOM) or to drop
its prefix cache: the right trigger within two intervals of the fault.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from decide_helpers import k3fleet, load_probe_ran

pytestmark = pytest.mark.integration

INTERVAL = 1.5


@pytest.fixture(scope="module")
def approved(matched_audit: Path, accept_run: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = accept_run("healthy")
    if not load_probe_ran(run):
        pytest.skip("the load probe is not in this build: no decision can be approved without it")
    out = tmp_path_factory.mktemp("watch") / "decision"
    proc = k3fleet("decide", str(matched_audit), str(run), "--reviewer", "carol", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (out / "baseline.json").is_file()
    return out


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


def _watch(base_url: str, baseline: Path, out: Path, window: str) -> subprocess.Popen[str]:
    bindir = Path(sys.executable).parent
    return subprocess.Popen([str(bindir / "k3fleet"), "watch", "--base-url", base_url, "--baseline", str(baseline),
                             "--for", window, "--interval", str(INTERVAL), "--json", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


def test_healthy_server_fires_no_trigger(approved: Path, sim: Any, tmp_path: Path) -> None:
    with Traffic(sim.base_url):
        proc = _watch(sim.base_url, approved, tmp_path / "w", "15s")
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    data = json.loads(stdout)
    assert data["triggers"] == [] and data["rollback"] is None and data["samples"] >= 3
    samples = _samples(tmp_path / "w")
    assert all(s["health"] == 200 and s["agent"] == {"one_required_arg": "pass", "streaming_deltas": "pass"}
               for s in samples), samples
    assert "-> ok" in stderr


@pytest.mark.parametrize("fault", ["crash", "drop_cache"])
def test_fault_fires_the_right_trigger_within_two_intervals(fault: str, approved: Path, sim: Any,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "w"
    with Traffic(sim.base_url):
        proc = _watch(sim.base_url, approved, out, "120s")
        _wait_for_samples(out, proc, 3)
        t_fault = time.time()
        if fault == "crash":
            sim.call(sim.engine._crash)
        else:
            sim.call(lambda: setattr(sim.engine.kv, "prefix_caching", False))
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-3000:]
    data = json.loads(stdout)
    want = "process_restart_or_oom" if fault == "crash" else "cache_hit_regression"
    fired = {t["id"]: t for t in data["triggers"]}
    assert want in fired, data["triggers"]
    # Within two intervals: the trigger comes from one of the first two samples taken after the fault
    # (counted in samples, not seconds: a loaded machine stretches an interval, never the count).
    after = [s["at"] for s in _samples(out) if s["at"] >= t_fault]
    assert fired[want]["at"] in after[:2], (fired[want]["at"] - t_fault, after)
    rollback = data["rollback"]
    baseline = json.loads((approved / "baseline.json").read_text())
    assert rollback["image"] == f"{baseline['image']}@{baseline['image_digest']}"
    assert rollback["launch_command"] == baseline["launch_command"]
    assert rollback["parallel"]["data_parallel_size"] == 2
    assert json.loads((out / "watch.json").read_text())["exit_code"] == 1


def test_unapproved_decision_and_unreachable_endpoint(healthy_audit: Path, tmp_path: Path) -> None:
    dec = tmp_path / "d"
    assert k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(dec)).returncode == 3
    proc = k3fleet("watch", "--base-url", "http://127.0.0.1:9", "--baseline", str(dec), "--for", "3s",
                   "--runs-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "was not approved" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unreachable_endpoint_is_exit_3(approved: Path, tmp_path: Path) -> None:
    proc = k3fleet("watch", "--base-url", "http://127.0.0.1:9", "--baseline", str(approved), "--for", "3s",
                   "--interval", "1", "--runs-dir", str(tmp_path / "r"))
    assert proc.returncode == 3 and "cannot watch" in proc.stderr, proc.stderr
