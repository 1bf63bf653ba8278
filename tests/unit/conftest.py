"""Fixtures shared by the unit tests (builders live in nodetree.py)."""

from __future__ import annotations

import pytest
from nodetree import LabHost, lab_host, patch_exits


@pytest.fixture
def patched_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """AnsibleModule.exit_json/fail_json raise nodetree.ExitJson/FailJson for the test."""
    patch_exits(monkeypatch)


@pytest.fixture(scope="module", name="lab_host")
def lab_host_fixture(tmp_path_factory: pytest.TempPathFactory) -> LabHost:
    """The lab fleet's first host, generated once per test module."""
    return lab_host(tmp_path_factory.mktemp("lab"))
