"""``decide --out`` claimed once (docs/safety.md "Run directories"): the decision's directory swapped for a
link to elsewhere right after it was claimed. Nothing is written through the link, and decide refuses to
package what now stands at the path (exit 3), so no signed package holds someone else's files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from k3fleet.errors import IncompleteError

pytestmark = pytest.mark.integration


def test_a_link_swapped_in_for_decide_out_is_not_written_through(healthy_audit: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from k3fleet.decide import flow
    from k3fleet.evidence import RunDir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "decision"
    aside = tmp_path / "claimed"

    class SwappedAfterClaim(RunDir):
        @classmethod
        def create(cls, *args: Any, **kwargs: Any) -> RunDir:
            rd = RunDir.create(*args, **kwargs)
            out.rename(aside)
            out.symlink_to(elsewhere)
            return rd

    monkeypatch.setattr(flow, "RunDir", SwappedAfterClaim)
    opts = flow.DecideOptions(runs=[healthy_audit], reviewer="carol", out=out, runs_dir=tmp_path / "runs")
    with pytest.raises(IncompleteError, match="was replaced after it was claimed"):
        flow.run_decide(opts, [sys.argv[0], "decide"])
    assert list(elsewhere.iterdir()) == []
    assert (aside / "decision.json").is_file() and (aside / "manifest.json").is_file()
    assert not (tmp_path / "decision.tar.gz").exists()
