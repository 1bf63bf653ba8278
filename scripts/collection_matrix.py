"""The lab audit and the collection's checks on every ansible-core series the project claims (make collection-matrix).

The collection patches two ansible-core internals (plugins/plugin_utils/k3fleet_action.py: the AnsiballZ
wrapper, written against 2.19's and passed through unchanged elsewhere; plugins/strategy/linear.py: the
fleet strategy), each guarded by the shape it finds. This proves them where they are claimed: for each
series from meta/runtime.yml's ``requires_ansible`` up to the package's ``ansible-core`` bound
(pyproject.toml), a virtual environment .cache/ansible-matrix/<series> with that ansible-core, this
checkout (editable) and its runtime dependencies, pytest and pytest-xdist; then, under it:

1. the lab audit as the README gives it: ``k3fleet audit --lab -i inventories/lab/after-change.yaml``
   (go, exit 0) and ``k3fleet audit --lab`` (no-go on purpose, exit 1);
2. the collection's unit tests by ``ansible-test units --local`` from the collection built and installed
   with that ansible-core;
3. the repository's tests of the two patches (tests/unit/test_action_payload.py, test_fleet_strategy.py).

A series pip cannot install on this Python (2.20 needs 3.12) is listed as skipped, not failed. Prints one
table, series -> pass/fail of each step and the seconds it took; exit 0 when every installable series
passed, 1 otherwise. Needs the package index (pip) the first time a series' environment is made.

    python scripts/collection_matrix.py [--series 2.17 2.18] [--keep-going]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from build_collection import NAME, NAMESPACE, ROOT, build  # noqa: E402

CACHE = REPO / ".cache" / "ansible-matrix"
PATCH_TESTS = ["tests/unit/test_action_payload.py", "tests/unit/test_fleet_strategy.py"]
# README "Quick start": the fleet the change night leaves behind is a go, the default lab fleet a no-go.
AUDITS = (("audit go", ["-i", "inventories/lab/after-change.yaml"], 0), ("audit no-go", [], 1))


def claimed_series() -> list[str]:
    """Every minor series from requires_ansible's lower bound to below pyproject's upper bound."""
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text(encoding="utf-8"))
    low = re.fullmatch(r">=\s*2\.(\d+)(?:\.\d+)*", str(runtime.get("requires_ansible", "")).strip())
    deps = re.search(r'"ansible-core>=2\.\d+,<2\.(\d+)"', (REPO / "pyproject.toml").read_text(encoding="utf-8"))
    if low is None or deps is None:
        raise SystemExit("collection matrix: cannot read requires_ansible (meta/runtime.yml) or the ansible-core "
                         "bound (pyproject.toml)")
    return [f"2.{minor}" for minor in range(int(low.group(1)), int(deps.group(1)))]


def _env(venv: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv),
                "ANSIBLE_NOCOLOR": "1"})
    env.update(extra or {})
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: int) -> int:
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        try:
            return subprocess.run(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                  check=False).returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout} s\n")
            return 124


def prepare(series: str, log: Path) -> tuple[Path | None, str]:
    """The series' venv, made or brought up to date; (None, why) when pip cannot install the series here."""
    venv = CACHE / series
    stamp = venv / ".k3fleet-matrix"
    want = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + series.encode()).hexdigest()
    if stamp.is_file() and stamp.read_text().strip() == want and (venv / "bin" / "k3fleet").exists():
        return venv, "cached"
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    if _run([sys.executable, "-m", "venv", str(venv)], os.environ.copy(), REPO, log, 300) != 0:
        return None, "python -m venv failed"
    py = str(venv / "bin" / "python")
    rc = _run([py, "-m", "pip", "install", "--quiet", f"ansible-core=={series}.*", "-e", str(REPO), "pytest",
               "pytest-xdist"], _env(venv), REPO, log, 1200)
    if rc != 0:
        text = log.read_text(encoding="utf-8", errors="replace")
        shutil.rmtree(venv, ignore_errors=True)
        if "Requires-Python" in text[-4000:] or "requires a different Python" in text[-4000:] or \
                "No matching distribution" in text[-4000:]:
            here = f"{sys.version_info[0]}.{sys.version_info[1]}"
            return None, f"pip cannot install ansible-core {series}.* on Python {here}"
        return None, f"pip install failed (exit {rc})"
    stamp.write_text(want + "\n")
    return venv, "installed"


def core_version(venv: Path) -> str:
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", "import ansible.release as r; print(r.__version__)"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "?"


def check(series: str, tarball: Path, work: Path) -> dict[str, object]:
    log = work / f"{series}.log"
    row: dict[str, object] = {"series": series, "log": log}
    started = time.monotonic()
    venv, how = prepare(series, log)
    row["setup"] = (how, time.monotonic() - started)
    if venv is None:
        row["skipped" if how.startswith("pip cannot install") else "failed"] = how
        return row
    row["core"] = core_version(venv)
    env = _env(venv)
    steps: list[tuple[str, bool, float]] = []
    for name, args, expected in AUDITS:
        t0 = time.monotonic()
        rc = _run([str(venv / "bin" / "k3fleet"), "audit", "--lab", *args, "--out", str(work / series / name)],
                  env, REPO, log, 900)
        steps.append((name, rc == expected, time.monotonic() - t0))
    t0 = time.monotonic()
    collections = work / series / "collections"
    ok = _run([str(venv / "bin" / "ansible-galaxy"), "collection", "install", "--force", str(tarball), "-p",
               str(collections)], env, work, log, 300) == 0
    if ok:
        installed = collections / "ansible_collections" / NAMESPACE / NAME
        py = f"{sys.version_info[0]}.{sys.version_info[1]}"
        ok = _run([str(venv / "bin" / "ansible-test"), "units", "--local", "--python", py], env, installed, log,
                  900) == 0
    steps.append(("collection units", ok, time.monotonic() - t0))
    t0 = time.monotonic()
    ok = _run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *PATCH_TESTS], env, REPO,
              log, 900) == 0
    steps.append(("patch tests", ok, time.monotonic() - t0))
    row["steps"] = steps
    row["total"] = time.monotonic() - started
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", nargs="*", help="ansible-core series to check (default: every one claimed)")
    args = ap.parse_args()
    series = args.series or claimed_series()
    logs = REPO / "runs" / "collection-matrix"
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="k3fleet-matrix-") as tmp_name:
        tmp = Path(tmp_name)
        tarball = build(ROOT, tmp / "dist")
        for s in series:
            print(f"== ansible-core {s}", flush=True)
            work = tmp / "work"
            work.mkdir(exist_ok=True)
            row = check(s, tarball, work)
            shutil.copy2(row["log"], logs / f"{s}.log")  # type: ignore[arg-type]
            rows.append(row)
    names = [name for name, _args, _rc in AUDITS] + ["collection units", "patch tests"]
    print(f"\n{'series':8} {'ansible-core':13} {'setup':>14} " + " ".join(f"{n:>18}" for n in names) + f" {'total':>8}")
    failed = False
    for row in rows:
        how, secs = row["setup"]  # type: ignore[misc]
        setup = f"{how} {secs:.0f}s"
        if "steps" not in row:
            reason = row.get("skipped") or row.get("failed")
            failed = failed or "failed" in row
            word = "SKIPPED" if "skipped" in row else "FAILED"
            print(f"{row['series']:8} {'-':13} {f'{secs:.0f}s':>14} {word}: {reason}")
            continue
        cells = []
        for _name, ok, took in row["steps"]:  # type: ignore[attr-defined]
            cells.append(f"{'pass' if ok else 'FAIL'} {took:.0f}s")
            failed = failed or not ok
        print(f"{row['series']:8} {row['core']!s:13} {setup:>14} " + " ".join(f"{c:>18}" for c in cells)
              + f" {row['total']:>7.0f}s")
    print(f"\nlogs: {logs.relative_to(REPO)}/<series>.log")
    print("collection matrix: " + ("FAILED" if failed else "passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
