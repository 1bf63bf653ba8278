"""``k3fleet triage FILE...``: raw text pasted from nodes and gateways, judged like the audit judges a node.

Each file's kind is sniffed from its content (:data:`KINDS`); the text goes through the collectors'
own parse functions (via the thin adapters in :mod:`k3fleet.triage.adapters`) into host facts of the
audit's schema, and the audit's verdict rules (:func:`k3fleet.verdict.evaluate_host`) judge them.
A rule is kept only where the captures hold the facts it reads (:data:`COVERS`): nothing is
judged from text that was not given. vLLM start-up logs go through ``accept startup``'s analyser,
``/metrics`` pages through the acceptance metrics reader. Everything found is operator-supplied
evidence and is marked so when it enters ``decide`` (docs/decision.md "Triage").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.errors import UsageError, read_input
from k3fleet.triage import adapters as ad

NOT_CAPTURED = "not in the captured text"

KINDS: dict[str, str] = {
    "nvidia_smi": "plain `nvidia-smi` table",
    "nvidia_smi_q": "`nvidia-smi -q`",
    "nvidia_smi_failure": "`nvidia-smi` failure (NVML init, no driver)",
    "proc_driver_version": "/proc/driver/nvidia/version",
    "fabricmanager_status": "`systemctl status` / `systemctl show` / journal of nvidia-fabricmanager",
    "fabricmanager_version": "`nv-fabricmanager --version`",
    "ibstat": "`ibstat`",
    "ibv_devinfo": "`ibv_devinfo`",
    "docker_inspect": "`docker inspect` / `podman inspect` (image or container)",
    "container_error": "container start error (nvidia-container-cli, CUDA driver too old)",
    "vllm_startup": "vLLM start-up log",
    "metrics": "`/metrics` text (Prometheus or OpenMetrics)",
}

# Audit checks judged from each kind of capture: only these rules' findings are kept.
_DRIVER = frozenset({"driver.loaded", "driver.branch", "driver.version_min", "container.cuda_runtime"})
COVERS: dict[str, frozenset[str]] = {
    "proc_driver_version": _DRIVER | {"driver.flavour"},
    "nvidia_smi": _DRIVER | {"gpu.count", "gpu.persistence_mode"},
    "nvidia_smi_q": _DRIVER | {"gpu.count", "gpu.persistence_mode", "gpu.fabric_state"},
    "nvidia_smi_failure": frozenset({"nvml.status", "driver.pending_reboot"}),
    "fabricmanager_status": frozenset({"fabricmanager.active"}),
    "fabricmanager_version": frozenset({"fabricmanager.version_match"}),
    "ibstat": frozenset({"rdma.port_state", "rdma.rail_count"}),
    "ibv_devinfo": frozenset({"rdma.port_state", "rdma.rail_count"}),
    "docker_inspect": frozenset({"container.image_present", "container.vllm_version", "container.cuda_runtime"}),
    "container_error": frozenset({"container.probe"}),
}
# A check that compares two captures needs both.
_NEEDS: dict[str, tuple[frozenset[str], ...]] = {
    "container.cuda_runtime": (frozenset({"proc_driver_version", "nvidia_smi", "nvidia_smi_q"}),),
    "fabricmanager.version_match": (frozenset({"proc_driver_version", "nvidia_smi", "nvidia_smi_q"}),),
}

# vLLM's own log lines ("(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226]",
# "INFO 12-30 17:06:52 [api_server.py:1351]"), its banners, a compose service named vllm, a vllm traceback.
_VLLM_LOG = re.compile(r"vLLM API server version|\((?:APIServer|VllmWorkerProcess|EngineCore\w*|Worker\w*) pid=\d+\)|"
                       r"Initializing an? (?:V\d )?LLM engine|non-default args|"
                       r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w.]+\.py:\d+\]|"
                       r"^vllm[-_]\d+\s+\||/site-packages/vllm/|/dist-packages/vllm/|\bvllm\._C\b", re.M)


def sniff(text: str) -> str | None:
    """The kind of a capture, from its content; None when it is none of :data:`KINDS`."""
    head = text.lstrip()
    if head.startswith(("[", "{")):
        try:
            data = json.loads(head)
        except ValueError:
            data = None
        item = data[0] if isinstance(data, list) and data else data
        if isinstance(item, dict) and ("Config" in item or "RepoTags" in item or "Id" in item):
            return "docker_inspect"
    if re.search(r"^NVRM version:", head, re.M):
        return "proc_driver_version"
    if "==============NVSMI LOG" in text or re.search(r"^Attached GPUs\s*:", text, re.M):
        return "nvidia_smi_q"
    if re.search(r"NVIDIA-SMI\s+\S+\s+(?:Driver|KMD) Version:", text):
        return "nvidia_smi"
    if re.search(r"NVIDIA-SMI has failed|Failed to initialize NVML|couldn.t communicate with the NVIDIA driver", text):
        return "nvidia_smi_failure"
    if re.search(r"^\s*CA '[^']+'", text, re.M):
        return "ibstat"
    if re.search(r"^\s*hca_id:", text, re.M):
        return "ibv_devinfo"
    if re.search(r"Fabric Manager version is\s*:", text):
        return "fabricmanager_version"
    if re.search(r"nvidia-fabricmanager|nv-fabricmanager", text) and re.search(
            r"Active:|ActiveState=|systemd\[\d+\]|nv-fabricmanager\[\d+\]|fabricmanager-start\.sh", text):
        return "fabricmanager_status"
    if re.search(r"^# (?:TYPE|HELP) \S+|^vllm:[a-z_]+", text, re.M):
        return "metrics"
    if _VLLM_LOG.search(text):
        return "vllm_startup"
    from k3fleet.ansible.module_utils.k3fleet_container import classify_probe_failure

    if classify_probe_failure(text)[0] is not None:
        return "container_error"
    return None


@dataclass
class Capture:
    path: Path
    name: str
    kind: str
    text: str
    sha256: str


@dataclass
class TriageResult:
    host: str
    captures: list[Capture]
    facts: dict[str, Any]
    findings: list[dict[str, Any]] = field(default_factory=list)
    startup: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None

    @property
    def kinds(self) -> list[str]:
        return sorted({c.kind for c in self.captures})

    @property
    def exit_code(self) -> int:
        blocking = any(f["kind"] == "fail" and f["severity"] in ("critical", "error", "fail") for f in self.findings)
        return 1 if blocking else 0

    def to_json(self) -> dict[str, Any]:
        drv = self.facts.get("driver") or {}
        km = drv.get("kernel_module") or {}
        image = (self.facts.get("container") or {}).get("image") or {}
        return {
            "schema_version": "1.0", "host": self.host, "operator_supplied": True, "kinds": self.kinds,
            "files": [{"name": c.name, "kind": c.kind, "original_sha256": c.sha256, "bytes": len(c.text.encode()),
                       "stored": stored_name(i, c)} for i, c in enumerate(self.captures)],
            "driver_version": km.get("version") or drv.get("driver_version"),
            "image_digest": image.get("digest") if isinstance(image, dict) else None,
            "findings": self.findings, "startup": self.startup, "metrics": self.metrics, "facts": self.facts,
            "exit_code": self.exit_code,
        }


def stored_name(i: int, c: Capture) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", c.name)[:80] or "capture"
    return f"inputs/{i + 1:02d}-{safe}"


def read_capture(path: Path, kind: str | None = None) -> Capture:
    raw = read_input(path, "", kind="a pasted capture", limit="capture", text=True)
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n")
    if not text.strip():
        raise UsageError(f"{path} is empty")
    found = kind or sniff(text)
    if found is None:
        raise UsageError(f"cannot tell what {path} is: none of {', '.join(KINDS)} (give --kind)")
    if found not in KINDS:
        raise UsageError(f"--kind {found!r}: choose one of {', '.join(KINDS)}")
    return Capture(path=path, name=path.name, kind=found, text=text, sha256=hashlib.sha256(raw).hexdigest())


def _not_captured() -> dict[str, Any]:
    return {"status": "unknown", "reason": NOT_CAPTURED}


def build_facts(host: str, captures: Sequence[Capture]) -> dict[str, Any]:
    """Host facts of the audit's schema from the captures; every section not captured says so."""
    from k3fleet.models.facts import SCHEMA_VERSION

    facts: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "host": host}
    for section in ("driver", "packages", "fabricmanager", "rdma", "nccl", "container", "scheduler"):
        facts[section] = _not_captured()
    drv: dict[str, Any] = {"status": "unknown", "reason": NOT_CAPTURED, "nvml": {"status": "skipped", "error": None}}
    fm: dict[str, Any] | None = None
    devices: list[dict[str, Any]] = []
    container: dict[str, Any] | None = None
    for c in captures:
        try:
            if c.kind == "proc_driver_version":
                drv["kernel_module"] = ad.kernel_module_from_proc(c.text)
                drv.setdefault("driver_version", drv["kernel_module"]["version"])
                if drv["status"] != "ok":
                    drv["status"] = "ok"
            elif c.kind in ("nvidia_smi", "nvidia_smi_q"):
                got = ad.driver_from_smi_table(c.text) if c.kind == "nvidia_smi" else ad.driver_from_smi_q(c.text)
                km = drv.get("kernel_module")
                drv.update(got)
                drv["reason"] = got.get("reason") or NOT_CAPTURED
                if km:
                    drv["kernel_module"] = km
            elif c.kind == "nvidia_smi_failure":
                drv.update(ad.driver_from_smi_failure(c.text))
            elif c.kind in ("fabricmanager_status", "fabricmanager_version"):
                fm = fm or {"status": "ok", "reason": NOT_CAPTURED, "required": True, "nvswitch_present": None,
                            "unit": {"installed": None, "active": None, "enabled": None}}
                if c.kind == "fabricmanager_status":
                    fm["unit"] = ad.fabricmanager_unit(c.text)
                else:
                    fm["version"] = ad.fabricmanager_version(c.text)
            elif c.kind in ("ibstat", "ibv_devinfo"):
                devices += ad.rdma_from_ibstat(c.text) if c.kind == "ibstat" else ad.rdma_from_ibv_devinfo(c.text)
            elif c.kind == "docker_inspect":
                container = container or {"status": "ok", "reason": NOT_CAPTURED}
                container["image"] = ad.image_from_inspect(c.text)
            elif c.kind == "container_error":
                container = container or {"status": "ok", "reason": NOT_CAPTURED}
                container["probe"] = ad.probe_from_error(c.text)
                # The error comes from a runtime that tried to start an image: the probe rule judges
                # only then (image and runtime themselves are not judged from this text).
                container.setdefault("runtime", {"name": ad.runtime_named_in(c.text), "version": None})
                container.setdefault("image", {"ref": ad.image_named_in(c.text), "present": True})
        except ad.CaptureError as exc:
            raise UsageError(f"{c.path}: read as {KINDS[c.kind]} but {exc}") from exc
    facts["driver"] = drv
    if fm is not None:
        version = (drv.get("kernel_module") or {}).get("version") or drv.get("driver_version")
        if fm.get("version") and version:
            from k3fleet.ansible.module_utils.k3fleet_fabricmanager import versions_match

            fm["driver_version"] = version
            fm["version_matches_driver"] = versions_match(fm["version"], version)
        facts["fabricmanager"] = fm
    if devices:
        facts["rdma"] = {"status": "ok", "reason": NOT_CAPTURED, "devices": devices,
                         "active_ports": sum(1 for d in devices for p in d["ports"] if p.get("state_code") == 4)}
    if container is not None:
        facts["container"] = container
    return facts


def covered(kinds: set[str]) -> set[str]:
    out: set[str] = set()
    for k in kinds:
        out |= COVERS.get(k, frozenset())
    for check, needs in _NEEDS.items():
        # A comparison (the image's CUDA against the host driver) needs both sides captured.
        if check in out and not all(kinds & need for need in needs):
            out.discard(check)
    return out


def _file_of(check: str, captures: Sequence[Capture]) -> str:
    for i, c in enumerate(captures):
        if check in COVERS.get(c.kind, frozenset()):
            return stored_name(i, c)
    return "triage.json"


def triage(paths: Sequence[Path], *, host: str = "capture", target: Any = None,
           kinds: Sequence[str | None] = ()) -> TriageResult:
    """Read, sniff and judge every capture as one host's evidence (pure but for reading the files)."""
    from k3fleet.models.facts import HostFacts
    from k3fleet.targets import load_target
    from k3fleet.verdict import evaluate_host

    if not paths:
        raise UsageError("give at least one captured file")
    tgt = target if target is not None else load_target(None)
    forced = list(kinds) + [None] * (len(paths) - len(kinds))
    captures = [read_capture(p, k) for p, k in zip(paths, forced, strict=True)]
    facts = build_facts(host, captures)
    result = TriageResult(host=host, captures=captures, facts=facts)
    kinds_seen = {c.kind for c in captures}
    keep = covered(kinds_seen)
    if keep:
        for f in evaluate_host(HostFacts.model_validate(facts), tgt):
            if f.check_id not in keep:
                continue
            if f.kind == "unknown" and NOT_CAPTURED in (f.message or ""):
                continue
            result.findings.append({"id": f.check_id, "severity": f.severity, "kind": f.kind, "host": host,
                                    "message": f.message, "chain": f.chain, "layer": None, "fix": f.fix,
                                    "file": _file_of(f.check_id, captures)})
    for i, c in enumerate(captures):
        if c.kind == "vllm_startup":
            _startup_into(result, c, stored_name(i, c), tgt)
        elif c.kind == "metrics":
            _metrics_into(result, c, stored_name(i, c), tgt)
    return result


def _startup_into(result: TriageResult, c: Capture, stored: str, target: Any) -> None:
    from k3fleet.accept.startup import analyse_startup

    probe = analyse_startup(c.text, None, target=target, source=str(c.path))
    result.startup = probe.model_dump(mode="json")
    for f in probe.findings:
        result.findings.append({"id": f.id, "severity": f.severity, "kind": "fail" if f.severity == "fail" else "note",
                                "host": result.host, "message": f.message, "chain": False, "layer": f.layer,
                                "fix": None, "file": stored})


def _metrics_into(result: TriageResult, c: Capture, stored: str, target: Any) -> None:
    from k3fleet.accept.metrics import MetricsError, parse_metrics

    try:
        snap = parse_metrics(c.text, None)
    except MetricsError as exc:
        raise UsageError(f"{c.path}: read as /metrics text but {exc}") from exc
    summary = snap.summary()
    result.metrics = {"has_vllm": snap.has_vllm, "old_names": snap.old_names(), "old_server": snap.is_old_server,
                      "cache_config": snap.cache_config(), "prefix_caching_enabled": snap.prefix_caching_enabled(),
                      "summary": summary}

    def add(fid: str, severity: str, message: str, layer: str | None) -> None:
        result.findings.append({"id": f"accept.metrics.{fid}", "severity": severity,
                                "kind": "fail" if severity == "fail" else "note", "host": result.host,
                                "message": message, "chain": False, "layer": layer, "fix": None, "file": stored})

    if not snap.has_vllm:
        add("not_vllm", "warn", "the page has no vllm: metrics: not a vLLM server's /metrics", "http")
        return
    if snap.is_old_server:
        add("old_server", "warn", f"only removed metric names ({', '.join(snap.old_names())}): a server older than "
                                  "vLLM 0.12, its cache counters cannot be read as current ones", "config")
    enabled = snap.prefix_caching_enabled()
    if enabled is False and "--enable-prefix-caching" in target.serve.required_flags:
        add("prefix_caching_off", "fail", "vllm:cache_config_info says enable_prefix_caching=False; Kimi K3 needs "
                                          "--enable-prefix-caching", "config")
    if summary.get("preemptions"):
        add("preemptions", "info", f"{summary['preemptions']:g} preemptions since start: the KV cache ran full",
            "traffic")


def write_run(result: TriageResult, argv: Sequence[str], *, runs_dir: Path, out: Path | None) -> Any:
    """The triage run directory (kind ``triage``): every capture (through the redactor), triage.json,
    report.md and the manifest. It enters ``decide`` as operator-supplied evidence."""
    from k3fleet.evidence import RunDir
    from k3fleet.report.decision_md import render_markdown
    from k3fleet.report.view import load_view

    rd = RunDir.create(runs_dir, "triage", argv, out=out, record={"operator_supplied": True})
    for i, c in enumerate(result.captures):
        rd.write_text(stored_name(i, c), c.text)
    rd.write_json("triage.json", result.to_json())
    rd.write_manifest()
    # The report is rendered from the verified run itself, as `k3fleet report` would.
    text = render_markdown(load_view(rd.path))
    rd.write_text("report.md", text)
    rd.write_manifest()
    return rd
