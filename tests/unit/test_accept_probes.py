"""The probe registry: each acceptance probe declared once (k3fleet.accept.probes), in run order."""

from __future__ import annotations

import pytest

from k3fleet.accept.probes import NAMES, PROBES, REQUIRED, Probe, register
from k3fleet.evidence import layout


def test_the_registry_holds_the_four_probes_in_run_order() -> None:
    assert NAMES == ("startup", "prefix_cache", "agent", "load")
    # startup needs a log; without one an acceptance run is still complete.
    assert REQUIRED == ("prefix_cache", "agent", "load")
    assert PROBES["startup"].needs is not None and PROBES["agent"].needs is None


def test_each_probe_names_the_files_it_writes() -> None:
    assert PROBES["startup"].evidence == (layout.probe_file("startup"),)
    assert PROBES["load"].evidence == ("load.json", "requests/load.jsonl")


def test_a_probe_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register(Probe("agent", "again", required=True, needs=None, budget="none"))
