"""`k3fleet lab demo`: the whole path on the lab, each step with the command it runs.

audit the lab fleet -> its change plan -> `upgrade --check` on a lab host (the lab's apt sandbox
and Slurm stand-in, k3fleet.lab.changelab) -> `accept all` on the vLLM simulator -> `decide` with
a throwaway signing key -> `verify-evidence` -> `watch` for a short window -> "next:" lines.

Every step is the real command line in a subprocess, printed before it runs, so a reader can run
any of them again. The lab fleet is no-go on purpose (R575 hosts, faulty hosts, one unreachable):
that step is "no-go", not a failure. The decision is taken over the fleet the change night leaves
behind (two R580 hosts holding the accepted image), so the demo reaches an approved decision and a
watch window.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from k3fleet.contracts import result_code
from k3fleet.errors import UsageError
from k3fleet.evidence import layout
from k3fleet.lab import changelab
from k3fleet.paths import data_dir
from k3fleet.report.escapes import safe_text

DATA = Path(__file__).resolve().parent / "demo_data"
# The production profile the quick schedule covers (docs/decision.md): 4 sessions, 1024-token p99 context.
PROFILE = Path(__file__).resolve().parents[1] / "targets" / "profiles" / "lab-small.yaml"
MODEL = "moonshotai/Kimi-K3"
# A fast simulator and a short load schedule (what the decision tests use): the whole demo fits in
# a few minutes on two cores. The production profile lab-small is sized to this schedule.
# The simulator's default prefill cost stays: cold and warm prefixes differ by design (docs/acceptance-load.md).
SIM_OPTIONS = ("--itl-ms", "2")
QUICK_LOAD = {"ladder_tokens": [256, 1024], "ladder_output_tokens": 8, "ladder_repeats": 1, "ramp": [1, 2, 4],
              "step_s": 1.5, "sustained_s": 1.5, "system_prompt_tokens": 2000, "turn_output_tokens": 24,
              "sample_interval_s": 0.25}
# A window of a number of samples, not of a time: a busy machine stretches it, never cuts it short.
WATCH_WINDOW = ("--samples", "4", "--interval", "3")
MARKER = ".k3fleet-demo"  # a work directory holding this is the demo's own, safe to start again
_OUTCOMES = {0: "ok", 1: "no-go", 2: "bad input", 3: "incomplete"}


@dataclass
class Step:
    name: str
    rc: int | None  # None: skipped
    expected: tuple[int, ...]
    note: str = ""

    @property
    def good(self) -> bool:
        return self.rc is None or self.rc in self.expected

    def line(self) -> str:
        if self.rc is None:
            return f"{self.name:<16} skipped: {self.note}"
        what = _OUTCOMES.get(self.rc, f"exit {self.rc}")
        verdict = "as expected" if self.good else "FAILED"
        return f"{self.name:<16} {what} (exit {self.rc}, {verdict}){': ' + self.note if self.note else ''}"


@dataclass
class Demo:
    work: Path
    steps: list[Step] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(safe_text(text), flush=True)

    def command(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        self.say("")
        self.say(f"$ {shown + ' ' if shown else ''}{shlex.join(argv)}")

    def run(self, name: str, args: Sequence[str], expected: tuple[int, ...] = (0,), env: dict[str, str] | None = None,
            note: Callable[[int], str] | None = None, shown: str = "") -> int:
        argv = ["k3fleet", *args]
        self.command(argv, env)
        if shown:
            # The display redactor hides a key option's value; the reader still learns which file it is.
            self.say(f"({shown})")
        # The command's own output goes straight to the terminal, as if typed.
        try:
            rc = subprocess.run([_k3fleet(), *args], env={**os.environ, **(env or {})}, check=False,
                                timeout=900).returncode
        except subprocess.TimeoutExpired:
            rc = 124  # a hang guard: no step of the demo takes minutes
        self.steps.append(Step(name, rc, expected, note(rc) if note else ""))
        return rc


def _k3fleet() -> str:
    """The k3fleet of this interpreter's environment (the venv `make demo` made), else the one on PATH."""
    beside = Path(sys.executable).parent / "k3fleet"
    return str(beside) if beside.is_file() else (shutil.which("k3fleet") or "k3fleet")


def _claim(work: Path) -> None:
    """Start from an empty work directory; only a previous demo's directory is removed."""
    if work.exists():
        if not (work / MARKER).is_file():
            if any(work.iterdir()):
                raise UsageError(f"{work}: exists and is not a demo work directory; give another --workdir")
        else:
            shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("k3fleet lab demo work directory: removed by the next demo\n")


def _after_change_fleet() -> Path:
    """The canary and its neighbour after the change night: R580, holding the accepted image."""
    return data_dir("inventories/lab/after-change.yaml")


class Simulator:
    """`k3fleet lab serve-vllm` in the background, on a free loopback port."""

    def __init__(self, demo: Demo) -> None:
        args = ["lab", "serve-vllm", "--port", "0", *SIM_OPTIONS]
        demo.say("")
        demo.say(f"$ {shlex.join(['k3fleet', *args])} &")
        self.log = demo.work / "serve-vllm.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen([_k3fleet(), *args], stdout=self._log, stderr=subprocess.STDOUT, text=True)
        self.base_url = self._wait_listening()
        demo.say(f"listening on {self.base_url} (its log: {self.log})")

    def _wait_listening(self, timeout: float = 120) -> str:
        # A hang guard only: the server prints "listening on URL" once it is bound.
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in self.log.read_text().splitlines():
                if line.startswith("listening on "):
                    return line.split()[-1]
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise UsageError(f"the vLLM simulator did not start: see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._log.close()


def _keys(demo: Demo) -> tuple[Path, Path]:
    """A throwaway ed25519 key made by ssh-keygen, and the allowed-signers file naming it."""
    if shutil.which("ssh-keygen") is None:
        raise UsageError("the demo signs its evidence package with ssh-keygen: install the OpenSSH client")
    key = demo.work / "keys" / "reviewer"
    key.parent.mkdir()
    argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "demo-reviewer", "-f", str(key)]
    demo.command(argv)
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    pub = key.with_name(key.name + ".pub").read_text().split()
    allowed = demo.work / "keys" / "allowed_signers"
    allowed.write_text(f'carol@example.org namespaces="k3fleet-evidence" {pub[0]} {pub[1]}\n')
    demo.say(f"allowed signers: {allowed} (carol@example.org, namespace k3fleet-evidence)")
    return key, allowed


def _plan_canary(audit: Path) -> str | None:
    """The canary the audit's plan proposes (its verdict.json), or None when it has none or cannot be read."""
    try:
        canary = json.loads((audit / layout.VERDICT).read_text())["plan"]["canary"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return canary.get("host") if isinstance(canary, dict) else None


def run_demo(work: Path) -> int:
    """Run the whole path in ``work``; 0 when every step ended as the lab means it to."""
    work = work.resolve()
    _claim(work)
    demo = Demo(work)
    started = time.monotonic()
    demo.say(f"k3fleet lab demo: the whole path on the lab, in {work}")

    # 1. The lab fleet: no-go on purpose (R575 hosts, faulty hosts, one that does not answer).
    audit = work / "audit"
    demo.run("audit --lab", ["audit", "--lab", "--out", str(audit)], expected=(1, 3),
             note=lambda rc: "the lab fleet is no-go on purpose: R575 hosts, faults, one unreachable")
    demo.run("plan", ["plan", "--run", str(audit)])

    # 2. The change night in check mode on a lab host with the lab's apt sandbox and Slurm stand-in.
    missing = changelab.missing_tools()
    if missing:
        demo.steps.append(Step("upgrade --check", None, (0,),
                               f"needs {', '.join(missing)} (Debian: {' '.join(changelab.DEBIAN_PACKAGES)}; "
                               "make demo installs them as root)"))
        demo.say("")
        demo.say(f"upgrade --check skipped: this machine lacks {', '.join(missing)}")
    else:
        demo.say("")
        demo.say(f"lab: a private apt state over the stand-in driver repository and a Slurm stand-in for "
                 f"{changelab.CANARY} in {work / 'change'}")
        lab = changelab.prepare(work / "change")
        planned = _plan_canary(audit)
        if planned and planned != lab.canary:
            # Said, not left for the reader to notice: the plan above proposed another canary.
            demo.say(f"canary: the plan above proposes {planned} (idle, unblocked); the rehearsal plans "
                     f"{lab.canary} instead, the R575 host whose apt state and Slurm node (with a running job) "
                     "the lab replays, so the drain and the package transaction have something to show; on your "
                     "fleet, leave --canary out and the plan's canary is taken")
        demo.run("upgrade --check", ["upgrade", "-i", str(lab.inventory), "--change-id", "CHG-DEMO", "--operator",
                                     "alice", "--canary", lab.canary, "--check", "--runs-dir",
                                     str(work / "change-runs"),
                                     # The lab's strategy spans two nodes: the smoke needs a one-node command.
                                     "--launch-file", str(DATA / "launch_smoke_one_node.txt")], env=lab.env,
                 note=lambda rc: "planned, nothing changed" if rc == 0 else "")

    # 3. The fleet the change night leaves behind, accepted on the simulator, decided, watched.
    after = work / "audit-after"
    demo.run("audit after", ["audit", "--lab", "-i", str(_after_change_fleet()), "--out", str(after)],
             note=lambda rc: "the two hosts after the change night")
    sim = Simulator(demo)
    try:
        accept = work / "accept"
        options = [x for k, v in QUICK_LOAD.items() for x in ("--load-option", f"{k}={json.dumps(v)}")]
        demo.run("accept all", ["accept", "all", "--base-url", sim.base_url, "--model", MODEL,
                                "--log", str(DATA / "startup_kimi_k3_tp8_dp2.log"),
                                "--launch-command", str(DATA / "launch_kimi_k3_tp8_dp2.txt"),
                                "--agent-repeats", "6", "--prefix-repeats", "3",
                                "--profile", str(PROFILE), "--out", str(accept), *options])
        key, allowed = _keys(demo)
        decision = work / "decision"
        demo.run("decide", ["decide", str(after), str(accept), "--reviewer", "carol", "--rollback-owner", "erin",
                            "--profile", str(PROFILE), "--sign-key", str(key),
                            "--out", str(decision)], expected=(0, 1),
                 shown=f"the signing key option names the file made by ssh-keygen above: {key}",
                 note=lambda rc: "approved" if rc == 0 else "not approved: the checklist says why")
        package = layout.package_beside(decision)
        if package.is_file():
            demo.run("verify-evidence", ["verify-evidence", str(package), "--allowed-signers", str(allowed)])
        if (decision / layout.BASELINE).is_file():
            demo.run("watch", ["watch", "--base-url", sim.base_url, "--baseline", str(package), "--allowed-signers",
                               str(allowed), *WATCH_WINDOW, "--out", str(work / "watch")],
                     note=lambda rc: "no rollback trigger" if rc == 0 else "")
        else:
            demo.steps.append(Step("watch", None, (0,), "no approved decision to watch"))
    finally:
        sim.stop()

    demo.say("")
    demo.say(f"== the path, in {time.monotonic() - started:.0f}s")
    for step in demo.steps:
        demo.say(step.line())
    for line in _next_lines(work, package):
        demo.say(line)
    return result_code(failed=not all(s.good for s in demo.steps))


def _next_lines(work: Path, package: Path) -> list[str]:
    return [
        f"next: read the lab audit as a report: k3fleet report {work / 'audit'} --format html --out "
        f"{work / 'audit.html'}",
        f"next: the accepted serving figures: k3fleet report {work / 'accept'} --format html --out "
        f"{work / 'accept.html'}",
        f"next: check the signed package anywhere: k3fleet verify-evidence {package} --allowed-signers "
        f"{work / 'keys' / 'allowed_signers'}",
        "next: your own fleet: k3fleet audit -i INVENTORY, then k3fleet upgrade -i INVENTORY --change-id ID "
        "--operator NAME --check",
    ]
