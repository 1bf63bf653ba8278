"""Every test runs with a scratch working directory: nothing a command writes by default (``runs/``, a
report's screenshots, lab state) can land in the checkout, whichever test forgets an ``--out``.

No test reads a path relative to the working directory (they build theirs from ``__file__``), and
k3fleet finds its playbooks, roles and ansible.cfg from its package, never from the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def scratch_cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(before)
