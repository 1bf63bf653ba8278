"""The simulated lab fleet: profiles, generation, command replay, and the story the audit must see.

Replays are checked through the production NodeReader (files under the host root, commands
only on <root>/bin), and the rendered formats against real captured outputs in
tests/fixtures/lab/ (each with a .source note).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from k3fleet.lab.fleet import LabFleetError, default_image, expand_hosts, generate_fleet, load_fleet
from k3fleet.lab.profile import FleetSpec, LabProfileError, load_fleet_file
from k3fleet.lab.render import ProfileRenderer
from k3fleet.lab.replay import replay_key
from k3fleet.paths import data_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lab"
PROFILES = data_dir("inventories/lab") / "profiles"
IMAGE = default_image()


def reader_for(root: Path, timeout: float = 10.0) -> NodeReader:
    return NodeReader(root=str(root), path=str(root / "bin"), timeout=timeout)


@pytest.fixture(scope="module")
def fleet() -> FleetSpec:
    return load_fleet()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, fleet: FleetSpec) -> Path:
    dest = tmp_path_factory.mktemp("lab")
    generate_fleet(fleet, dest, python="/usr/bin/python3")
    return dest


def make_fleet(tmp_path: Path, hosts: dict[str, object], profiles: dict[str, str]) -> Path:
    """A fleet directory with the packaged profiles plus ``profiles`` (name -> YAML text)."""
    fleet_dir = tmp_path / "fleet"
    shutil.copytree(PROFILES, fleet_dir / "profiles")
    for name, text in profiles.items():
        (fleet_dir / "profiles" / f"{name}.yaml").write_text(text)
    (fleet_dir / "fleet.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    return fleet_dir / "fleet.yaml"


# -- the default fleet -------------------------------------------------------------------


def test_default_fleet_tells_the_change_night_story(fleet: FleetSpec) -> None:
    names = [h.name for h in fleet.hosts]
    assert names == [f"gpu-a{i:02d}" for i in range(1, 11)]
    by_name = {h.name: h.profile for h in fleet.hosts}
    on_r575 = [n for n, p in by_name.items() if p.driver and p.driver.running_version == "575.57.08"]
    assert len(on_r575) > len(names) / 2, "most hosts are on R575"
    healthy_r580 = by_name["gpu-a03"]
    assert healthy_r580.driver is not None and healthy_r580.driver.version == "580.95.05"
    assert healthy_r580.slurm is not None and healthy_r580.slurm.state == "idle"
    fm = by_name["gpu-a04"]
    assert fm.driver is not None and (fm.driver.running_version, fm.fabricmanager_version) == ("580.95.05",
                                                                                                "580.82.07")
    assert fm.fabricmanager.active == "failed"
    assert by_name["gpu-a05"].infiniband.ports["mlx5_3"].state == "DOWN"
    assert by_name["gpu-a06"].nvidia_peermem is False
    assert (by_name["gpu-a07"].nccl_conf or {}).get("NCCL_DEBUG") == "INFO"
    assert [n for n, p in by_name.items() if not p.reachable] == ["gpu-a09"]
    # GPU 3 of gpu-a05 holds uncorrectable ECC errors and a pending remap; gpu-a06's GPU 5 logged Xid 79.
    assert by_name["gpu-a05"].gpus.health_of(3).remap_pending and not by_name["gpu-a05"].gpus.health_of(0).remap_pending
    assert [(x.code, x.gpu) for x in by_name["gpu-a06"].xid] == [(79, 5)]
    # A model server outside Slurm holds every GPU of gpu-a10 while Slurm calls the node idle.
    busy = by_name["gpu-a10"]
    assert busy.slurm is not None and busy.slurm.state == "idle" and not busy.slurm.jobs
    assert [busy.gpus.used_mib(i) for i in range(8)] == [131072] * 8
    for profile in by_name.values():
        # Otherwise representative: 8x H200 HGX with NVSwitch, 8 NDR 400 rails.
        assert (profile.gpus.model, profile.gpus.count, profile.nvswitches) == ("NVIDIA H200", 8, 4)
        assert profile.infiniband.hcas == 8 and profile.infiniband.rate == "400 Gb/sec (4X NDR)"


def test_inventory_points_each_host_at_its_root(lab: Path) -> None:
    inventory = yaml.safe_load((lab / "inventory.yml").read_text())
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    assert len(hosts) == 10
    for name, hv in hosts.items():
        root = Path(hv["k3fleet_root"])
        assert root == lab / "hosts" / name and root.is_dir()
        assert hv["k3fleet_path"] == str(root / "bin")
        assert hv["k3fleet_use_nvml"] is False
        assert hv["ansible_python_interpreter"] == "/usr/bin/python3"
        assert hv["k3fleet_image"] == IMAGE
    unreachable = {n: hv for n, hv in hosts.items() if hv["ansible_connection"] != "local"}
    assert list(unreachable) == ["gpu-a09"]
    assert (unreachable["gpu-a09"]["ansible_connection"], unreachable["gpu-a09"]["ansible_host"],
            unreachable["gpu-a09"]["ansible_port"]) == ("ssh", "127.0.0.1", 1)
    manifest = json.loads((lab / "k3fleet-lab.json").read_text())
    assert [h["profile"] for h in manifest["hosts"]][:3] == ["h200-r575", "h200-r575-open", "h200-r580"]


@pytest.mark.parametrize("host", [f"gpu-a{i:02d}" for i in range(1, 11)])
def test_every_source_replays_exactly_what_was_rendered(lab: Path, fleet: FleetSpec, host: str) -> None:
    spec = fleet.host(host)
    shared, own = ProfileRenderer(spec.profile, IMAGE).host_image(host)
    reader = reader_for(lab / "hosts" / host)
    files = {**shared.files, **own.files}
    for path, content in files.items():
        if content is None:
            assert reader.listdir(path) == [], path
        else:
            assert reader.read(path) == content, path
    expected = {}
    for img in (shared, own):
        for recs in img.commands.values():
            expected.update(recs)
    for argv, rec in expected.items():
        res = reader.run(list(argv))
        assert (res.stdout, res.stderr, res.rc, res.error) == (rec.stdout, rec.stderr, rec.rc, None), argv[:3]
    # Nothing outside the recordings answers: the controller's real tools are invisible.
    for tool in ("nvidia-smi", "dpkg-query", "rpm", "dkms", "docker", "podman", "scontrol", "lspci"):
        if tool not in {argv[0] for argv in expected}:
            assert reader.run([tool, "--version"]).error == "not_found", tool


def test_fleet_covers_every_named_source(tmp_path: Path, fleet: FleetSpec) -> None:
    # The default fleet plus the RHEL, podman, Jetson and NVL72 profiles answer every file and command the
    # collectors ask for (rpm, dnf versionlock and podman only exist there; the L4T release file and
    # the device tree only on the Jetson; IMEX only on the NVL72 tray).
    fleet_file = make_fleet(tmp_path, {"r1": "h200-r575-rhel9", "b1": "b200-r580", "j1": "jetson-orin-l4t35",
                                       "n1": "gb200-nvl72-r580", **{h.name: h.profile_name for h in fleet.hosts}},
                            {})
    spec = load_fleet(fleet_file)
    seen_argv: set[tuple[str, ...]] = set()
    seen_files: set[str] = set()
    for host in spec.hosts:
        shared, own = ProfileRenderer(host.profile, IMAGE).host_image(host.name)
        for img in (shared, own):
            seen_files.update(img.files)
            for recs in img.commands.values():
                seen_argv.update(recs)
    for name, argv in sources.COMMANDS.items():
        assert tuple(argv) in seen_argv, name
    for name, path in sources.FILES.items():
        assert any(f == path or f.startswith(path + "/") for f in seen_files), name
    for runtime in ("docker", "podman"):
        for argv in (sources.runtime_version_argv(runtime), sources.image_inspect_argv(runtime, IMAGE),
                     sources.probe_argv(runtime, IMAGE)):
            assert tuple(argv) in seen_argv, argv[:3]


# -- replay mechanics ----------------------------------------------------------------------


def test_unrecorded_arguments_fail_with_a_clear_message(lab: Path) -> None:
    res = reader_for(lab / "hosts" / "gpu-a01").run(["nvidia-smi", "-q", "-x"])
    assert res.rc == 2
    assert res.stderr == "nvidia-smi: no lab recording for: -q -x\n"
    assert res.stdout == ""


def test_replay_key_is_computed_like_the_script(tmp_path: Path) -> None:
    fleet_file = make_fleet(tmp_path, {"gpu-k01": {"profile": "h200-r575", "set": {"raw": {
        "fabricmanager_version": {"stdout": "odd\n", "rc": 3}}}}}, {})
    generate_fleet(load_fleet(fleet_file), tmp_path / "lab")
    root = tmp_path / "lab" / "hosts" / "gpu-k01"
    argv = sources.COMMANDS["fabricmanager_version"]
    assert (root / ".replay" / argv[0] / f"{replay_key(argv)}.out").is_file()
    res = reader_for(root).run(argv)
    assert (res.stdout, res.rc) == ("odd\n", 3)
    # The probe's argv carries a multi-line Python program: keys survive newlines in arguments.
    probe = reader_for(root).run(sources.probe_argv("docker", IMAGE))
    assert probe.rc == 125 and "requirement error" in probe.stderr


def test_replay_answers_from_its_index_byte_for_byte(tmp_path: Path) -> None:
    # Quotes, backslashes, printf's %, command substitutions, UTF-8, a carriage return and no final
    # newline come through the shell's printf unchanged, with stderr and the exit status.
    awkward = "it's \\n %s %% \"$(x)\" `y` \u2192 \u00e9\r\nno final newline"
    fleet_file = make_fleet(tmp_path, {"gpu-k01": {"profile": "h200-r575", "set": {"raw": {
        "dkms_status": {"stdout": awkward, "stderr": "warn: 'x'\n", "rc": 4}}}}}, {})
    generate_fleet(load_fleet(fleet_file), tmp_path / "lab")
    root = tmp_path / "lab" / "hosts" / "gpu-k01"
    argv = sources.COMMANDS["dkms_status"]
    key = replay_key(argv)
    index = (root / ".replay" / argv[0] / "index").read_text()
    assert f"'dkms\nstatus') . \"$d/{key}.sh\" ;;" in index
    res = reader_for(root).run(argv)
    assert (res.stdout, res.stderr, res.rc) == (awkward, "warn: 'x'\n", 4)
    # The recording's own files hold the same answer: without the index the script finds them by key.
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    (copy / ".replay" / argv[0] / "index").unlink()
    res = reader_for(copy).run(argv)
    assert (res.stdout, res.stderr, res.rc) == (awkward, "warn: 'x'\n", 4)


def test_recorded_sleep_hangs_until_the_reader_timeout_kills_it(tmp_path: Path) -> None:
    fleet_file = make_fleet(tmp_path, {
        "gpu-h01": {"profile": "h200-r575", "set": {"raw": {"nvidia_smi_q": {"sleep": 60}}}},
        "gpu-h02": {"profile": "h200-r575", "set": {"raw": {"dkms_status": {"stdout": "late\n", "sleep": 60}}}},
        "gpu-h03": {"profile": "h200-r575", "set": {"raw": {"lspci_vvv": {"stdout": "slow\n", "sleep": 0.3}}}},
    }, {})
    generate_fleet(load_fleet(fleet_file), tmp_path / "lab")
    hosts = tmp_path / "lab" / "hosts"
    for host, argv in (("gpu-h01", sources.COMMANDS["nvidia_smi_q"]), ("gpu-h02", sources.COMMANDS["dkms_status"])):
        started = time.monotonic()
        res = reader_for(hosts / host, timeout=0.5).run(argv)
        assert res.error == "timeout", host
        # The kill must end the wait: no child keeps the pipes open for the recorded 60 s.
        assert time.monotonic() - started < 10, host
        assert "timed out" in res.reason()
    slow = reader_for(hosts / "gpu-h03", timeout=10).run(sources.COMMANDS["lspci_vvv"])
    assert (slow.stdout, slow.rc, slow.error) == ("slow\n", 0, None)
    assert slow.duration >= 0.3


def test_raw_captures_replay_verbatim(tmp_path: Path) -> None:
    fixtures = tmp_path / "captures"
    shutil.copytree(FIXTURES, fixtures)
    fleet_file = make_fleet(tmp_path, {"gpu-r01": "captured"}, {"captured": (
        "extends: h200-r575-open\n"
        "raw_file:\n"
        "  proc_driver_version: ../../captures/proc_driver_version_open_565.txt\n"
        "  probe: {stderr: ../../captures/docker_requirement_error_cuda124.txt, rc: 125}\n"
        "raw:\n"
        "  nccl_conf: \"NCCL_DEBUG=WARN\\n\"\n"
        "  dkms_status: null\n"
        "  nvidia_ctk_version: {stdout: '', stderr: \"nvidia-ctk: error while loading shared libraries\\n\", rc: 127}\n"
    )})
    generate_fleet(load_fleet(fleet_file), tmp_path / "lab")
    reader = reader_for(tmp_path / "lab" / "hosts" / "gpu-r01")
    real_version = (FIXTURES / "proc_driver_version_open_565.txt").read_text()
    assert reader.read(sources.FILES["proc_driver_version"]) == real_version
    probe = reader.run(sources.probe_argv("docker", IMAGE))
    assert (probe.stdout, probe.stderr, probe.rc) == ("", (FIXTURES / "docker_requirement_error_cuda124.txt")
                                                      .read_text(), 125)
    assert reader.read(sources.FILES["nccl_conf"]) == "NCCL_DEBUG=WARN\n"
    # null removes the source: dkms has no recording left, so the tool is not installed at all.
    assert reader.run(sources.COMMANDS["dkms_status"]).error == "not_found"
    ctk = reader.run(sources.COMMANDS["nvidia_ctk_version"])
    assert (ctk.rc, ctk.stderr) == (127, "nvidia-ctk: error while loading shared libraries\n")


# -- bad input ------------------------------------------------------------------------------

BAD_PROFILES = [
    ("driver:\n  version: '575'\n", "driver.version", "is not an NVIDIA driver version"),
    ("extends: h200-r575\nnvidia_peremem: false\n", "nvidia_peremem", "unknown key"),
    ("extends: no-such-profile\n", "no-such-profile", "not found"),
    ("extends: h200-r575\nraw: {nvidia_smi_json: x}\n", "raw", "unknown source 'nvidia_smi_json'"),
    ("extends: h200-r575\nraw: {infiniband_dir: x}\n", "raw", "directory source"),
    ("extends: h200-r575\nraw: {os_release: {stdout: x}}\n", "raw", "is a file"),
    ("extends: h200-r575\ninfiniband: {ports: {mlx5_9: {state: DOWN}}}\n", "infiniband", "mlx5_9"),
    ("extends: h200-r575\nslurm: {state: allocated}\n", "slurm", "needs at least one running job"),
    ("extends: h200-r575\ngpus: {count: 2, pci_bus_ids: ['00000000:18:00.0']}\n", "gpus", "count is 2"),
    ("extends: h200-r575\ncontainer: {runtime: none}\nraw: {probe: x}\n", "(top level)", "container.runtime is none"),
    ("extends: h200-r575\ndriver: [575]\n", "driver", "valid dictionary"),
    ("extends: broken\n", "broken.yaml", "invalid YAML"),
    ("extends: loop-b\n", "inheritance loop", "loop-a -> loop-b -> loop-a"),
    ("extends: h200-r575\nraw_file: {lspci_vvv: missing.txt}\n", "raw_file.lspci_vvv", "cannot read"),
]


@pytest.mark.parametrize(("text", "field", "detail"), BAD_PROFILES, ids=[c[1] + ":" + c[2][:20] for c in BAD_PROFILES])
def test_bad_profiles_fail_with_one_line_naming_file_and_field(tmp_path: Path, text: str, field: str,
                                                               detail: str) -> None:
    name = "loop-a" if "loop-b" in text else "bad"
    fleet_file = make_fleet(tmp_path, {"gpu-b01": name}, {
        name: text, "broken": "driver: {version: [\n", "loop-b": "extends: loop-a\n"})
    with pytest.raises(LabProfileError) as info:
        load_fleet_file(fleet_file)
    message = str(info.value)
    assert "\n" not in message
    assert ".yaml" in message and field in message and detail in message, message


def test_bad_fleet_files(tmp_path: Path) -> None:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text("hosts: {GPU_1: h200-r575}\n")
    with pytest.raises(LabProfileError, match=r"hosts\.GPU_1: host name must be a lowercase DNS label"):
        load_fleet(fleet_file)
    fleet_file.write_text("hosts: {gpu-1: {profile: h200-r575, extra: 1}}\n")
    with pytest.raises(LabProfileError, match="unknown field"):
        load_fleet(fleet_file)
    fleet_file.write_text("machines: {}\n")
    with pytest.raises(LabProfileError, match="unknown top-level field"):
        load_fleet(fleet_file)
    with pytest.raises(LabProfileError, match="lab fleet file not found"):
        load_fleet(tmp_path / "nowhere.yaml")


def test_generation_refuses_a_foreign_directory_and_replaces_a_previous_lab(tmp_path: Path,
                                                                           fleet: FleetSpec) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(LabFleetError, match="refusing to generate the lab"):
        generate_fleet(fleet, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    dest = tmp_path / "lab"
    generate_fleet(fleet, dest, count=12)
    (dest / "run-001").mkdir()  # something of the user's next to the lab survives regeneration
    inventory = generate_fleet(fleet, dest)
    assert len(yaml.safe_load(inventory.read_text())["all"]["children"]["lab"]["hosts"]) == 10
    assert not (dest / "hosts" / "gpu-0012").exists() and (dest / "run-001").is_dir()


# -- scale -----------------------------------------------------------------------------------


def test_count_scales_the_fleet_keeping_its_proportions(tmp_path: Path, fleet: FleetSpec) -> None:
    inventory = generate_fleet(fleet, tmp_path / "lab", count=1000)
    hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["lab"]["hosts"]
    assert len(hosts) == 1000 and "gpu-0001" in hosts and "gpu-1000" in hosts
    unreachable = [n for n, hv in hosts.items() if hv["ansible_connection"] == "ssh"]
    # Host i takes the profile of fleet host i mod 10: gpu-a09 (unreachable) is the 9th, gpu-a03 the 3rd.
    assert len(unreachable) == len(range(8, 1000, 10)) == 100
    profiles = [hv["k3fleet_lab_profile"] for hv in hosts.values()]
    assert profiles.count("h200-r580") == len(range(2, 1000, 10))
    assert profiles.count("h200-r575-busy") == 100
    # A scaled host answers with its own name, and identical trees are shared, not copied.
    root = tmp_path / "lab" / "hosts" / "gpu-0732"
    res = reader_for(root).run(sources.scontrol_show_node_argv("gpu-0732"))
    assert res.ok and res.stdout.startswith("NodeName=gpu-0732 ")
    assert os.path.realpath(root / "proc") == os.path.realpath(tmp_path / "lab" / "hosts" / "gpu-0002" / "proc")
    assert [n for n, _h in expand_hosts(fleet, 3)] == ["gpu-0001", "gpu-0002", "gpu-0003"]
    with pytest.raises(LabFleetError, match="at least 1"):
        expand_hosts(fleet, 0)


# -- formats against real captures -------------------------------------------------------------


def test_proc_driver_version_forms_match_real_and_documented_lines(lab: Path) -> None:
    real = (FIXTURES / "proc_driver_version_open_565.txt").read_text().splitlines()[0]
    open_form = re.compile(r"^NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  (\d+\.\d+\.\d+)  "
                           r"Release Build  \(\S+\)  \w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d UTC \d{4}$")
    assert open_form.match(real)
    rendered_open = reader_for(lab / "hosts" / "gpu-a02").read(sources.FILES["proc_driver_version"])
    match = open_form.match(rendered_open.splitlines()[0])
    assert match and match.group(1) == "575.57.08"
    # docs/facts.md section 5, proprietary: no "Open", no "for x86_64", no build tag.
    rendered = reader_for(lab / "hosts" / "gpu-a01").read(sources.FILES["proc_driver_version"])
    assert re.match(r"^NVRM version: NVIDIA UNIX x86_64 Kernel Module  575\.57\.08  \w{3} ", rendered)
    assert rendered.splitlines()[1].startswith("GCC version:  gcc version ")


def test_requirement_error_matches_the_real_docker_failure(lab: Path) -> None:
    real = (FIXTURES / "docker_requirement_error_cuda124.txt").read_text().splitlines()
    probe = reader_for(lab / "hosts" / "gpu-a01").run(sources.probe_argv("docker", IMAGE))
    lines = probe.stderr.splitlines()
    assert probe.rc == 125
    assert lines[-1].rstrip(".") == real[-1].replace("cuda>=12.4", "cuda>=13.0").rstrip(".")
    assert lines[0].startswith("docker: Error response from daemon: failed to create task for container:")
    assert lines[0].endswith("stderr: Auto-detected mode as 'legacy'") and real[0].endswith(lines[0][-40:])


def test_scontrol_oneliner_has_the_fields_of_a_real_record_in_order(lab: Path) -> None:
    real = (FIXTURES / "scontrol_show_node_2405.txt").read_text()
    keys = re.compile(r"(?:^|\s)([A-Za-z_]+)=")
    res = reader_for(lab / "hosts" / "gpu-a04").run(sources.scontrol_show_node_argv("gpu-a04"))
    assert res.stdout.count("\n") == 1, "--oneliner prints one line per node"
    assert keys.findall(res.stdout) == keys.findall(real)
    assert "State=IDLE+DRAIN " in res.stdout and "State=IDLE+DRAIN " in real


def test_nvidia_smi_q_header_is_aligned_like_real_output(lab: Path) -> None:
    real = (FIXTURES / "nvidia_smi_q_header_580.txt").read_text().splitlines()
    out = reader_for(lab / "hosts" / "gpu-a03").run(sources.COMMANDS["nvidia_smi_q"]).stdout.splitlines()
    assert out[:3] == real[:3]
    for label in ("Timestamp", "Driver Version", "CUDA Version"):
        real_line = next(line for line in real if line.startswith(label))
        line = next(line for line in out if line.startswith(label))
        assert line.index(": ") == real_line.index(": ")
    assert "CUDA Version                              : 13.0" in out


def q_keys(block: list[str]) -> list[tuple[int, str]]:
    """(indent, key) of every line of an nvidia-smi -q block, sections included."""
    return [(len(line) - len(line.lstrip(" ")), line.split(":", 1)[0].strip()) for line in block if line.strip()]


def gpu_blocks(text: str) -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("GPU "):
            current = blocks.setdefault(line[4:], [])
        elif current is not None and line.strip():
            current.append(line)
    return blocks


def fabric_section(block: list[str]) -> list[str]:
    start = block.index("    Fabric")
    end = start + 1
    while end < len(block) and block[end].startswith("     "):
        end += 1
    return block[start:end]


def test_nvidia_smi_q_gpu_blocks_follow_a_real_capture(lab: Path) -> None:
    real_text = (FIXTURES / "nvidia_smi_q_gpu_h100_565.txt").read_text()
    (real,) = gpu_blocks(real_text).values()
    reader = reader_for(lab / "hosts" / "gpu-a03")
    text = reader.run(sources.COMMANDS["nvidia_smi_q"]).stdout
    blocks = gpu_blocks(text)
    csv = [line.split(", ") for line in reader.run(sources.COMMANDS["nvidia_smi_query"]).stdout.splitlines()]
    assert list(blocks) == [row[6] for row in csv]
    real_keys = q_keys(real)
    for bus_id, block in blocks.items():
        # Every rendered line is a line of the real block, in the real order and nesting.
        keys = iter(real_keys)
        assert all(key in keys for key in q_keys(block)), bus_id
        # Values start in the real column, whatever the nesting.
        assert {line.index(": ") for line in block if ": " in line} == {42}
        assert f"    GPU UUID                              : {csv[list(blocks).index(bus_id)][2]}" in block
    # A healthy single-node NVSwitch fabric prints exactly what the real HGX node printed.
    assert fabric_section(blocks["00000000:18:00.0"]) == fabric_section(real)
    assert text.startswith(real_text[:real_text.index("Timestamp")])


def test_nvidia_smi_q_fabric_waits_while_fabric_manager_is_down(lab: Path) -> None:
    real = (Path(__file__).resolve().parents[1] / "fixtures" / "driver" /
            "smi_q_580_fabric_in_progress_block.txt").read_text().splitlines()
    blocks = gpu_blocks(reader_for(lab / "hosts" / "gpu-a04").run(sources.COMMANDS["nvidia_smi_q"]).stdout)
    assert len(blocks) == 8
    for block in blocks.values():
        ours = [" ".join(line.split()) for line in fabric_section(block)]
        # R580.159 prints a wider key column and more Health lines; the fabric lines read the same.
        assert ours[:5] == [" ".join(line.split()) for line in real[:5]]
        assert ours[1] == "State : In Progress"


@pytest.mark.parametrize(("change", "state"), [
    ({}, "Completed"),
    ({"nvswitches": 0}, "N/A"),
    ({"gpus": {"compute_cap": "8.0", "model": "NVIDIA A100-SXM4-80GB"}}, "N/A"),
    ({"fabricmanager": {"active": "inactive"}}, "In Progress"),
    ({"fabricmanager": {"active": "activating"}}, "In Progress"),
    ({"fabricmanager": {"installed": False}}, "In Progress"),
    ({"fabricmanager": {"version": "580.82.07"}}, "In Progress"),
])
def test_nvidia_smi_q_fabric_state_follows_the_profile(tmp_path: Path, change: dict[str, object],
                                                       state: str) -> None:
    fleet_file = make_fleet(tmp_path, {"gpu-f01": {"profile": "h200-r580", "set": change}}, {})
    generate_fleet(load_fleet(fleet_file), tmp_path / "lab")
    text = reader_for(tmp_path / "lab" / "hosts" / "gpu-f01").run(sources.COMMANDS["nvidia_smi_q"]).stdout
    states = [line.split(": ", 1)[1] for block in gpu_blocks(text).values()
              for line in fabric_section(block) if line.startswith("        State ")]
    assert states == [state] * 8


def test_acs_lines_use_real_lspci_flags(tmp_path: Path) -> None:
    real = [" ".join(line.split()) for line in (FIXTURES / "lspci_acs_plx.txt").read_text().splitlines()]
    fleet_file = make_fleet(tmp_path, {"gpu-c01": {"profile": "h200-r575", "set": {"acs": {"enabled": True}}}}, {})
    generate_fleet(load_fleet(fleet_file), tmp_path / "lab")
    out = reader_for(tmp_path / "lab" / "hosts" / "gpu-c01").run(sources.COMMANDS["lspci_vvv"]).stdout
    acs = [" ".join(line.split()) for line in out.splitlines() if "ACSC" in line]
    assert acs[:2] == real and len(acs) == 16
    assert all(line.startswith("\t\tACSC") for line in out.splitlines() if "ACSC" in line)


def test_data_dir_finds_packaged_entries(tmp_path: Path) -> None:
    assert (data_dir("inventories/lab") / "fleet.yaml").is_file()
    with pytest.raises(FileNotFoundError, match=r"k3fleet/_data/no-such-thing.*no-such-thing"):
        data_dir("no-such-thing")
    with pytest.raises(ValueError, match="relative name"):
        data_dir("../etc")


# -- the collectors over the lab ----------------------------------------------------------------


def test_collectors_see_the_story(lab: Path, fleet: FleetSpec) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
    from k3fleet.models.facts import HostFacts

    facts: dict[str, HostFacts] = {}
    for host in fleet.hosts:
        if not host.profile.reachable:
            continue
        raw = collect_host(reader_for(lab / "hosts" / host.name), host.name, IMAGE, use_nvml=False, probe=True)
        facts[host.name] = HostFacts.model_validate(raw)
    assert len(facts) == 9
    for name in ("gpu-a01", "gpu-a05", "gpu-a06", "gpu-a07"):
        f = facts[name]
        assert (f.driver.driver_version, f.driver.kernel_module.flavour) == ("575.57.08", "proprietary"), name
        assert f.driver.cuda_driver_version == "12.9" and f.packages.driver_branch == "575"
        assert f.container.probe.failure == "requirement_error", name
    a02 = facts["gpu-a02"]
    assert (a02.driver.kernel_module.version, a02.driver.kernel_module.flavour) == ("575.57.08", "open")
    a03 = facts["gpu-a03"]
    assert a03.driver.driver_version == "580.95.05" and a03.driver.cuda_driver_version == "13.0"
    assert a03.fabricmanager.version_matches_driver is True and a03.container.probe.ok is True
    assert a03.container.probe.visible_gpus == 8 and a03.scheduler.state == "idle"
    assert [g.name for g in a03.driver.gpus] == ["NVIDIA H200"] * 8
    a04 = facts["gpu-a04"]
    assert a04.fabricmanager.version == "580.82.07" and a04.fabricmanager.unit.active == "failed"
    assert a04.fabricmanager.version_matches_driver is False and a04.scheduler.state == "drained"
    # Without pynvml the fabric state comes from nvidia-smi -q: registered where Fabric Manager
    # runs at the driver's version, waiting where it failed.
    for name in ("gpu-a01", "gpu-a02", "gpu-a03"):
        gpus = facts[name].driver.gpus
        assert {(g.fabric_state, g.fabric_status) for g in gpus} == {("completed", "success")}, name
        assert facts[name].driver.reason is None, name
    assert {(g.fabric_state, g.fabric_status) for g in a04.driver.gpus} == {("in_progress", None)}
    a05 = facts["gpu-a05"]
    assert a05.rdma.active_ports == 7
    assert {d.name: d.ports[0].state for d in a05.rdma.devices}["mlx5_3"] == "DOWN"
    assert facts["gpu-a06"].rdma.nvidia_peermem_loaded is False and facts["gpu-a01"].rdma.nvidia_peermem_loaded
    assert facts["gpu-a06"].scheduler.jobs_running == 2
    assert facts["gpu-a07"].nccl.settings["NCCL_DEBUG"].value == "INFO"
    assert "NCCL_DEBUG" not in facts["gpu-a01"].nccl.settings
    a08 = facts["gpu-a08"]
    assert a08.driver.kernel_module.version == "575.57.08" and a08.packages.driver_version == "580.95.05"
    assert a08.driver.status == "unknown" and "version mismatch" in (a08.driver.reason or "")
    for f in facts.values():
        assert f.container.image is not None and f.container.image.cuda_version == "13.0.2"
        assert f.container.image.vllm_version == "0.27.1" and f.container.toolkit_version == "1.17.8"
        assert f.packages.manager == "dpkg" and f.rdma.acs_checked and not f.rdma.acs_enabled_bridges


def test_proc_modules_lines_have_the_kernel_format_and_taints(lab: Path) -> None:
    # name size refcount deps state address [taints]: P proprietary, O out-of-tree, E unsigned (DKMS).
    line_form = re.compile(r"^[a-z0-9_]+ \d+ \d+ (-|[a-z0-9_,]+,) Live 0x[0-9a-f]{16}( \([A-Z]+\))?$")
    taints = {}
    for host in ("gpu-a01", "gpu-a02", "gpu-a03"):
        text = reader_for(lab / "hosts" / host).read(sources.FILES["proc_modules"])
        assert all(line_form.match(line) for line in text.splitlines()), host
        nvidia = next(line for line in text.splitlines() if line.startswith("nvidia "))
        taints[host] = nvidia.rsplit(" ", 1)[1]
    assert taints == {"gpu-a01": "(POE)", "gpu-a02": "(OE)", "gpu-a03": "(O)"}
