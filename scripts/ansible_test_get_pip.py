"""Stands in for pip's get-pip.py when ansible-test bootstraps its sanity-test virtual environments.

ansible-test downloads get-pip.py from a host outside the package index, which this project's
machines cannot reach, and runs pip with PIP_CONFIG_FILE=/dev/null, which drops the machine's pip
configuration (its certificate bundle for the package index). This script does get-pip's job with
what Python ships: ensurepip installs the bundled pip into the sanity venv, a .pth file makes
that venv's pip read the machine's pip configuration again (as every other pip here does), then
pip installs what ansible-test asked for (its pinned pip and packages). get-pip.py's own flags
(--no-setuptools, --no-wheel) are dropped: pip adds neither anyway.
"""

from __future__ import annotations

import ensurepip
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}
PTH = "import os; os.environ.get('PIP_CONFIG_FILE') == os.devnull and os.environ.pop('PIP_CONFIG_FILE')\n"

if __name__ == "__main__":
    ensurepip.bootstrap(upgrade=True)
    Path(sysconfig.get_paths()["purelib"], "k3fleet-pip-config.pth").write_text(PTH)
    env = {k: v for k, v in os.environ.items() if k != "PIP_CONFIG_FILE"}
    args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args], env=env))
