"""Benchmark: the full audit against a one-command Ansible baseline on the same lab hosts.

Two modes, figures only (no assertions), side by side in one run with the ratio:

local (default): the simulated lab over Ansible's local connection. For each size, time
  baseline: ansible -m ansible.builtin.command -a 'cat <root>/proc/driver/nvidia/version'
  audit:    k3fleet audit --lab (same hosts, same forks)
  controller CPU is the whole process tree, which on the local connection includes the modules.

--ssh (root): the SSH lab fleet (k3fleet lab ssh-fleet: one network namespace and sshd per host).
  For each size the fleet comes up once (its start-up time and memory are reported), then the
  same two runs go through real SSH with pipelining and ControlPersist, each from cold
  connections (every ControlPersist master of the previous run is closed first). Per run:
    controller CPU: the run's process tree plus its ssh ControlPersist masters (this process is a
      child subreaper, so the masters that detach are reparented here and reaped when closed);
    node CPU: the sshd listeners with their reaped sessions and modules (read from /proc);
  both include nothing of the other side. The audit's own row also shows the k3fleet process's
  CPU apart ("k3fleet"): the rest of its controller CPU is ansible-playbook and ssh. --playbook
  adds ansible-playbook audit.yml run by hand (Ansible's own share of the audit, without k3fleet);
  --mitogen adds the baseline and audit runs under Mitogen's mitogen_linear strategy. --repeat N
  runs every size's set N times on the same fleet (each run from cold connections), and the end
  prints one table over every size and repeat: audit / baseline ratios of wall and controller CPU,
  node CPU per host of both, and the load averages seen. Use the same --forks for every run: the
  ratio is at equal forks.

--node: the node side of one host apart, where runs can be interleaved on a busy machine. The
  AnsiballZ files Ansible builds for one lab host (ANSIBLE_KEEP_REMOTE_FILES) are run --repeat times
  each, interleaved: the baseline's command module, the audit module as the lab fleet runs it (with
  the probe) and without the probe (a plain audit), and the plain audit's file without the call the
  collection's action inserts into the wrapper (as Ansible's normal action would ship it). Per run the
  CPU of the process and its children (getrusage); the table gives medians, quartiles and the ratio to
  the baseline. Then each run's split, from the same payload in a fresh interpreter: Ansible's own
  module_utils as the wrapper imports them (files, compiles, compile CPU; the whole-payload finder
  first where the wrapper installs it), and for the audit the k3fleet module_utils (how many, their
  lines, how often compiled, compile CPU, import CPU with those the collectors import where they need
  them), the collectors' Python, and the commands (the lab's replays: their CPU as children); with
  strace on PATH also the execve count of one run of each. No root, no SSH.

    python scripts/bench_audit.py --sizes 50 200 1000 --forks 10
    python scripts/bench_audit.py --ssh --sizes 50 200 1000 --forks 20 --repeat 2
    python scripts/bench_audit.py --node --repeat 30
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ansible_collections.k3fleet.gpu.plugins.plugin_utils import k3fleet_action
from k3fleet.audit.runner import ansible_env
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence import layout
from k3fleet.evidence.reader import RunReader, RunRecord
from k3fleet.lab.fleet import generate_fleet, load_fleet


@dataclass
class Run:
    wall: float
    cpu: float
    rc: int
    node_cpu: float | None = None
    detail: str = ""
    # The k3fleet process's own CPU (the audit run only): the rest of cpu is ansible-playbook and ssh.
    own_cpu: float | None = None


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _reap_adopted() -> None:
    """Collect exited orphans adopted as subreaper (their CPU then counts in RUSAGE_CHILDREN)."""
    from k3fleet.lab.common import supervise

    for _ in supervise.exited_children():
        pass


def _measure(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    before = _children_cpu()
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.monotonic() - t0
    after = _children_cpu()
    if proc.returncode not in (0, 1, 3, 4):
        sys.stderr.write(f"{argv[0]} exited {proc.returncode}: {proc.stderr[-800:]}\n")
    return wall, after - before, proc.returncode, proc.stderr


def _baseline_argv(bindir: Path, inventory: Path, forks: int) -> list[str]:
    return [str(bindir / "ansible"), "all", "-i", str(inventory), "-f", str(forks), "-o",
            "-m", "ansible.builtin.command", "-a", "cat {{ k3fleet_root }}/proc/driver/nvidia/version"]


def _row(n: int, name: str, r: Run) -> None:
    node = f"{r.node_cpu:>8.1f} {r.node_cpu / n:>9.3f}" if r.node_cpu is not None else f"{'':>8} {'':>9}"
    own = f"{r.own_cpu:>7.1f}" if r.own_cpu is not None else f"{'':>7}"
    util = r.cpu / r.wall if r.wall else 0.0
    print(f"{n:>6} {name:<17} {r.wall:>7.1f} {r.cpu:>8.1f} {r.cpu / n:>9.3f} {util:>5.2f} {own} {node} {r.rc:>3}  "
          f"{r.detail}")
    sys.stdout.flush()


def _header() -> None:
    print(f"{'hosts':>6} {'run':<17} {'wall s':>7} {'ctl cpu':>8} {'ctl/host':>9} {'util':>5} {'k3fleet':>7} "
          f"{'node cpu':>8} {'node/host':>9} {'rc':>3}")


def _ratio(n: int, name: str, audit: Run, base: Run) -> None:
    print(f"{n:>6} {name:<17} {audit.wall / base.wall:>7.2f} {audit.cpu / base.cpu:>8.2f}   "
          "(audit / baseline: wall, controller CPU)")
    sys.stdout.flush()


def _saturation(n: int, audit: Run) -> None:
    """Where the controller's CPU, not the nodes, sets the pace: its cores over its CPU per host."""
    cores = os.cpu_count() or 1
    per_host = audit.cpu / n
    rate = cores / per_host if per_host else float("inf")
    print(f"{'':>6} controller-bound: {rate:.1f} hosts/s at most on {cores} cores "
          f"({per_host:.3f} CPU s/host); saturated once forks / node time per host > {rate:.1f}/s; "
          f"1000 hosts >= {1000 / rate:.0f}s, 10000 hosts >= {10000 / rate:.0f}s")
    sys.stdout.flush()


def bench_local(sizes: list[int], forks: int) -> None:
    bindir = Path(sys.executable).parent
    env = {**os.environ, **ansible_env(), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    spec = load_fleet(None)
    _header()
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="k3fleet-bench-") as tmp:
            t0 = time.monotonic()
            inv = generate_fleet(spec, Path(tmp) / "fleet", count=n)
            gen = time.monotonic() - t0
            w, c, rc, _ = _measure(_baseline_argv(bindir, inv, forks), env)
            base = Run(w, c, rc)
            w, c, rc, _ = _measure([str(bindir / "k3fleet"), "audit", "--lab", "--lab-count", str(n), "--forks",
                                    str(forks), "--quiet", "--out", str(Path(tmp) / "run")], env)
            audit = Run(w, c, rc, detail=f"lab generation {gen:.1f}s, inside the audit run too")
            _row(n, "baseline", base)
            _row(n, "audit", audit)
            _ratio(n, "ratio", audit, base)


# -- SSH mode -----------------------------------------------------------------------------------


def _mitogen_strategy_dir() -> str | None:
    try:
        import ansible_mitogen  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return str(path) if path.is_dir() else None


def _sessions_closed(workdir: Path, timeout: float = 20.0) -> None:
    """Wait until no sshd listener has a live child: their sessions' CPU is then in its cutime."""
    from k3fleet.lab import sshfleet
    from k3fleet.lab.common import proc

    listeners = set(sshfleet.sshd_pids(workdir).values())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = False
        for pid in proc.all_pids():
            stat = proc.read_stat(pid)
            if stat is not None and stat[1] in listeners and stat[0] not in ("Z", "X"):
                busy = True
                break
        if not busy:
            return
        time.sleep(0.2)


# Runs the k3fleet CLI as its console script does and reports the process's own CPU on exit, so the
# audit's controller CPU splits into k3fleet's share and ansible-playbook's (with ssh).
_OWN_CPU_MARK = "K3FLEET_BENCH_OWN_CPU"
_OWN_CPU_WRAPPER = (
    "import atexit, resource, sys\n"
    "def _own():\n"
    "    r = resource.getrusage(resource.RUSAGE_SELF)\n"
    f"    sys.stderr.write('{_OWN_CPU_MARK} %.3f\\n' % (r.ru_utime + r.ru_stime))\n"
    "atexit.register(_own)\n"
    "sys.argv[0] = 'k3fleet'\n"
    "from k3fleet.cli import main\n"
    "sys.exit(main())\n"
)


def _own_cpu(stderr: str) -> float | None:
    for line in reversed(stderr.splitlines()):
        if line.startswith(_OWN_CPU_MARK + " "):
            return float(line.split()[1])
    return None


def _ssh_run(argv: list[str], env: dict[str, str], workdir: Path) -> Run:
    from k3fleet.lab import sshfleet

    sshfleet.close_ssh_clients()
    _reap_adopted()
    _sessions_closed(workdir)
    node0 = sshfleet.node_cpu_seconds(workdir)
    cpu0 = _children_cpu()
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    # The run's ControlPersist masters are part of its controller cost: close them, reap them here.
    sshfleet.close_ssh_clients()
    _reap_adopted()
    cpu = _children_cpu() - cpu0
    _sessions_closed(workdir)
    node = sshfleet.node_cpu_seconds(workdir) - node0
    if proc.returncode not in (0, 1, 3, 4):
        sys.stderr.write(f"{argv[0]} exited {proc.returncode}: {proc.stderr[-800:]}\n")
    return Run(wall, cpu, proc.returncode, node, detail=proc.stdout, own_cpu=_own_cpu(proc.stderr))


def _baseline_detail(stdout: str) -> str:
    ok = sum(1 for line in stdout.splitlines() if " | CHANGED | rc=0 " in line)
    unreachable = sum(1 for line in stdout.splitlines() if " | UNREACHABLE!" in line)
    return f"{ok} answered, {unreachable} unreachable"


def _audit_detail(run_dir: Path) -> str:
    run = RunReader(run_dir)
    try:
        record, verdict = run.model(layout.RUN, RunRecord), run.verdict()
    except (UsageError, IncompleteError) as exc:
        return f"no usable {layout.RUN}/{layout.VERDICT}: {exc}"
    return (f"{getattr(record, 'hosts_with_facts', None)} with facts, {len(record.unreachable)} unreachable, "
            f"verdict {verdict.outcome}")


def _playbook_detail(stdout: str) -> str:
    """ok / unreachable counts from PLAY RECAP (printed by the default callback, for this figure only)."""
    ok = unreachable = 0
    for line in stdout.splitlines():
        if " ok=" not in line or " unreachable=" not in line:
            continue
        fields = dict(f.split("=", 1) for f in line.split(":", 1)[1].split() if "=" in f)
        if int(fields.get("unreachable", "0")):
            unreachable += 1
        elif int(fields.get("ok", "0")):
            ok += 1
    return f"{ok} answered, {unreachable} unreachable"


def _playbook_argv(bindir: Path, inventory: Path, forks: int) -> list[str]:
    """ansible-playbook audit.yml as the CLI runs it (same extra vars), without k3fleet around it."""
    from k3fleet.audit.runner import playbook_path
    from k3fleet.targets import load_target

    extravars = {"k3fleet_image": load_target(None).image.ref, "k3fleet_host_timeout": 300,
                 "k3fleet_command_timeout": 20.0, "k3fleet_publish_artifacts": False}
    return [str(bindir / "ansible-playbook"), str(playbook_path("audit.yml")), "-i", str(inventory), "-f", str(forks),
            "-e", json.dumps(extravars)]


def _loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"


@dataclass
class Pair:
    """One repeat of one size: the baseline and the audit, and the load average after them."""

    base: Run
    audit: Run
    load: str


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _summary(pairs: dict[tuple[int, str], list[Pair]]) -> None:
    """The issue's table: per size, every repeat's ratios, node CPU per host of both sides."""
    print("\n| hosts | run | audit / plain `ansible -m command`: wall | controller CPU | "
          "k3fleet process CPU per host | node CPU per host (audit vs plain) | load average (1, 5, 15 min) |")
    print("|---|---|---|---|---|---|---|")
    for (n, strategy), runs in pairs.items():
        wall = ", ".join(f"{p.audit.wall / p.base.wall:.2f}" for p in runs)
        cpu = ", ".join(f"{p.audit.cpu / p.base.cpu:.2f}" for p in runs)
        own = [p.audit.own_cpu / n for p in runs if p.audit.own_cpu is not None]
        node_a = [p.audit.node_cpu / n for p in runs if p.audit.node_cpu is not None]
        node_b = [p.base.node_cpu / n for p in runs if p.base.node_cpu is not None]
        node = f"{_span(node_a)} s vs {_span(node_b)} s" if node_a and node_b else ""
        print(f"| {n} | {strategy} | {wall} | {cpu} | {_span(own, '{:.3f}') + ' s' if own else ''} | {node} | "
              f"{'; '.join(p.load for p in runs)} |")
    sys.stdout.flush()


def _mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_ssh(sizes: list[int], forks: int, mitogen: bool, workdir: Path | None, repeat: int = 1,
              playbook: bool = False) -> int:
    from k3fleet.lab import sshfleet
    from k3fleet.lab.common import supervise

    if os.geteuid() != 0:
        sys.stderr.write("bench --ssh: root required (network namespaces, sshd)\n")
        return 2
    def warn(message: str) -> None:
        sys.stderr.write(f"bench --ssh: {message}\n")

    supervise.become_subreaper(warn)
    strategies: list[tuple[str, str | None]] = [("linear", None)]
    if mitogen:
        sdir = _mitogen_strategy_dir()
        if sdir is None:
            sys.stderr.write("bench --ssh --mitogen: mitogen is not installed (pip install -e '.[bench]')\n")
            return 2
        strategies.append(("mitogen", sdir))
    bindir = Path(sys.executable).parent
    base_env = {**os.environ, **ansible_env(), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="k3fleet-bench-ssh-"))
    print(f"controller: {os.cpu_count()} CPUs; forks {forks}; node side on the same machine (its CPU apart); "
          f"load average {_loadavg()}")
    pairs: dict[tuple[int, str], list[Pair]] = {}
    try:
        for n in sizes:
            mem0 = _mem_available_mib()
            state = sshfleet.up(n, wd)
            st = sshfleet.status(wd)
            mem = mem0 - _mem_available_mib()
            print(f"\n{n} SSH hosts up in {state.up_seconds:.1f}s: {st.sshd_running} sshd "
                  f"({n - st.sshd_expected} hosts unreachable by profile), {mem:.0f} MiB of memory "
                  f"(sshd resident {st.sshd_rss_mib:.0f} MiB, shared pages counted per process); "
                  f"load average {_loadavg()}")
            _header()
            for rep in range(1, repeat + 1):
                for name, sdir in strategies:
                    env = dict(base_env)
                    if sdir is not None:
                        env.update({"ANSIBLE_STRATEGY_PLUGINS": sdir, "ANSIBLE_STRATEGY": "mitogen_linear"})
                    tag = f"{name} #{rep}" if repeat > 1 else name
                    base = _ssh_run(_baseline_argv(bindir, state.inventory, forks), env, wd)
                    base.detail = _baseline_detail(base.detail)
                    _row(n, f"baseline {tag}", base)
                    if playbook:
                        play = _ssh_run(_playbook_argv(bindir, state.inventory, forks), env, wd)
                        play.detail = _playbook_detail(play.detail)
                        _row(n, f"playbook {tag}", play)
                    with tempfile.TemporaryDirectory(prefix="k3fleet-bench-run-") as tmp:
                        out = Path(tmp) / "run"
                        audit = _ssh_run([sys.executable, "-c", _OWN_CPU_WRAPPER, "audit", "-i", str(state.inventory),
                                          "--forks", str(forks), "--quiet", "--out", str(out)], env, wd)
                        audit.detail = _audit_detail(out)
                    _row(n, f"audit {tag}", audit)
                    _ratio(n, f"ratio {tag}", audit, base)
                    _saturation(n, audit)
                    pairs.setdefault((n, name), []).append(Pair(base, audit, _loadavg()))
                print(f"{'':>6} load average {_loadavg()}")
            sshfleet.down(wd)
    finally:
        with contextlib.suppress(Exception):
            sshfleet.down(wd)
    _summary(pairs)
    return 0


# -- node mode --------------------------------------------------------------------------------


def _keep_payload(argv: list[str], env: dict[str, str], tmp: Path, name: str) -> Path:
    """Run ``argv`` (one task on one lab host) keeping its remote files; return the AnsiballZ file."""
    remote = tmp / f"remote-{name}"
    run_env = {**env, "ANSIBLE_KEEP_REMOTE_FILES": "1", "ANSIBLE_PIPELINING": "False",
               "ANSIBLE_REMOTE_TMP": str(remote)}
    done = subprocess.run(argv, env=run_env, capture_output=True, text=True, check=False)
    found = sorted(remote.glob("ansible-tmp-*/AnsiballZ_*.py"))
    if not found:
        raise SystemExit(f"bench --node: no AnsiballZ file from {argv[0]} (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout)[-600:]}")
    dest = tmp / f"{name}.py"
    shutil.copyfile(found[0], dest)
    shutil.rmtree(remote, ignore_errors=True)
    return dest


def _ansiballz_parts(path: Path) -> tuple[bytes, dict[str, object]]:
    """(payload zip, module args) of an AnsiballZ file: the literals of its ``_ansiballz_main(...)`` call."""
    import base64

    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_ansiballz_main" and node.keywords:
            kw = {k.arg: k.value for k in node.keywords}
            data = base64.b64decode(ast.literal_eval(kw["zip_data"]))
            params = json.loads(ast.literal_eval(kw["params"]))["ANSIBLE_MODULE_ARGS"]
            return data, params
    raise SystemExit(f"bench --node: {path} is not an AnsiballZ file this benchmark can read")


# The audit's node side taken apart, in a fresh interpreter on the payload as the module runs it:
# CPU (getrusage) of Ansible's module_utils (as the wrapper imports them: _loader on ansible-core 2.19,
# basic before; with the whole-payload finder first where the wrapper installs it), with their compiles
# apart; of the k3fleet module_utils (compile apart), of the collectors' own Python and of the
# commands they run (children).
_SPLIT = r"""
import builtins, json, resource, sys
payload, args, whole = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
sys.path.insert(0, payload)
compiled, lines, spent = {}, {}, [0.0]
ansible_compiled, ansible_spent = {}, [0.0]
real_compile = builtins.compile
def timed(source, filename, *a, **k):
    name = str(filename)
    start = cpu()
    code = real_compile(source, filename, *a, **k)
    base = name.rsplit("/", 1)[-1]
    if "/k3fleet/gpu/plugins/module_utils/" in name and base.startswith("k3fleet_"):
        spent[0] += cpu() - start
        compiled[base] = compiled.get(base, 0) + 1
        lines[base] = source.count(b"\n" if isinstance(source, bytes) else "\n")
    elif "/ansible/" in name:
        ansible_spent[0] += cpu() - start
        ansible_compiled[name] = ansible_compiled.get(name, 0) + 1
    return code
builtins.compile = timed
t0 = cpu()
if whole:
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load
    k3fleet_load.install_payload()
try:
    from ansible.module_utils._internal._ansiballz import _loader
except ImportError:
    import ansible.module_utils.basic
t1 = cpu()
ansible_import, ansible_compile = t1 - t0, ansible_spent[0]
ansible_files, ansible_compiles = len(ansible_compiled), sum(ansible_compiled.values())
if args is None:
    # A module other than the audit's (the baseline's command): Ansible's module_utils alone.
    print(json.dumps({"ansible_import": ansible_import, "ansible_compile": ansible_compile,
                      "ansible_files": ansible_files, "ansible_compiles": ansible_compiles}))
    sys.exit(0)
try:
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load
    k3fleet_load.install()
except ImportError:
    pass
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import reader_from_params
t2 = cpu()
at_import = spent[0]
c0, k0 = cpu(), children()
facts = collect_host(reader_from_params(args), host=args.get("host") or "", image=args.get("image"),
                     use_nvml=args.get("use_nvml", True), runtime=args.get("runtime") or "auto",
                     probe=bool(args.get("probe")), env_files=args.get("env_files") or [],
                     lspci=args.get("lspci", True), slurm_node=args.get("slurm_node"),
                     active=args.get("active") or "none", active_spec=args.get("active_spec"))
c1, k1 = cpu(), children()
builtins.compile = real_compile
# What the collectors import where they need it (the GPU source, the probe) compiles while they run.
lazy = spent[0] - at_import
print(json.dumps({"ansible_import": ansible_import, "ansible_compile": ansible_compile,
                  "ansible_files": ansible_files, "ansible_compiles": ansible_compiles,
                  "k3fleet_import": t2 - t1 + lazy, "compile": spent[0],
                  "compiled": compiled, "lines": lines, "collectors": c1 - c0 - lazy, "commands": k1 - k0,
                  "ran": len(facts["commands"])}))
"""


def _cpu_of(argv: list[str]) -> float:
    before = _children_cpu()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return _children_cpu() - before


def _execs(argv: list[str], tmp: Path) -> str:
    """execve calls of one run (strace -f), and how many failed (a PATH search tries each directory)."""
    strace = shutil.which("strace")
    if strace is None:
        return ""
    log = tmp / "strace.log"
    subprocess.run([strace, "-f", "-qq", "-e", "trace=execve", "-o", str(log), *argv], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    calls = [line for line in log.read_text(errors="replace").splitlines() if "execve(" in line]
    failed = sum(1 for line in calls if "= -1 " in line)
    return f"{len(calls)}" + (f" ({failed} not found)" if failed else "")


def _patched(path: Path) -> bool:
    """Whether the collection's action patched this AnsiballZ file (the whole-payload finder goes first)."""
    return k3fleet_action.MARKER in path.read_bytes()


def _unpatched(path: Path, dest: Path) -> Path | None:
    """``path`` without the call the collection's action inserted (as Ansible's normal action builds it)."""
    data = path.read_bytes()
    if data.count(k3fleet_action.SNIPPET) != 1:
        return None
    dest.write_bytes(data.replace(k3fleet_action.SNIPPET, b""))
    return dest


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def bench_node(repeat: int, host: str | None) -> int:
    bindir = Path(sys.executable).parent
    env = {**os.environ, **ansible_env(), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    spec = load_fleet(None)
    with tempfile.TemporaryDirectory(prefix="k3fleet-bench-node-") as tmp_name:
        tmp = Path(tmp_name)
        inventory = generate_fleet(spec, tmp / "lab", python=sys.executable)
        name = host or spec.hosts[0].name
        lab_host = next((h for h in spec.hosts if h.name == name), None)
        if lab_host is None:
            sys.stderr.write(f"bench --node: no host {name} in the lab fleet\n")
            return 2
        from k3fleet.audit.runner import playbook_path
        from k3fleet.targets import load_target

        extravars = {"k3fleet_image": load_target(None).image.ref, "k3fleet_host_timeout": 300,
                     "k3fleet_command_timeout": 20.0, "k3fleet_publish_artifacts": False}
        play = [str(bindir / "ansible-playbook"), str(playbook_path("audit.yml")), "-i", str(inventory), "-l", name]
        runs = {
            "plain (command: cat)": _keep_payload(
                [str(bindir / "ansible"), name, "-i", str(inventory), "-m", "ansible.builtin.command", "-a",
                 "cat {{ k3fleet_root }}/proc/driver/nvidia/version"], env, tmp, "plain"),
            "audit (lab: probe)": _keep_payload([*play, "-e", json.dumps(extravars)], env, tmp, "audit"),
            "audit, no probe": _keep_payload([*play, "-e", json.dumps({**extravars, "k3fleet_probe": False})],
                                             env, tmp, "audit_plain"),
        }
        # The plain audit's wrapper as Ansible's normal action ships it: the collection's action
        # inserted one guarded call (k3fleet_action.SNIPPET); without it, the same file otherwise.
        unpatched = _unpatched(runs["audit, no probe"], tmp / "audit_plain_unpatched.py")
        if unpatched is not None:
            runs["no probe, unpatched"] = unpatched
        load_before = _loadavg()
        cpu: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(repeat):
            for label, path in runs.items():
                cpu[label].append(_cpu_of([sys.executable, str(path)]))
        load_after = _loadavg()
        print(f"node side of one module run, lab host {name} ({lab_host.profile_name}); {repeat} runs each, "
              f"interleaved; CPU of the run and its children; load average {load_before} before, {load_after} after")
        print(f"{'run':<22} {'CPU ms':>8} {'q1-q3':>13} {'/ plain':>8} {'execve':>16}")
        plain = statistics.median(cpu["plain (command: cat)"])
        for label, path in runs.items():
            q1, med, q3 = _quartiles(cpu[label])
            print(f"{label:<22} {med * 1000:>8.1f} {q1 * 1000:>6.1f}-{q3 * 1000:<6.1f} {med / plain:>8.2f} "
                  f"{_execs([sys.executable, str(path)], tmp):>16}")
        for label, path in runs.items():
            whole = _patched(path)
            data, params = _ansiballz_parts(path)
            payload = tmp / "payload.zip"
            payload.write_bytes(data)
            with zipfile.ZipFile(payload) as zf:
                shipped = [n for n in zf.namelist() if "/k3fleet/gpu/plugins/module_utils/k3fleet_" in n]
            audit = bool(shipped)
            parts: dict[str, list[float]] = {}
            last: dict[str, object] = {}
            for _ in range(repeat):
                done = subprocess.run([sys.executable, "-c", _SPLIT, str(payload),
                                       json.dumps(params if audit else None), "1" if whole else "0"],
                                      capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    sys.stderr.write(f"bench --node: split run failed: {done.stderr[-800:]}\n")
                    return 1
                last = json.loads(done.stdout)
                keys = ["ansible_import", "ansible_compile"]
                if audit:
                    keys += ["k3fleet_import", "compile", "collectors", "commands"]
                for key in keys:
                    parts.setdefault(key, []).append(float(last[key]))  # type: ignore[arg-type]
            ms = {key: statistics.median(values) * 1000 for key, values in parts.items()}
            line = (f"\nsplit of {label} (medians of {repeat}, ms CPU): Ansible's module_utils "
                    f"{ms['ansible_import']:.1f}: {last['ansible_files']} files, {last['ansible_compiles']} compiles, "
                    f"compile {ms['ansible_compile']:.1f}" + (" (whole-payload finder first)" if whole else ""))
            if audit:
                compiled = last["compiled"]
                lines = last["lines"]
                assert isinstance(compiled, dict) and isinstance(lines, dict)
                line += (f"; k3fleet module_utils {ms['k3fleet_import']:.1f}: "
                         f"{len(compiled)} of {len(shipped)} shipped imported, {sum(lines.values())} lines, "
                         f"{sum(compiled.values())} compiles, compile {ms['compile']:.1f}; collectors' Python "
                         f"{ms['collectors']:.1f}; {last['ran']} commands (children) {ms['commands']:.1f}")
            print(line)
        sys.stdout.flush()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="fleet sizes (local: 50 200 1000; ssh: 50 200)")
    ap.add_argument("--forks", type=int, default=None, help="forks for every run (local: 10; ssh: 20)")
    ap.add_argument("--ssh", action="store_true", help="the SSH lab fleet instead of the local connection (root)")
    ap.add_argument("--mitogen", action="store_true", help="with --ssh: also under Mitogen's mitogen_linear strategy")
    ap.add_argument("--workdir", type=Path, default=None, help="with --ssh: the fleet's work directory")
    ap.add_argument("--repeat", type=int, default=None,
                    help="with --ssh: run each size's set this many times (1); with --node: runs of each (30)")
    ap.add_argument("--playbook", action="store_true",
                    help="with --ssh: also ansible-playbook audit.yml by hand (Ansible's own share)")
    ap.add_argument("--node", action="store_true",
                    help="the node side of one lab host apart: module runs interleaved, the audit's split")
    ap.add_argument("--host", default=None, help="with --node: the lab host (default: the fleet's first)")
    args = ap.parse_args()
    if args.repeat is not None and args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.node:
        if args.ssh or args.mitogen or args.playbook or args.sizes or args.forks:
            ap.error("--node takes --repeat and --host only")
        return bench_node(args.repeat or 30, args.host)
    if args.host:
        ap.error("--host needs --node")
    if args.ssh:
        from k3fleet.lab.sshfleet import SshFleetError

        try:
            return bench_ssh(args.sizes or [50, 200], args.forks or 20, args.mitogen, args.workdir,
                             args.repeat or 1, args.playbook)
        except SshFleetError as exc:
            # Not root, another fleet up, a size out of range: the fleet's own one-line reason.
            print(f"bench_audit: {exc}", file=sys.stderr)
            return 2
    if args.mitogen or args.repeat is not None or args.playbook:
        ap.error("--mitogen, --repeat and --playbook need --ssh")
    bench_local(args.sizes or [50, 200, 1000], args.forks or 10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
