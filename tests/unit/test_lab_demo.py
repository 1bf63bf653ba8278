"""`k3fleet lab demo`'s bookkeeping and the lab change night's refusals, without running the path.

The path itself is the real commands (`make demo` runs them); what is tested here is what decides
the demo's outcome and what protects a user's directory: a no-go audit is "no-go", not a failure,
and a work directory the demo did not make is never removed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k3fleet.cli import main
from k3fleet.lab import changelab
from k3fleet.lab.demo import MARKER, Step, _claim


def test_a_no_go_audit_is_as_expected_and_another_exit_is_a_failure() -> None:
    no_go = Step("audit --lab", 1, (1, 3), "no-go on purpose")
    assert no_go.good and no_go.line().startswith("audit --lab      no-go (exit 1, as expected)")
    broken = Step("accept all", 2, (0,))
    assert not broken.good and "bad input (exit 2, FAILED)" in broken.line()
    skipped = Step("upgrade --check", None, (0,), "needs apt-ftparchive")
    assert skipped.good and skipped.line().endswith("skipped: needs apt-ftparchive")


def test_a_directory_the_demo_did_not_make_is_refused_and_kept(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine\n")
    assert main(["lab", "demo", "--workdir", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a demo work directory; give another --workdir" in err[0], err
    assert (mine / "keep.txt").read_text() == "mine\n"


def test_a_previous_demo_directory_starts_again_empty(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    _claim(work)
    (work / "audit").mkdir()
    _claim(work)
    assert sorted(p.name for p in work.iterdir()) == [MARKER]


def test_the_change_lab_names_what_the_machine_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(changelab.ChangeLabError, match=r"needs gcc, dpkg-deb, .*apt-ftparchive.*\(Debian packages: "):
        changelab.prepare(tmp_path / "change")
    assert not (tmp_path / "change").exists()
