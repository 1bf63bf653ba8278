"""--pause-after (docs/change-night.md "Pauses"): the slot gate keeps every host past a pause point from
its drain until a continue token exists, and says which token; the controller's watcher names each pause
point once, when it is reached; `upgrade --continue` writes the tokens a run waits for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_journal_format as fmt
from k3fleet.change.pause import PauseWatcher, check_pause, continue_dir, continue_run
from k3fleet.errors import UsageError

HAPPY = ["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned"]
BATCHES = [["c"], ["w1", "w2"], ["w3"]]


def line(host: str, stage: str) -> dict[str, Any]:
    return {"ts": "t", "run": "R1", "change_id": "CHG-1", "host": host, "stage": stage, "detail": {}}


def journal(path: Path, done: list[str]) -> None:
    for h in done:
        for s in HAPPY:
            fmt.append_line(str(path), line(h, s))


def ask(path: Path, host: str, after: str, tokens: Path) -> tuple[bool, str]:
    gate = {"max_unavailable": 5, "failure_budget": 0, "canary": "c", "wait_timeout": 0,
            "pause": {"after": after, "batches": BATCHES, "dir": str(tokens)}}
    granted, why, _torn, _waited, _line = fmt.take_slot(str(path), line(host, "snapshot"), gate)
    return granted, why


@pytest.mark.parametrize(("after", "done", "host", "token"), [
    ("canary", ["c"], "w1", "after-batch-0"),
    ("canary", ["c", "w1", "w2"], "w3", "after-batch-0"),
    ("wave", ["c"], "w1", "after-batch-0"),
    ("wave", ["c", "w1", "w2"], "w3", "after-batch-1"),
    ("each-host", ["c", "w1"], "w2", "after-host-c"),
])
def test_the_gate_waits_at_a_pause_point_until_it_is_continued(tmp_path: Path, after: str, done: list[str],
                                                               host: str, token: str) -> None:
    path, tokens = tmp_path / "journal.jsonl", tmp_path / "continue"
    tokens.mkdir()
    journal(path, done)
    granted, why = ask(path, host, after, tokens)
    assert not granted and why.startswith(f"paused ({token}): continue with k3fleet upgrade --continue")
    assert why.endswith("no slot within 0s")
    # Every token the host needs, then it goes.
    for h in done:
        (tokens / f"after-host-{h}").touch()
    for i in range(len(BATCHES)):
        (tokens / f"after-batch-{i}").touch()
    assert ask(path, host, after, tokens)[0]


def test_nothing_pauses_the_canary_or_a_night_without_pauses(tmp_path: Path) -> None:
    path, tokens = tmp_path / "journal.jsonl", tmp_path / "continue"
    tokens.mkdir()
    assert ask(path, "c", "canary", tokens)[0]
    journal(path, ["c"])
    granted, _why, _torn, _waited, _line = fmt.take_slot(str(path), line("w1", "snapshot"), {
        "max_unavailable": 5, "failure_budget": 0, "canary": "c", "wait_timeout": 0})
    assert granted


def test_the_watcher_names_each_pause_point_once_and_continue_writes_its_token(tmp_path: Path) -> None:
    said: list[str] = []
    runs = tmp_path / "runs"
    where = continue_dir(runs, "R1")
    w = PauseWatcher("wave", BATCHES, where, 600, say=said.append, run=runs / "R1", interactive=False)
    assert w.gate() == {"after": "wave", "batches": BATCHES, "dir": str(where.resolve())}
    w.on_line(line("c", "verifying"))
    assert said == []
    w.on_line(line("c", "returned"))
    w.on_line(line("c", "returned"))
    assert len(said) == 1 and said[0].startswith("paused after the canary c returned to service: continue with "
                                                 f"k3fleet upgrade --continue {runs / 'R1'}")
    assert f"touch {where / 'after-batch-0'}" in said[0] and "at most 600s" in said[0]
    w.on_line(line("w1", "returned"))
    assert len(said) == 1  # wave 1 is not done yet
    assert continue_run(runs, runs / "R1", "alice") == ["after-batch-0"]
    w.on_line(line("w2", "returned"))
    assert said[-1].startswith("paused after wave 1 (2 host(s)) returned to service")
    # The last batch is no pause point: nothing comes after it.
    w.on_line(line("w3", "returned"))
    assert len(said) == 2
    rec = w.record()
    assert [r["point"] for r in rec] == ["after-batch-0", "after-batch-1"]
    assert rec[0]["continued"]["by"] == "alice" and rec[1]["continued"] is None
    w.close()
    assert not where.exists()
    with pytest.raises(UsageError, match="is not paused"):
        continue_run(runs, runs / "R1", "alice")


def test_a_pause_point_that_is_not_one_is_refused() -> None:
    check_pause(None)
    with pytest.raises(UsageError, match="choose one of canary, each-host, wave"):
        check_pause("after-lunch")
