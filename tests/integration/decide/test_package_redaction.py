"""A token in the environment, in a launch command and in a captured log never reaches the evidence package."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
from decide_helpers import k3fleet

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parents[2] / "fixtures"
CANARY = {
    "env": "hf_envCanary7Qk2Lw9Xz3Vb8Np",
    "api_key": "sk-apiKeyCanary4Rt6Yu8Io0Pa",
    "launch": "hf_launchCanary2Sd4Fg6Hj8Kl",
    "log": "sk-logCanary1Zx3Cv5Bn7Mq9Wn",
}


def test_no_canary_in_the_package(matched_audit: Path, simulator: Any, evidence_keys: Any, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"HF_TOKEN": CANARY["env"], "VLLM_API_KEY": CANARY["api_key"]}
    # The simulator runs in this process and reads its key from here; the commands get it in their env.
    monkeypatch.setenv("VLLM_API_KEY", CANARY["api_key"])
    sim = simulator(api_key_env="VLLM_API_KEY", itl_ms=2.0, prefill_ms_per_token=0.005)
    launch = tmp_path / "launch.txt"
    launch.write_text((FIX / "decide" / "launch_kimi_k3_tp8_dp2.txt").read_text().replace(
        "hf_exampleexampleexample", CANARY["launch"]).rstrip() + f" \\\n  --api-key {CANARY['launch']}\n")
    log = tmp_path / "vllm.log"
    log.write_text((FIX / "decide" / "startup_kimi_k3_tp8_dp2.log").read_text()
                   + f"(APIServer pid=1) INFO 08-14 09:13:01 [api_server.py:1352] api_key={CANARY['log']}\n"
                   + f"(APIServer pid=1) INFO 08-14 09:13:01 [launcher.py:29] Authorization: Bearer {CANARY['log']}\n")
    acc = tmp_path / "accept"
    proc = k3fleet("accept", "all", "--base-url", sim.base_url, "--model", "moonshotai/Kimi-K3",
                   "--api-key-env", "VLLM_API_KEY", "--log", str(log), "--launch-command", str(launch),
                   "--skip", "load", "--agent-repeats", "2", "--prefix-repeats", "2", "--out", str(acc), "--quiet",
                   env=env)
    assert proc.returncode in (0, 1, 3) and (acc / "manifest.json").is_file(), proc.stderr[-3000:]
    tri = tmp_path / "triage"
    proc = k3fleet("triage", str(log), "--host", "gpu-m01", "--out", str(tri), env=env)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    dec = tmp_path / "decision"
    proc = k3fleet("decide", str(matched_audit), str(acc), str(tri), "--reviewer", "carol", "--out", str(dec),
                   "--sign-key", str(evidence_keys.key), env=env)
    assert proc.returncode in (1, 3), proc.stderr[-3000:]
    archive = dec.with_name(dec.name + ".tar.gz")
    found: dict[str, list[str]] = {}
    with tarfile.open(archive, "r:gz") as tar:
        names = tar.getnames()
        for member in tar:
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            for what, value in CANARY.items():
                if value.encode() in data:
                    found.setdefault(what, []).append(member.name)
    assert found == {}, found
    # The evidence is there, with the secrets replaced (a reviewer sees that a key was present).
    assert any(n.endswith("/inputs/startup.log") for n in names) and any("/inputs/01-vllm.log" in n for n in names)
    # Signed and intact after redaction: what was packaged is what was signed.
    assert k3fleet("verify-evidence", str(archive), "--allowed-signers", str(evidence_keys.allowed)).returncode == 0
