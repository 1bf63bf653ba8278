"""A target that contradicts itself is refused: exit 2, one line, the field to change named.

Two contradictions (docs/facts.md section 13): a driver.target_version below the minimum the image's
CUDA needs (the night would install a driver that still fails), and a --tensor-parallel-size in
serve.flags that differs from the serving strategy's. Without the flag the verdict's serve command
carries the strategy's size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3fleet.cli.base import main
from k3fleet.targets import TargetError, default_target_path, load_target
from k3fleet.verdict import evaluate_fleet, validate_facts

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "verdict"
SERVE_TAIL = ["--trust-remote-code", "--load-format", "fastsafetensors", "--enable-prefix-caching",
              "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3"]


def target_with(**changes: Any) -> dict[str, Any]:
    """The default target with dotted fields set ("serve.flags" is prepended to the default flags)."""
    data: dict[str, Any] = yaml.safe_load(default_target_path().read_text())
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = data
        for p in parents:
            node = node[p]
        node[last] = value
    return data


def tp_flags(*head: str) -> list[str]:
    return [*head, *SERVE_TAIL]


CONFLICTS = [
    # The image's CUDA needs more than the change installs.
    ({"image__cuda": "13.1"}, "driver.target_version",
     "580.95.05 is below 590.44.01, the CUDA driver matrix minimum for image.cuda 13.1 (13.1 GA)"),
    ({"image__cuda": "13.0.2", "driver__target_version": "580.82.07"}, "driver.target_version",
     "580.82.07 is below 580.95.05, the CUDA driver matrix minimum for image.cuda 13.0.2 (13.0 Update 2)"),
    ({"driver__min_version": "580.99.01"}, "driver.target_version", "below 580.99.01, driver.min_version"),
    ({"image__cuda": "13.3"}, "driver.target_version", "(13.3, unconfirmed row)"),
    # A tensor-parallel size the strategy does not use.
    ({"serve__flags": tp_flags("--tensor-parallel-size", "4")}, "serve.flags",
     "--tensor-parallel-size 4 does not match strategy single_node_tp (gpus.strategy auto derives it when one "
     "node holds the weights), which serves with tensor parallel size 8"),
    ({"gpus__strategy": "multi_node_dep", "serve__flags": tp_flags("--tensor-parallel-size", "8")}, "serve.flags",
     "--tensor-parallel-size 8 does not match strategy multi_node_dep (gpus.strategy names it), which serves "
     "with tensor parallel size 1"),
    ({"gpus__multi_node_strategy": "multi_node_dep", "serve__flags": tp_flags("-tp", "8")}, "serve.flags",
     "-tp 8 does not match strategy multi_node_dep (gpus.strategy auto derives it when one node cannot hold"),
    ({"serve__flags": tp_flags("--tensor-parallel-size=16")}, "serve.flags",
     "--tensor-parallel-size 16 does not match strategy single_node_tp"),
    ({"gpus__per_node": 4, "serve__flags": tp_flags("--tensor-parallel-size", "8")}, "serve.flags",
     "serves with tensor parallel size 4"),
    ({"serve__flags": tp_flags("--tensor-parallel-size", "eight")}, "serve.flags",
     "--tensor-parallel-size needs a number, got 'eight'"),
]


@pytest.mark.parametrize(("changes", "field", "problem"), CONFLICTS, ids=[c[2][:40] for c in CONFLICTS])
def test_contradiction_is_refused_naming_the_field(tmp_path: Path, changes: dict[str, Any], field: str,
                                                   problem: str) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(target_with(**changes)))
    with pytest.raises(TargetError) as err:
        load_target(site)
    assert err.value.field == field
    assert problem in str(err.value)
    assert str(err.value).startswith(f"target {site}: {field}: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("changes", "strategy", "tp"), [
    # No flag: the serve command follows the strategy.
    ({}, "multi_node_tp_dp", 8),
    ({"gpus__strategy": "multi_node_dep"}, "multi_node_dep", 1),
    ({"gpus__strategy": "single_node_tp"}, "single_node_tp", 8),
    # A flag that agrees with every strategy the target may use is kept.
    ({"serve__flags": tp_flags("--tensor-parallel-size", "8")}, "multi_node_tp_dp", 8),
    ({"gpus__strategy": "multi_node_dep", "serve__flags": tp_flags("--tensor-parallel-size=1")},
     "multi_node_dep", 1),
    ({"gpus__per_node": 4, "gpus__strategy": "multi_node_tp_pp"}, "multi_node_tp_pp", 4),
])
def test_coherent_targets_load_and_the_serve_command_follows_the_strategy(
        tmp_path: Path, changes: dict[str, Any], strategy: str, tp: int) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(target_with(**changes)))
    target = load_target(site)
    raw = {"gpu-a": json.loads((FIX / "host_r580_h200_hgx.json").read_text())}
    facts, _ = validate_facts(raw, freeze=False)
    decision = evaluate_fleet(facts, target).strategy
    assert decision is not None and decision.strategy == strategy
    assert decision.tensor_parallel_size == tp
    cmd = decision.serve_command
    assert cmd[:3] == ["vllm", "serve", "moonshotai/Kimi-K3"]
    tp_values = [cmd[i + 1] for i, tok in enumerate(cmd) if tok == "--tensor-parallel-size"]
    tp_values += [tok.split("=", 1)[1] for tok in cmd if tok.startswith("--tensor-parallel-size=")]
    assert tp_values == [str(tp)]
    assert "--enable-prefix-caching" in cmd


@pytest.mark.parametrize("command", [["audit", "--lab"], ["checks"]])
def test_cli_refuses_with_exit_2_and_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              command: list[str]) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(target_with(image__cuda="13.1")))
    rc = main([*command, "--target", str(site), "--runs-dir", str(tmp_path / "runs")] if command[0] == "audit"
              else [*command, "--target", str(site)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("k3fleet: error: target ") and ": driver.target_version: 580.95.05 is below 590.44.01" in err
    # Refused before anything ran: no run directory was started.
    assert not (tmp_path / "runs").exists()
