"""Target file and CUDA -> driver matrix: loading, validation errors, derived values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from k3fleet.models.target import OpenModulesSpec, version_tuple
from k3fleet.targets import TargetError, default_target_path, load_matrix, load_target

DEFAULT = yaml.safe_load(default_target_path().read_text())


def _write(tmp_path: Path, data: object, name: str = "site.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def _with(path: str, value: object) -> dict:
    """The default target with one dotted field replaced (a value of ... deletes it)."""
    data = yaml.safe_load(default_target_path().read_text())
    node = data
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


def test_default_target_is_the_kimi_k3_recipe() -> None:
    t = load_target(None)
    assert t.name == "kimi-k3"
    assert t.image.ref == "vllm/vllm-openai:kimi-k3"
    assert t.image.cuda == "13.0"
    assert t.vllm.min_version == "0.27.1"
    assert t.driver.branch == 580
    # The layout follows from the hardware: one node of 8x H200 cannot hold the weights, 8x B300 can.
    assert t.gpus.strategy == "auto" and t.gpus.explicit_strategy is None and t.gpus.per_node == 8
    assert t.gpus.multi_node_strategy == "multi_node_tp_dp"
    w = t.gpus.weights_memory
    assert w is not None and w.gb == 1561 and w.format == "MXFP4"
    # The measured deployment's figure (1.42 TiB) and load time, with their source: data an operator overrides.
    assert w.confirmed is True and "llm-d" in w.source and "1.42 TiB" in w.source
    assert w.load_s == 5385 and w.load_source and "5385" in w.load_source
    # The change night's serving smoke waits for a server that loads these weights: its bound covers the load.
    assert t.change.smoke_ready_timeout_s >= w.load_s
    assert t.gpus.min_total_by_strategy == {
        "single_node_tp": 8, "multi_node_tp_dp": 16, "multi_node_tp_pp": 16, "multi_node_dep": 16}
    # The minimum comes from the matrix row for CUDA 13.0 GA, not from the target file.
    min_driver, row = t.min_driver()
    assert min_driver == "580.65.06"
    assert row is not None and row.label == "13.0 GA" and row.confirmed
    assert t.unconfirmed_rows_used() == []
    # Whether RDMA is required follows from the derived strategy, not from the file alone.
    assert t.rdma_required is None
    assert t.rdma_required_for("multi_node_tp_dp") and not t.rdma_required_for("single_node_tp")
    assert t.serve.missing_flags(t.serve.flags) == []
    assert t.serve.argv()[:3] == ["vllm", "serve", "moonshotai/Kimi-K3"]


def test_matrix_rows_carry_sources_and_flags() -> None:
    m = load_matrix()
    assert all(r.source for r in m.rows)
    unconfirmed = {r.label for r in m.rows if not r.confirmed}
    assert unconfirmed == {"13.3", "13.4", "13.5"}
    assert next(r for r in m.rows if r.label == "13.3").min_driver == "610.43.02"
    assert next(r for r in m.rows if r.label == "13.0 Update 2").min_driver == "580.95.05"
    assert next(r for r in m.rows if r.label == "12.9 Update 1").min_driver == "575.57.08"
    assert m.floor_branch(13) is not None and m.floor_branch(13).min_driver_branch == 580
    assert m.branch_info(575) is not None and m.branch_info(575).kind == "EOL"


@pytest.mark.parametrize(
    ("cuda", "label", "exact"),
    [
        ("13.0.2", "13.0 Update 2", True),
        ("13.0", "13.0 GA", True),
        ("12.9.1", "12.9 Update 1", True),
        # No 13.0.3 row: the newest 13.0 row at or below it governs.
        ("13.0.3", "13.0 Update 2", False),
        # No 12.6 GA row: the only 12.6 row is newer, which can only be stricter.
        ("12.6.0", "12.6 Update 3", False),
        ("14.0", None, False),
        ("garbage", None, False),
    ],
)
def test_matrix_row_for(cuda: str, label: str | None, exact: bool) -> None:
    row, is_exact = load_matrix().row_for(cuda)
    assert (row.label if row else None) == label
    assert is_exact is exact


@pytest.mark.parametrize(
    ("driver", "max_cuda"),
    [
        ("575.57.08", "12.9 Update 1"),
        ("575.51.03", "12.9 GA"),
        ("580.65.06", "13.0 GA"),
        ("580.95.05", "13.0 Update 2"),
        ("590.44.01", "13.1 GA"),
        ("595.71.05", "13.2 Update 2"),
        ("610.43.02", "13.3"),
        ("500.10", None),
        ("not-a-version", None),
    ],
)
def test_max_cuda_for_driver(driver: str, max_cuda: str | None) -> None:
    row = load_matrix().max_cuda_for_driver(driver)
    assert (row.label if row else None) == max_cuda


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("580.95.05", (580, 95, 5)),
        ("580.95.05-0ubuntu0.24.04.1", (580, 95, 5)),
        ("3:580.95.05-1.el9", (580, 95, 5)),
        ("570.26", (570, 26)),
        ("1.17.8", (1, 17, 8)),
        ("0.27.1rc1", (0, 27, 1)),
        ("", None),
        (None, None),
        ("n/a", None),
    ],
)
def test_version_tuple(text: str | None, expected: tuple[int, ...] | None) -> None:
    assert version_tuple(text) == expected


@pytest.mark.parametrize(
    ("name", "cc", "required"),
    [
        ("NVIDIA H100 80GB HBM3", "9.0", False),
        ("NVIDIA H200", "9.0", False),
        ("NVIDIA A100-SXM4-80GB", "8.0", False),
        # Grace Hopper is compute capability 9.0 like H100, but needs open modules.
        ("NVIDIA GH200 480GB", "9.0", True),
        ("NVIDIA B200", "10.0", True),
        ("NVIDIA GB300", "10.3", True),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", True),
        ("NVIDIA B300", None, True),
        (None, "10.0", True),
        (None, None, False),
    ],
)
def test_open_modules_required(name: str | None, cc: str | None, required: bool) -> None:
    spec = load_target(None).open_modules
    assert isinstance(spec, OpenModulesSpec)
    assert spec.required_for(name, cc) is required


@pytest.mark.parametrize(
    ("strategy", "models", "need"),
    [
        ("single_node_tp", ["NVIDIA H200"], 8),
        ("multi_node_tp_dp", ["NVIDIA B200"], 16),
        ("multi_node_dep", ["NVIDIA H200"], 16),
        # Any layout on H100 needs 32, whatever the strategy says.
        ("single_node_tp", ["NVIDIA H100 80GB HBM3"], 32),
        ("multi_node_tp_pp", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"], 32),
    ],
)
def test_min_total_gpus(tmp_path: Path, strategy: str, models: list[str], need: int) -> None:
    t = load_target(_write(tmp_path, _with("gpus.strategy", strategy)))
    assert t.gpus.explicit_strategy == strategy
    assert t.gpus.min_total(models)[0] == need
    assert t.rdma_required is strategy.startswith("multi_node")


@pytest.mark.parametrize(
    ("strategy", "models", "need", "basis"),
    [
        ("single_node_tp", ["NVIDIA B300"], 8, "strategy single_node_tp"),
        ("multi_node_tp_dp", ["NVIDIA H200"], 16, "strategy multi_node_tp_dp"),
        ("single_node_tp", ["NVIDIA H100 80GB HBM3"], 32, "H100 (any layout)"),
    ],
)
def test_min_total_for_a_derived_strategy(strategy: str, models: list[str], need: int, basis: str) -> None:
    gpus = load_target(None).gpus
    assert gpus.min_total(models, strategy) == (need, basis)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="auto: pass the derived strategy"):
        gpus.min_total(models)


def test_explicit_strategy_needs_no_weights_figure(tmp_path: Path) -> None:
    data = _with("gpus.weights_memory", ...)
    data["gpus"]["strategy"] = "multi_node_dep"
    t = load_target(_write(tmp_path, data))
    assert t.gpus.weights_memory is None and t.gpus.explicit_strategy == "multi_node_dep" and t.rdma_required


def test_rdma_required_by_the_file_wins(tmp_path: Path) -> None:
    data = _with("rdma.required", False)
    t = load_target(_write(tmp_path, data))
    assert t.rdma_required is False and not t.rdma_required_for("multi_node_dep")


def test_serve_missing_flags() -> None:
    s = load_target(None).serve
    argv = ["--enable-prefix-caching", "--tool-call-parser=hermes", "--reasoning-parser", "kimi_k3"]
    assert s.missing_flags(argv) == ["--enable-auto-tool-choice", "--tool-call-parser kimi_k3"]


@pytest.mark.parametrize(
    ("path", "value", "field", "problem"),
    [
        ("gpus.per_node", "eight", "gpus.per_node", "valid integer"),
        ("gpus.per_node", 0, "gpus.per_node", "greater than 0"),
        ("gpus.strategy", "pipeline", "gpus.strategy", "single_node_tp"),
        ("gpus.strategy", "pipeline", "gpus.strategy", "'auto'"),
        ("gpus.weights_memory", ..., "gpus", "set weights_memory"),
        ("gpus.weights_memory", {"gb": 1680}, "gpus.weights_memory.source", "Field required"),
        ("gpus.weights_memory", {"gb": 0, "source": "x"}, "gpus.weights_memory.gb", "greater than 0"),
        ("gpus.multi_node_strategy", "single_node_tp", "gpus", "must be a multi_node_* strategy"),
        ("image.cuda", "thirteen", "image.cuda", "CUDA release"),
        ("image", "vllm/vllm-openai:kimi-k3", "image", "valid dictionary"),
        ("vllm.min_version", "latest", "vllm.min_version", "version like 0.27.1"),
        ("rdma.link_layer", "Omni-Path", "rdma.link_layer", "InfiniBand"),
        ("change.wave_fraction", 1.5, "change.wave_fraction", "less than or equal to 1"),
        ("image.ref", ..., "image.ref", "Field required"),
        ("imagee", {"ref": "x"}, "imagee", "unknown key"),
        # Cross-field rules name the field to change.
        ("driver.target_version", "575.57.08", "driver.target_version", "not on branch 580"),
        ("image.cuda", "14.0", "image.cuda", "no row in the CUDA driver matrix"),
        ("image.cuda", "13.4", "image.cuda", "has no minimum driver"),
        ("serve.flags", ["--trust-remote-code"], "serve", "lacks required flags"),
        ("matrix", {"rows": []}, "matrix", "read from matrix_file"),
        ("matrix_file", 7, "matrix_file", "expected a file name"),
    ],
)
def test_target_errors_name_file_field_problem(
    tmp_path: Path, path: str, value: object, field: str, problem: str
) -> None:
    p = _write(tmp_path, _with(path, value))
    with pytest.raises(TargetError) as err:
        load_target(p)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(p) in msg
    assert f": {field}: " in msg
    assert problem in msg
    assert err.value.field == field
    assert isinstance(err.value, ValueError)


def test_several_errors_are_summarised_on_one_line(tmp_path: Path) -> None:
    data = _with("gpus.per_node", "eight")
    data["vllm"]["min_version"] = "latest"
    with pytest.raises(TargetError) as err:
        load_target(_write(tmp_path, data))
    msg = str(err.value)
    assert "\n" not in msg
    assert ": gpus.per_node: " in msg or ": vllm.min_version: " in msg
    assert "also invalid: gpus.per_node" in msg or "also invalid: vllm.min_version" in msg
    assert "Value error" not in msg and msg.count("'latest'") <= 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("image: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping at the top level, got list"),
        ("", "expected a mapping at the top level, got NoneType"),
    ],
)
def test_unreadable_target_files(tmp_path: Path, text: str, problem: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(TargetError, match=problem) as err:
        load_target(p)
    assert err.value.file == f"target {p}"


def test_yaml_error_names_the_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "name: x\nimage: {ref: [\n")
    with pytest.raises(TargetError, match=r"line \d+ column \d+"):
        load_target(p)


def test_missing_target_file(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="cannot read file"):
        load_target(tmp_path / "nope.yaml")


def test_site_target_without_matrix_uses_packaged_matrix(tmp_path: Path) -> None:
    t = load_target(_write(tmp_path, _with("name", "site")))
    assert t.name == "site"
    assert t.min_driver()[0] == "580.65.06"


def test_matrix_beside_target_wins_and_is_validated(tmp_path: Path) -> None:
    matrix = yaml.safe_load((default_target_path().parent / "cuda_driver_matrix.yaml").read_text())
    row = next(r for r in matrix["rows"] if r["cuda"] == "13.0.0")
    row["min_driver"] = "580.10.01"
    _write(tmp_path, matrix, "cuda_driver_matrix.yaml")
    t = load_target(_write(tmp_path, DEFAULT))
    assert t.min_driver()[0] == "580.10.01"

    row["min_driver"] = "five-eighty"
    bad = _write(tmp_path, matrix, "cuda_driver_matrix.yaml")
    with pytest.raises(TargetError) as err:
        load_target(tmp_path / "site.yaml")
    assert str(bad) in str(err.value)
    assert ": rows." in str(err.value) and ".min_driver: " in str(err.value)
    assert "driver version like" in str(err.value)


def test_matrix_rejects_duplicate_rows(tmp_path: Path) -> None:
    matrix = yaml.safe_load((default_target_path().parent / "cuda_driver_matrix.yaml").read_text())
    matrix["rows"].append(dict(matrix["rows"][-1]))
    with pytest.raises(TargetError, match=r"duplicate matrix row for CUDA 12\.0\.0"):
        load_matrix(_write(tmp_path, matrix, "m.yaml"))


def test_unconfirmed_row_is_reported_when_the_target_uses_it(tmp_path: Path) -> None:
    # A CUDA 13.3 image needs the (unconfirmed) 610.43.02: the target must move to R610 to be coherent.
    data = _with("image.cuda", "13.3")
    data["driver"].update(branch=610, target_version="610.43.02")
    t = load_target(_write(tmp_path, data))
    assert [r.label for r in t.unconfirmed_rows_used()] == ["13.3"]
    assert t.min_driver()[0] == "610.43.02"
