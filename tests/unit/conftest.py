"""Fixtures shared by the unit tests (builders live in nodetree.py)."""

from __future__ import annotations

import pytest
from nodetree import patch_exits


@pytest.fixture
def patched_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """AnsibleModule.exit_json/fail_json raise nodetree.ExitJson/FailJson for the test."""
    patch_exits(monkeypatch)
