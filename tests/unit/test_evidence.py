"""The run directory: the redactor (names, shapes, structure), atomic exclusive writes, safe host
file names, the manifest and its verification."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest
import yaml

from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence import (
    REDACTED,
    EvidenceWriteError,
    RunDir,
    host_file_name,
    host_from_file_name,
    is_secret_name,
    redact,
    redact_argv,
    redact_text,
    verify_run,
)
from k3fleet.evidence.reader import RunReader
from k3fleet.evidence.redact import redact_file_text, redact_ini, redact_yaml

# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["password", "ansible_password", "ansible_ssh_pass", "ansible_become_pass", "ANSIBLE_BECOME_PASS", "HF_TOKEN",
     "HUGGING_FACE_HUB_TOKEN", "api_token", "Authorization", "Proxy-Authorization", "auth", "vault_secret",
     "private_key", "NGC_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SOME_PASSWORD",
     "x-api-key", "apiKey", "APIKey", "Cookie", "Set-Cookie", "client_credentials", "dbpassword", "password_hash",
     "secret", "SLURM_JWT", "GITHUB_PAT", "k3fleet_api_key"],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["passed", "pass_rate", "passthrough", "prompt_tokens", "cached_tokens", "max_tokens", "tokenizer", "author",
     "keyboard", "key", "keys", "consistent_keys", "host_key_checking", "k3fleet_host_key_checking", "ssh_host_key",
     "public_key", "sort_key", "api_key_env", "ansible_ssh_private_key_file", "ANSIBLE_VAULT_PASSWORD_FILE",
     "secret_name", "token_url", "auth_method", "AWS_ACCESS_KEY_ID", "NCCL_IB_HCA", "host", "monkey",
     "hf_token.txt", "secrets.yaml", "prefill-ms-per-token", "usd_per_token"],
)
def test_evidence_names(name: str) -> None:
    assert not is_secret_name(name)


def test_evidence_counts_survive_redaction() -> None:
    summary = {"passed": 3, "failed": 1, "pass_rate": 0.75, "usage": {"prompt_tokens": 120, "cached_tokens": 64},
               "host_key_checking": False, "api_key_env": "OPENAI_API_KEY"}
    assert redact(summary) == summary
    assert redact_text("passed=3 prompt_tokens=120") == "passed=3 prompt_tokens=120"


# -- shapes in text ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("vllm serve moonshotai/Kimi-K3 --api-key sk-live-abc123 --port 8000", "sk-live-abc123", "--api-key"),
        ("vllm serve m --api-key=k3y --tensor-parallel-size 8", "k3y", "--api-key="),
        ("curl -H 'x-api-key: XK-7781' http://127.0.0.1:8000/v1/models", "XK-7781", "x-api-key: "),
        ('curl -H "Authorization: Bearer eyJhbGciOi.J9.x" http://h/', "eyJhbGciOi.J9.x", '"Authorization: '),
        ("git clone https://deploy:gl-pw-42@git.example.invalid/x.git", "gl-pw-42", "https://deploy:"),
        ("NodeName=node01 State=DRAINED Reason=BMC password Hunt3r2 [root@2026-01-05T10:00:00]", "Hunt3r2",
         "Reason=BMC password "),
        ("root password is s3cr3t-pw", "s3cr3t-pw", "password is "),
        ("HF_TOKEN=hf_notarealtokenbutlongenough0123", "hf_notarealtokenbutlongenough0123", "HF_TOKEN="),
        ('{"ansible_become_pass": "two words"}', "two words", '"ansible_become_pass": '),
        ("export NGC_API_KEY='nv key'", "nv key", "NGC_API_KEY="),
        ("in a log: nvapi-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345", "nvapi-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345", "in a log"),
        ("Cookie: session=abc; csrftoken=def", "session=abc; csrftoken=def", "Cookie: "),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXk",
         "BEGIN OPENSSH PRIVATE KEY"),
    ],
)
def test_redact_text_shapes(text: str, secret: str, kept: str) -> None:
    out = redact_text(text)
    assert secret not in out
    assert kept in out
    assert REDACTED in out


def test_redact_text_leaves_evidence_alone() -> None:
    for text in ("ssh: connect to host 127.0.0.1 port 1: Connection refused",
                 "NCCL_IB_HCA=mlx5_0,mlx5_1 NCCL_DEBUG=INFO",
                 "http://127.0.0.1:8000/v1/models", "Permission denied (publickey,password).",
                 "--max-num-seqs 256 --enable-prefix-caching"):
        assert redact_text(text) == text


def test_redact_argv() -> None:
    assert redact_argv(["k3fleet", "--token", "abc", "audit"]) == ["k3fleet", "--token", REDACTED, "audit"]
    assert redact_argv(["k3fleet", "--api-key=abc"]) == ["k3fleet", f"--api-key={REDACTED}"]
    assert redact_argv(["x", "HF_TOKEN=hf_abc"]) == ["x", f"HF_TOKEN={REDACTED}"]
    assert redact_argv(["x", "-e", "ansible_become_pass=pw"]) == ["x", "-e", f"ansible_become_pass={REDACTED}"]
    assert redact_argv(["x", "-H", "Authorization: Basic dTpw"]) == ["x", "-H", f"Authorization: {REDACTED}"]
    assert redact_argv(["k3fleet", "audit", "-i", "inv.yml", "--api-key-env", "OPENAI_API_KEY"]) == [
        "k3fleet", "audit", "-i", "inv.yml", "--api-key-env", "OPENAI_API_KEY"]


# -- structures --------------------------------------------------------------------------------


def test_redact_structures_keep_the_key() -> None:
    data = {"ansible_password": "hunter2", "nested": [{"Authorization": "Bearer abc.def"}],
            "note": "token=xyz and more", "count": 3, "pin": 123456, "enabled_pass": None}
    out = redact(data)
    assert out["ansible_password"] == REDACTED
    assert out["nested"][0]["Authorization"] == REDACTED
    assert out["note"] == f"token={REDACTED} and more"
    assert out["count"] == 3
    assert redact({"ansible_become_pass": 123456}) == {"ansible_become_pass": REDACTED}


def test_redact_secret_setting_as_dict_value() -> None:
    """A token in /etc/nccl.conf reaches the facts as a setting with its source: value hidden, source kept."""
    facts = {"nccl": {"settings": {"NCCL_IB_HCA": {"value": "mlx5_0", "source": "/etc/nccl.conf"},
                                   "NCCL_PLUGIN_TOKEN": {"value": "tok-123", "source": "/etc/nccl.conf"}}},
             "env": [{"name": "HF_TOKEN", "value": "hf-1"}, {"name": "PATH", "value": "/usr/bin"}]}
    out = redact(facts)
    assert out["nccl"]["settings"]["NCCL_PLUGIN_TOKEN"] == {"value": REDACTED, "source": "/etc/nccl.conf"}
    assert out["nccl"]["settings"]["NCCL_IB_HCA"]["value"] == "mlx5_0"
    assert out["env"] == [{"name": "HF_TOKEN", "value": REDACTED}, {"name": "PATH", "value": "/usr/bin"}]


YAML_INVENTORY = """\
# production GPU nodes
all:
  vars:
    ansible_become_pass: two words here
    ansible_user: ops
  children:
    gpu:
      vars: {ansible_ssh_pass: "q'uoted", k3fleet_probe: true}
      hosts:
        gpu-01:
          ansible_host: 10.0.0.1
          credentials:
            user: svc
            secret: |
              line-one
              line-two
          vault_token: !vault |
            $ANSIBLE_VAULT;1.1;AES256
            6162636465
          proxy: http://svc:pr0xy@proxy.invalid:3128
"""


def test_redact_yaml_inventory_structurally() -> None:
    out = redact_yaml(YAML_INVENTORY)
    assert out is not None
    for secret in ("two words here", "q'uoted", "line-one", "line-two", "6162636465", "pr0xy", "svc\n"):
        assert secret not in out, secret
    data = yaml.safe_load(out.replace("!vault", ""))
    assert data["all"]["vars"] == {"ansible_become_pass": REDACTED, "ansible_user": "ops"}
    gpu = data["all"]["children"]["gpu"]
    assert gpu["vars"] == {"ansible_ssh_pass": REDACTED, "k3fleet_probe": True}
    host = gpu["hosts"]["gpu-01"]
    assert host["ansible_host"] == "10.0.0.1"
    assert host["credentials"] == {"user": REDACTED, "secret": REDACTED}
    assert out.startswith("# production GPU nodes\n")


INI_INVENTORY = """\
[gpu]
gpu-01 ansible_host=10.0.0.1 ansible_become_pass="pass with spaces" k3fleet_lspci=true
gpu-02 ansible_host=10.0.0.2 ansible_ssh_pass='single q'

[gpu:vars]
ansible_password = rest of the line
ansible_user=ops
"""


def test_redact_ini_inventory() -> None:
    out = redact_ini(INI_INVENTORY)
    for secret in ("pass with spaces", "single q", "rest of the line"):
        assert secret not in out
    assert 'ansible_become_pass="***"' in out
    assert "ansible_password = ***" in out
    assert "ansible_user=ops" in out and "k3fleet_lspci=true" in out


def test_redact_file_text_by_kind() -> None:
    assert "$ANSIBLE_VAULT;1.1;AES256\n3132" not in redact_file_text("all.yml", "$ANSIBLE_VAULT;1.1;AES256\n3132\n")
    assert "hunter2" not in redact_file_text("hosts", "[all]\nh1 ansible_password=hunter2\n")
    assert "hunter2" not in redact_file_text("hosts", "all:\n  vars:\n    ansible_password: hunter2\n")
    assert "hunter2" not in redact_file_text("notes.txt", "password: hunter2")


def test_copy_inventory_with_group_and_host_vars(tmp_path: Path) -> None:
    inv = tmp_path / "prod"
    (inv / "group_vars" / "gpu").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    gpu-01: {}\n")
    (inv / "group_vars" / "all.yml").write_text("---\nansible_become_pass: 'gv-secret'\n")
    (inv / "group_vars" / "gpu" / "deep.yaml").write_text("a:\n  b:\n    c:\n      api_token: deep-secret\n")
    (inv / "host_vars" / "gpu-01").write_text("ansible_ssh_pass: hv-secret\n")
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    rd.copy_inventory(inv / "hosts.yml")
    copied = {p.relative_to(rd.path).as_posix(): p.read_text() for p in rd.path.rglob("*") if p.is_file()}
    assert {"inputs/inventory.yml", "inputs/group_vars/all.yml", "inputs/group_vars/gpu/deep.yaml",
            "inputs/host_vars/gpu-01"} <= set(copied)
    text = "\n".join(copied.values())
    for secret in ("gv-secret", "deep-secret", "hv-secret"):
        assert secret not in text
    assert "api_token" in copied["inputs/group_vars/gpu/deep.yaml"]


# -- the run directory ---------------------------------------------------------------------------


def test_command_json_redacts_argv_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K3FLEET_API_TOKEN", "do-not-store")
    monkeypatch.setenv("ANSIBLE_BECOME_PASS", "do-not-store-either")
    rd = RunDir.create(tmp_path, "audit", ["k3fleet", "audit", "--token", "t0k"], record={"host_key_checking": True})
    text = (rd.path / "command.json").read_text()
    command = json.loads(text)
    assert command["argv"] == ["k3fleet", "audit", "--token", REDACTED]
    assert command["env"]["K3FLEET_API_TOKEN"] == REDACTED
    assert command["host_key_checking"] is True
    assert "do-not-store" not in text


def test_out_is_refused_when_not_empty_or_a_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("data")
    with pytest.raises(UsageError, match="not empty"):
        RunDir.create(tmp_path, "audit", ["k3fleet"], out=out)
    assert (out / "keep.txt").read_text() == "data"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        RunDir.create(tmp_path, "audit", ["k3fleet"], out=f)
    with pytest.raises(UsageError, match="cannot create"):
        RunDir.create(tmp_path, "audit", ["k3fleet"], out=f / "sub")


def test_create_is_exclusive_under_a_race(tmp_path: Path) -> None:
    """Many runs on one --out at once: exactly one claims it, every other is refused."""
    out = tmp_path / "shared"
    barrier = threading.Barrier(8)
    won: list[RunDir] = []
    refused: list[str] = []

    def claim() -> None:
        barrier.wait()
        try:
            won.append(RunDir.create(tmp_path, "audit", ["k3fleet"], out=out))
        except UsageError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert len(refused) == 7
    assert all("another k3fleet run" in r or "not empty" in r for r in refused)


@pytest.mark.parametrize("host", ["gpu-01", "../../x", "a/b", ".hidden", "..", "100%", "name with space", "é"])
def test_host_file_names_stay_inside_and_map_back(tmp_path: Path, host: str) -> None:
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    name = host_file_name(host)
    assert "/" not in name and not name.startswith(".")
    assert host_from_file_name(name) == host
    p = rd.write_json(RunDir.host_file("facts", host), {"host": host})
    assert p.parent == rd.path / "facts"
    assert list(tmp_path.iterdir()) == [rd.path]


def test_paths_leaving_the_run_dir_are_refused(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    for rel in ("../x.json", "facts/../../x.json", "/etc/x.json"):
        with pytest.raises(UsageError, match="leave the run directory"):
            rd.write_json(rel, {})
    (rd.path / "out").symlink_to(tmp_path)
    with pytest.raises(UsageError, match="leads out"):
        rd.write_json("out/x.json", {})


def test_full_disk_is_one_error_and_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    rd.write_json("verdict.json", {"outcome": "old"})

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(EvidenceWriteError, match="No space left on device"):
        rd.write_json("verdict.json", {"outcome": "new"})
    monkeypatch.undo()
    assert json.loads((rd.path / "verdict.json").read_text()) == {"outcome": "old"}
    assert [p.name for p in rd.path.rglob("*.tmp")] == []
    assert isinstance(EvidenceWriteError("x"), IncompleteError)


def test_journal_append_terminates_a_torn_line(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "upgrade", ["k3fleet"])
    rd.append_jsonl("journal.jsonl", {"host": "h1", "stage": "snapshot"})
    with (rd.path / "journal.jsonl").open("a") as fh:
        fh.write('{"host": "h1", "sta')  # power loss mid-write
    rd.append_jsonl("journal.jsonl", {"host": "h2", "stage": "draining"})
    lines = (RunDir.open(rd.path).path / "journal.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["stage"] == "snapshot"
    assert lines[1] == '{"host": "h1", "sta'
    assert json.loads(lines[2]) == {"host": "h2", "stage": "draining"}


def test_open_rejects_non_run_dir(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a k3fleet run directory"):
        RunDir.open(tmp_path)
    with pytest.raises(UsageError, match="not a directory"):
        RunDir.open(tmp_path / "nope")


def test_run_reader_errors_are_one_line(tmp_path: Path) -> None:
    """The one reader of run directories: a missing file is exit 3 (incomplete), a file that is there
    but is no run file (not JSON, not UTF-8, a list, a directory) exit 2, each one line."""
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    reader = RunReader(rd.path, "r1")
    (rd.path / "verdict.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"^run r1: verdict.json is not valid JSON"):
        reader.json("verdict.json")
    with pytest.raises(IncompleteError, match=r"^run r1: plan.json is missing: the run directory is incomplete$"):
        reader.json("plan.json")
    with pytest.raises(IncompleteError, match=r"plan.jsonl is missing"):
        reader.rows("plan.jsonl")
    (rd.path / "bin.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    with pytest.raises(UsageError, match=r"not UTF-8"):
        reader.json("bin.json")
    (rd.path / "list.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match=r"list.json holds a JSON list, expected an object"):
        reader.object("list.json")
    (rd.path / "dir.json").mkdir()
    with pytest.raises(UsageError, match=r"dir.json is not a run file: Is a directory"):
        reader.json("dir.json")
    assert not hasattr(RunDir, "read_json") and not hasattr(RunDir, "read_object")


# -- manifest and verify -------------------------------------------------------------------------


def _finished(tmp_path: Path) -> RunDir:
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    rd.write_json("facts/h1.json", {"host": "h1"})
    rd.write_json("facts/h2.json", {"host": "h2"})
    rd.write_text("report.md", "# report\n")
    nested = RunDir.create(rd.path, "audit", ["k3fleet"], out=rd.path / "audit")
    nested.write_json("verdict.json", {"outcome": "go_live"})
    nested.write_manifest()
    rd.write_manifest()
    return rd


def test_verify_intact(tmp_path: Path) -> None:
    rd = _finished(tmp_path)
    report = verify_run(rd.path)
    assert report.ok, report.summary()
    assert report.files == 7  # command, 2 facts, report, nested command + verdict + manifest
    report.raise_if_bad()
    manifest = json.loads((rd.path / "manifest.json").read_text())
    assert "audit/manifest.json" in {e["path"] for e in manifest["files"]}


def test_verify_lists_missing_changed_extra(tmp_path: Path) -> None:
    rd = _finished(tmp_path)
    (rd.path / "facts/h1.json").write_text('{"host": "h2"}')
    (rd.path / "facts/h2.json").unlink()
    (rd.path / "facts/h3.json").write_text("{}")
    (rd.path / "audit" / "verdict.json").write_text('{"outcome": "expand_capacity"}')
    report = verify_run(rd.path)
    assert not report.ok
    assert report.changed == ["audit/verdict.json", "facts/h1.json"]
    assert report.missing == ["facts/h2.json"]
    assert report.extra == ["facts/h3.json"]
    with pytest.raises(IncompleteError) as exc:
        report.raise_if_bad()
    line = str(exc.value)
    assert "\n" not in line
    assert "1 missing: facts/h2.json" in line and "2 changed" in line and "1 extra: facts/h3.json" in line


def test_verify_without_or_with_a_broken_manifest(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    report = verify_run(rd.path)
    assert not report.ok and not report.has_manifest
    assert "did not finish" in report.summary()
    (rd.path / "manifest.json").write_text('{"files": [{"path": "../../etc/passwd", "sha256": "0"}]}')
    assert "not a k3fleet manifest" in verify_run(rd.path).summary()
    (rd.path / "manifest.json").write_bytes(b"\xff\xfe")
    assert "cannot be read" in verify_run(rd.path).summary()
    with pytest.raises(UsageError, match="not a k3fleet run directory"):
        verify_run(tmp_path)


def test_problems_name_each_path(tmp_path: Path) -> None:
    rd = _finished(tmp_path)
    assert rd.verify() == []
    (rd.path / "report.md").write_text("tampered")
    (rd.path / "extra.txt").write_text("x")
    assert rd.verify() == ["report.md: changed", "extra.txt: not in the manifest"]


def test_pairs_inside_quoted_values_are_redacted() -> None:
    text = '-e {"k3fleet_operator": "alice token=s3cr3t", "k3fleet_change_id": "CHG-1"}'
    out = redact_text(text)
    assert "s3cr3t" not in out and '"k3fleet_change_id": "CHG-1"' in out and "token=***" in out


# -- shapes found by the attack round: vLLM's own log lines, build records, prose, cut lines -----

_S = "Zq7secretW41ue"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        # vLLM's start-up line: a Python dict repr, quoted keys, list and string values.
        (f"INFO [utils.py:326] non-default args: {{'model': '/m', 'api_key': ['{_S}'], 'hf_token': '{_S}', "
         "'max_tokens': 5}", "'model': '/m', 'api_key': ['***'], 'hf_token': '***', 'max_tokens': 5}"),
        (f"{{'api_key': ['a{_S}', 'b{_S}']}}", "'api_key': ['***', '***']"),
        (f"{{'served_model_name': ['k3'], 'ngc_api_key': \"{_S}\"}}", "'served_model_name': ['k3']"),
        # argv lists as Python and JSON print them.
        (f"['vllm', 'serve', '/m', '--api-key', '{_S}', '--port', '8000']", "'--api-key', '***', '--port'"),
        (f'["--token", "{_S}", "--model", "m"]', '"--token", "***", "--model"'),
        (f"'--api-key={_S}'", "'--api-key=***'"),
        # Prose key phrases.
        (f"api key: {_S}", "api key: ***"),
        (f"the API key {_S} was rejected", "the API key *** was rejected"),
        (f"curl sent bearer token {_S} to the server", "bearer token ***"),
        (f"your access token is {_S}.", "access token is ***"),
        (f"token={_S}", "token=***"),
        # URL user-info, the index-token form too; build records.
        (f"--index-url https://__token__:{_S}@pypi.example/simple", "https://__token__:***@pypi.example/simple"),
        (f"docker build --build-arg HF_TOKEN={_S} --build-arg CUDA=12.9 .", "HF_TOKEN=*** --build-arg CUDA=12.9"),
        (f"docker build --build-arg=NGC_API_KEY={_S} .", "--build-arg=NGC_API_KEY=***"),
        (f"docker run -e SOME_PASSWORD={_S} img", "-e SOME_PASSWORD=***"),
        (f"GIT_CREDENTIALS=https://x:{_S}@git.example", "GIT_CREDENTIALS=https://x:***@git.example"),
        (f"mysqladmin --password {_S} status", "--password *** status"),
        # JSON inside a JSON string (Ansible's output of a module that printed JSON).
        (f'"msg": "{{\\"api_key\\": \\"{_S}\\", \\"n\\": 1}}"', '\\"api_key\\": \\"***\\"'),
        # A line cut inside a quoted value, a key block cut before its END line.
        (f'api_key="{_S}', 'api_key="***'),
        (f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn{_S}", "-----BEGIN OPENSSH PRIVATE KEY-----\n***"),
    ],
)
def test_redact_text_new_shapes(text: str, kept: str) -> None:
    out = redact_text(text)
    assert _S not in out, out
    assert kept in out, out


@pytest.mark.parametrize(
    "text",
    ["the api key is missing", "bearer token expired", "sign with --sign-key KEY", "--api-key $VLLM_API_KEY",
     "(sign with k3fleet decide --sign-key KEY)", "[give --api-key KEY].", "token=<token>;",
     "{'api_key': None, 'max_tokens': 5}", "max_tokens=5 prompt_tokens=3 cached_tokens=0",
     "non-default args: {'model': '/m', 'tensor_parallel_size': 8, 'enable_prefix_caching': True}",
     "--api-key-env OPENAI_API_KEY --max-num-seqs 256", "host_key_checking=False api_key_env=VLLM_API_KEY",
     "a=a=a=a=a", "http://127.0.0.1:8000/v1 and git@github.example:org/repo.git"],
)
def test_redact_text_keeps_new_evidence_words(text: str) -> None:
    assert redact_text(text) == text


def test_deep_chains_do_not_recurse() -> None:
    """``a=a=a=...`` and ``http://a:b`` runs used to recurse once per pair (RecursionError at 1,000)."""
    for unit in ("a=", "a:", "http://a:b", "'a': '"):
        line = unit * 20_000
        assert redact_text(line).count("***") == 0
    assert redact_text("token=" * 5000 + _S).count(_S) == 0


def test_a_remembered_secret_is_masked_in_any_shape() -> None:
    from k3fleet.evidence.redact import forget_secrets, remember_secret

    try:
        remember_secret(_S)
        remember_secret("ab")  # too short to be told apart from text: ignored
        assert redact_text(f"server said: unknown caller {_S}!") == "server said: unknown caller ***!"
        assert redact({"detail": [f"x{_S}y"]}) == {"detail": ["x***y"]}
        assert redact_text("ab cd") == "ab cd"
    finally:
        forget_secrets()
    assert redact_text(f"unknown caller {_S}") == f"unknown caller {_S}"


def test_a_secret_remembered_after_a_text_was_redacted_is_masked_in_it_next_time() -> None:
    """Short texts' results are kept (facts repeat them across hosts); learning a secret forgets them."""
    from k3fleet.evidence.redact import forget_secrets, remember_secret

    text, long_text = f"unknown caller {_S}", f"unknown caller {_S} " + "x" * 400
    assert (redact_text(text), redact_text(long_text)) == (text, long_text)
    try:
        remember_secret(_S)
        assert redact_text(text) == "unknown caller ***"
        assert redact_text(long_text).startswith("unknown caller *** x")
    finally:
        forget_secrets()
    assert (redact_text(text), redact_text(long_text)) == (text, long_text)


def test_environment_secrets_are_remembered_by_value() -> None:
    from k3fleet.evidence.redact import forget_secrets, remember_environment_secrets

    try:
        remember_environment_secrets({"HF_TOKEN": _S, "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1", "PATH": "/usr/bin",
                                      "SOME_PASSWORD": "short"})
        assert redact_text(f"echo {_S}") == "echo ***"
        assert redact_text("/tmp/ssh-x/agent.1 short") == "/tmp/ssh-x/agent.1 short"
    finally:
        forget_secrets()


def test_excerpts_are_redacted_before_they_are_cut() -> None:
    from k3fleet.evidence.redact import excerpt

    key = "sk-" + "E" * 40
    text = f"auth=xyz {key} and more"
    for limit in (12, 16, 20, 30):
        cut = excerpt(text, limit)
        assert "sk-E" not in cut and len(cut) <= limit, cut
    assert excerpt("a\n  b", 10) == "a b" and excerpt("a\n  b", 10, one_line=False) == "a\n  b"
    assert excerpt("x" * 50, 10) == "x" * 7 + "..." and excerpt("x" * 50, 10, tail="") == "x" * 10


@pytest.mark.parametrize(("name", "value", "kept"), [
    ("ssh_key", "/work/x/.testbed/ssh/id_ed25519", True),
    ("sign-key", "~/.ssh/k3fleet_evidence", True),
    ("tls_client_key", "./certs/client.key", True),
    ("api_key", "/etc/k3/api", False),
    ("NGC_API_KEY", "/a/b", False),
    ("access_key", "/a/b", False),
    ("ssh_key", "/one", False),                      # a single part: could be anything
    ("ssh_key", "/x+y/z==", False),                  # base64 shape
    ("sign_key", "-----BEGIN OPENSSH PRIVATE KEY-----", False),
    ("token", "/a/b", False),                        # not a key file name
])
def test_a_key_files_path_is_evidence_not_a_secret(name: str, value: str, kept: bool) -> None:
    out = redact({name: value})[name]
    assert (out == value) is kept, out
    argv = redact_argv(["cmd", f"--{name}", value])
    assert (argv[2] == value) is kept, argv
    if "/" in value:  # (a PEM header keeps its BEGIN line in text by design)
        for text in (f'"{name}": "{value}"', f"--{name} {value}", f"{name}={value}"):
            assert (value in redact_text(text)) is kept, redact_text(text)


@pytest.mark.parametrize(("text", "secret", "kept"), [
    # Kubernetes' env list in group_vars, block form: the name decides for the value.
    ("k3fleet_env:\n  - name: HF_TOKEN\n    value: hf_canary_one_2b7f\n  - name: LOG_LEVEL\n    value: debug\n",
     "hf_canary_one_2b7f", "value: debug"),
    ("env:\n- name: VLLM_API_KEY\n  value: 'canary-two-9d1e'\n", "canary-two-9d1e", "name: VLLM_API_KEY"),
    # Flow form, and the same list as JSON.
    ("env: [{name: HF_TOKEN, value: canary-three-4c2a}, {name: PORT, value: \"8000\"}]", "canary-three-4c2a",
     'value: "8000"'),
    ('[{"name": "NGC_API_KEY", "value": "canary-four-7e3b"}]', "canary-four-7e3b", '"name": "NGC_API_KEY"'),
    ("- key: AWS_SECRET_ACCESS_KEY\n  value: canary-five-1f0d\n", "canary-five-1f0d", "key: AWS_SECRET_ACCESS_KEY"),
])
def test_name_value_pairs_in_text_are_masked_by_the_name(text: str, secret: str, kept: str) -> None:
    """A group_vars file is copied into a run as text: an env list in list form kept its token unmasked."""
    out = redact_text(text)
    assert secret not in out and kept in out, out


def test_a_plain_name_value_pair_stays() -> None:
    text = "env:\n  - name: LOG_LEVEL\n    value: debug\n  - name: PORT\n    value: '8000'\n"
    assert redact_text(text) == text


# -- writing what was read (a merge's facts) --------------------------------------------------

# A host's facts as the audit writes them (tests/fixtures/verdict: the synthetic fleet's R575 host).
_FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "verdict" / "host_r575_h200_hgx.json"


def _read_back(tmp_path: Path, raw: bytes) -> bytes:
    rd = RunDir.create(tmp_path, "merge", ["k3fleet", "merge"], out=tmp_path / "run")
    rd.write_json("facts/h.json", json.loads(raw), durable=False, read_as=raw)
    rd.write_manifest()
    assert verify_run(rd.path).ok
    return (rd.path / "facts" / "h.json").read_bytes()


def test_facts_the_redactor_leaves_as_they_are_are_written_as_read(tmp_path: Path) -> None:
    data = json.loads(_FACTS.read_text())
    raw = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()
    assert redact(data) == data
    assert _read_back(tmp_path, raw) == raw


def test_facts_with_a_secret_are_written_redacted_not_as_read(tmp_path: Path) -> None:
    data = json.loads(_FACTS.read_text())
    data["env"] = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789"}
    raw = (json.dumps(data, indent=2) + "\n").encode()
    written = _read_back(tmp_path, raw)
    assert b"hf_abcdefghijklmnopqrstuvwxyz" not in written
    assert json.loads(written)["env"] == {"HF_TOKEN": REDACTED}


def test_text_that_says_more_than_its_parse_is_never_copied(tmp_path: Path) -> None:
    # A key given twice: the parse keeps the last value, the text still holds the first (a token).
    raw = b'{\n  "host": "h",\n  "note": "sk-proj-abcdefghijklmnopqrstuvwxyz0123",\n  "note": "fine"\n}\n'
    written = _read_back(tmp_path, raw)
    assert b"sk-proj" not in written
    assert written == b'{\n  "host": "h",\n  "note": "fine"\n}\n'


def test_text_in_another_layout_is_written_in_the_run_directory_s_layout(tmp_path: Path) -> None:
    raw = b'{"host":"h",  "gpus": [1, 2]}'
    assert _read_back(tmp_path, raw) == b'{\n  "host": "h",\n  "gpus": [\n    1,\n    2\n  ]\n}\n'
