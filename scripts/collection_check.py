"""Build, install and check the k3fleet.gpu collection the way a user meets it (CI: make collection-check).

1. scripts/build_collection.py builds the tarball (ansible-galaxy collection build);
2. `ansible-galaxy collection install` puts it into a fresh collections path;
3. `ansible-doc` documents every module by FQCN;
4. tests/collection/fqcn_playbook.yml, a user's own playbook naming modules by FQCN only, runs
   against the simulated lab fleet with no library path of this repository and no k3fleet CLI;
5. with --sanity, `ansible-test sanity --python X.Y` in the installed collection (no containers;
   ansible-test's per-test virtual environments are bootstrapped by scripts/ansible_test_get_pip.py
   because its own pip bootstrap is fetched from outside the package index);
6. `ansible-test units --local --python X.Y` in the installed collection: the module and module_utils tests
   in the collection's own tests/unit/plugins, on this Python with what its environment has (pytest,
   pytest-xdist; no requirement install, no network), importing the installed copy; its wall time printed.

With --units-only, steps 1, 2 and 6 alone: the collection's unit tests as ansible-test runs them.

Exit 0 when every step passed; otherwise the failing step's output and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "scripts"))

from build_collection import NAME, NAMESPACE, ROOT, build  # noqa: E402


def _env(collections: Path, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    config.write_text("[defaults]\n")
    env.update({"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "ANSIBLE_COLLECTIONS_PATH": str(collections),
                # An empty configuration: nothing of this repository's ansible.cfg (library paths) applies.
                "ANSIBLE_CONFIG": str(config), "ANSIBLE_HOST_KEY_CHECKING": "True",
                # The checkout's own tree is on sys.path (an editable install): only the installed
                # tarball may answer, or a broken build would pass on the source tree.
                "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False",
                "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_NOCOLOR": "1"})
    return env


def _step(name: str, argv: list[str], env: dict[str, str], cwd: Path, timeout: int = 1800) -> str:
    print(f"== {name}", flush=True)
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        # ansible-test's requirement installs print pages of pip lines that would push its findings out.
        noise = ("WARNING: Location", "Collecting ", "Downloading ", "Installing ", "Successfully ", "Processing ",
                 "Looking in ", "Using cached ", "Attempting ", "Found existing", "Uninstalling", "  ")
        keep = "\n".join(line for line in (proc.stdout + "\n" + proc.stderr).splitlines()
                         if line.strip() and not line.lstrip("━ ").startswith(noise[:-1])
                         and not (line.startswith(noise[-1]) and ("pip" in line or "whl" in line)))
        sys.stdout.write(keep[-8000:] + "\n")
        raise SystemExit(f"collection check: {name} failed (exit {proc.returncode})")
    return proc.stdout


def _prepare_ansible_test_pip() -> None:
    """ansible-test looks for its pip bootstrap script in its cache before downloading it."""
    import ansible_test

    source = Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
    match = re.search(r"pip='([0-9.]+)'", source.read_text())
    if match is None:
        raise SystemExit("collection check: cannot tell which pip version ansible-test bootstraps")
    cache = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{match.group(1).replace('.', '_')}.py"
    cache.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "scripts" / "ansible_test_get_pip.py", cache)


def _check_installed(installed: Path, env: dict[str, str], tmp: Path, sanity: bool, python: str) -> None:
    """Steps 3 to 5 on the installed collection: ansible-doc, the FQCN playbook, sanity."""
    modules = sorted(p.stem for p in (installed / "plugins" / "modules").glob("*.py"))
    listing = _step("ansible-doc -l", [str(BIN / "ansible-doc"), "-l", f"{NAMESPACE}.{NAME}"], env, tmp)
    missing = [m for m in modules if f"{NAMESPACE}.{NAME}.{m}" not in listing]
    if missing:
        raise SystemExit(f"collection check: ansible-doc -l does not list {', '.join(missing)}")
    fqcns = [f"{NAMESPACE}.{NAME}.{m}" for m in modules]
    _step("ansible-doc (every module)", [str(BIN / "ansible-doc"), "-t", "module", *fqcns], env, tmp)
    roles = _step("ansible-doc roles", [str(BIN / "ansible-doc"), "-t", "role", "-l", f"{NAMESPACE}.{NAME}"],
                  env, tmp)
    print(roles.strip())

    lab = json.loads(_step("lab fleet", [str(BIN / "k3fleet"), "lab", "generate", str(tmp / "lab")],
                           {**os.environ, "PATH": env["PATH"]}, tmp).strip() and
                     (tmp / "lab" / "k3fleet-lab.json").read_text())
    reachable = [h["name"] for h in lab["hosts"] if h["reachable"]]
    out = _step("FQCN playbook against the lab", [
        str(BIN / "ansible-playbook"), "-i", str(tmp / "lab" / "inventory.yml"), "--limit", ",".join(reachable),
        str(REPO / "tests" / "collection" / "fqcn_playbook.yml")], env, tmp)
    recap = [line for line in out.splitlines() if "ok=" in line]
    if len(recap) != len(reachable) or any("failed=0" not in line for line in recap):
        raise SystemExit("collection check: the FQCN playbook did not pass on every lab host:\n" + "\n".join(recap))
    print(f"   {len(reachable)} lab hosts answered through {NAMESPACE}.{NAME}")

    if sanity:
        _prepare_ansible_test_pip()
        print(_step(f"ansible-test sanity --python {python}",
                    [str(BIN / "ansible-test"), "sanity", "--python", python], env, installed,
                    timeout=3600)[-1500:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sanity", action="store_true", help="also run ansible-test sanity on the installed collection")
    ap.add_argument("--units-only", action="store_true",
                    help="build, install and run ansible-test units only (no ansible-doc, playbook or sanity)")
    ap.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k3fleet-collection-") as tmp_name:
        tmp = Path(tmp_name)
        tarball = build(ROOT, tmp / "dist")
        print(f"== built {tarball.name}")
        collections = tmp / "collections"
        env = _env(collections, tmp / "ansible.cfg")
        _step("ansible-galaxy collection install", [str(BIN / "ansible-galaxy"), "collection", "install",
                                                   "--force", str(tarball), "-p", str(collections)], env, tmp)
        installed = collections / "ansible_collections" / NAMESPACE / NAME
        if not args.units_only:
            _check_installed(installed, env, tmp, args.sanity, args.python)
        started = time.monotonic()
        out = _step(f"ansible-test units --local --python {args.python}",
                    [str(BIN / "ansible-test"), "units", "--local", "--python", args.python], env, installed,
                    timeout=900)
        summary = [line.strip("= ") for line in out.splitlines() if re.search(r"=+ .*\d+ passed.* in [0-9.]+s", line)]
        if not summary:
            raise SystemExit("collection check: ansible-test units ran no test:\n" + out[-2000:])
        print(f"   {'; '.join(summary)} ({time.monotonic() - started:.0f} s wall)")
    print("collection check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
