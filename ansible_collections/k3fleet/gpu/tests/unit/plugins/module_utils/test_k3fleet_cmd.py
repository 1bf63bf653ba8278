"""NodeReader: files under a root prefix, commands through one runner (C locale, timeout)."""

from __future__ import annotations

import time
from pathlib import Path

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, guard
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import exe


def test_files_resolve_under_root_and_moved_proc(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    proc = tmp_path / "simproc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    (proc / "driver" / "nvidia" / "version").write_text("NVRM version: x\n")
    r = NodeReader(root=str(tmp_path), path=str(tmp_path / "bin"), procfs=str(proc))
    assert r.read("/etc/nccl.conf") == "NCCL_DEBUG=WARN\n"
    assert r.read("/proc/driver/nvidia/version") == "NVRM version: x\n"
    assert r.resolve("/sys/class/infiniband") == str(tmp_path / "sys" / "class" / "infiniband")
    assert r.read("/etc/missing") is None
    assert "No such file" in (r.read_error("/etc/missing") or "")
    assert r.listdir("/etc") == ["nccl.conf"]


def test_commands_only_from_reader_path_with_c_locale(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    exe(bindir / "show-locale", 'echo "$LC_ALL $LANG $PATH"')
    r = NodeReader(root=str(tmp_path), path=str(bindir))
    res = r.run(["show-locale"])
    assert res.ok
    assert res.stdout.strip() == f"C C {bindir}"
    missing = r.run(["ls"])  # on the controller's PATH, not on the node's
    assert missing.error == "not_found"
    assert missing.reason() == "ls: command not found"
    assert [c["argv"][0] for c in r.commands] == ["show-locale", "ls"]


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    # The child sleep keeps stdout open after the shell is killed: only a group kill ends it.
    exe(bindir / "hang", "/bin/sleep 30\necho never")
    r = NodeReader(path=str(bindir), timeout=0.3)
    t0 = time.monotonic()
    res = r.run(["hang"])
    assert time.monotonic() - t0 < 10
    assert res.error == "timeout"
    assert "timed out" in res.reason()


def test_nonzero_exit_reason_has_first_stderr_line(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    exe(bindir / "fail", 'echo "first problem" >&2\necho "second" >&2\nexit 3')
    res = NodeReader(path=str(bindir)).run(["fail", "--x"])
    assert not res.ok and res.rc == 3
    assert res.reason() == "fail --x: exit 3: first problem"


def test_run_cached_runs_once(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    counter = tmp_path / "count"
    exe(bindir / "count", f'echo x >> "{counter}"\necho ok')
    r = NodeReader(path=str(bindir))
    assert r.run_cached(["count"]).stdout == "ok\n"
    assert r.run_cached(["count"]).stdout == "ok\n"
    assert counter.read_text().count("x") == 1


def test_read_cached_and_which_ask_the_node_once(tmp_path: Path) -> None:
    # Several collectors read /proc/modules and look up the same command: one read, one PATH search.
    (tmp_path / "proc").mkdir()
    modules = tmp_path / "proc" / "modules"
    modules.write_text("nvidia 56717312 550 - Live 0x0000000000000000 (POE)\n")
    bindir = tmp_path / "bin"
    exe(bindir / "tool", "echo ok")
    r = NodeReader(root=str(tmp_path), path=str(bindir))
    first = r.read_cached("/proc/modules")
    modules.write_text("changed\n")
    assert r.read_cached("/proc/modules") == first
    assert r.read("/proc/modules") == "changed\n"
    assert r.which("tool") == str(bindir / "tool")
    (bindir / "tool").unlink()
    assert r.which("tool") == str(bindir / "tool")
    assert NodeReader(root=str(tmp_path), path=str(bindir)).which("tool") is None


def test_guard_turns_a_collector_crash_into_unknown() -> None:
    def broken() -> dict:
        raise KeyError("surprise")

    out = guard("driver", broken)
    assert out["status"] == "unknown"
    assert "driver collector failed: KeyError" in out["reason"]


def test_directory_instead_of_file_is_none(tmp_path: Path) -> None:
    d = tmp_path / "dir-not-file"
    d.mkdir()
    r = NodeReader(root="/")
    assert r.read(str(d)) is None
