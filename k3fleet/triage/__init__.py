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

import ast
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_fabricmanager import versions_match
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_probe import classify_probe_failure
from k3fleet.accept.result import finding
from k3fleet.accept.startup import analyse_startup
from k3fleet.bounds import cap_bytes, limit_hint, loads_json, parse_json, read_input
from k3fleet.contracts import Severity, result_code
from k3fleet.errors import UsageError
from k3fleet.evidence import RunDir, layout
from k3fleet.evidence.reader import open_run
from k3fleet.models.evidence import TriageFile, TriageRecord, parse_triage_record
from k3fleet.models.facts import SCHEMA_VERSION, HostFacts
from k3fleet.models.findings import Finding
from k3fleet.models.target import Target
from k3fleet.report.decision_md import render_markdown
from k3fleet.report.view import triage_view, with_run
from k3fleet.targets import load_target
from k3fleet.triage import adapters as ad
from k3fleet.verdict import evaluate_host
from k3fleet.verdict.foreign import ForeignError, foreign_findings, sniff_foreign

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
    "kernel_log": "kernel log (`dmesg`, `journalctl -k`, syslog) with NVRM Xid lines",
    "chat_completion": "a chat-completion response (JSON, an SSE stream of chunks, or the OpenAI SDK's "
                       "`ChatCompletion(...)` repr)",
    "gpud_states": "gpud's health states (`GET /v1/states` JSON)",
    "gpud_events": "gpud's events (`GET /v1/events` JSON)",
    "dcgm_health": "`dcgmi health -c -j`",
}
# Other tools' verdicts, taken in as findings under the audit's check ids (k3fleet.verdict.foreign).
FOREIGN = frozenset({"gpud_states", "gpud_events", "dcgm_health"})

# Audit checks judged from each kind of capture: only these rules' findings are kept.
_DRIVER = frozenset({"driver.loaded", "driver.branch", "driver.version_min", "driver.platform",
                     "container.cuda_runtime"})
_HEALTH_Q = frozenset({"gpu.in_use", "gpu.ecc", "gpu.remapped_rows", "gpu.throttle", "gpu.pcie_link"})
COVERS: dict[str, frozenset[str]] = {
    "proc_driver_version": _DRIVER | {"driver.flavour"},
    # The plain table shows memory in use, the process table and the volatile uncorrectable ECC count.
    "nvidia_smi": _DRIVER | {"gpu.count", "gpu.persistence_mode", "gpu.in_use", "gpu.ecc"},
    "nvidia_smi_q": _DRIVER | _HEALTH_Q | {"gpu.count", "gpu.persistence_mode", "gpu.fabric_state"},
    "nvidia_smi_failure": frozenset({"nvml.status", "driver.pending_reboot"}),
    "kernel_log": frozenset({"gpu.xid", "gpu.xid_application"}),
    # version_match only where the text names both versions (Fabric Manager's refusal), else it needs a
    # driver capture beside it (_NEEDS).
    "fabricmanager_status": frozenset({"fabricmanager.active", "fabricmanager.version_match"}),
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
            data = loads_json(head)
        except ValueError:
            data = None
        item = data[0] if isinstance(data, list) and data else data
        if isinstance(item, dict) and ("Config" in item or "RepoTags" in item or "Id" in item):
            return "docker_inspect"
        foreign = sniff_foreign(data)
        if foreign is not None:
            return foreign
    if head.startswith("ChatCompletion(") or _is_chat_json(head) or _is_chat_stream(head):
        return "chat_completion"
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
    if _FABRIC_MANAGER.search(text) and ad.FM_VERSION_MISMATCH.search(" ".join(text.split())):
        # Fabric Manager's own refusal, pasted with or without its journal prefix.
        return "fabricmanager_status"
    if re.search(r"nvidia-fabricmanager|nv-fabricmanager", text) and re.search(
            r"Active:|ActiveState=|systemd\[\d+\]|nv-fabricmanager\[\d+\]|fabricmanager-start\.sh", text):
        return "fabricmanager_status"
    if re.search(r"^# (?:TYPE|HELP) \S+|^vllm:[a-z_]+", text, re.M):
        return "metrics"
    if re.search(r"NVRM: Xid \(|NVRM: The NVIDIA GPU \S+\s*$", text, re.M):
        return "kernel_log"
    if _VLLM_LOG.search(text):
        return "vllm_startup"

    if classify_probe_failure(text)[0] is not None:
        return "container_error"
    return None


# Fabric Manager's refusal may be wrapped across lines: the whitespace-folded copy is made only for a text
# that names it (a 50 MB log folded word by word held ten times its size).
_FABRIC_MANAGER = re.compile(r"fabric\s+manager", re.I)


def _is_chat_json(head: str) -> bool:
    if not head.startswith("{"):
        return False
    try:
        data = loads_json(head)
    except ValueError:
        # A body cut mid-JSON is still a chat completion to judge (and the cut is the finding).
        return bool(re.search(r'"object"\s*:\s*"chat\.completion"|"choices"\s*:\s*\[', head[:4000]))
    return isinstance(data, dict) and isinstance(data.get("choices"), list)


_SSE_DATA = re.compile(r"^data:\s?(.*)$", re.M)


def _is_chat_stream(head: str) -> bool:
    """Server-sent events of ``chat.completion.chunk`` objects (``data: {...}`` lines)."""
    return head.startswith("data:") and ("chat.completion.chunk" in head[:4000] or '"delta"' in head[:4000])


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
    findings: list[Finding] = field(default_factory=list)
    startup: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    chat: dict[str, Any] | None = None

    @property
    def kinds(self) -> list[str]:
        return sorted({c.kind for c in self.captures})

    @property
    def exit_code(self) -> int:
        return result_code(failed=any(f.failed for f in self.findings))

    def record(self) -> TriageRecord:
        """triage.json, as the model its readers validate it with."""
        drv = self.facts.get("driver") or {}
        km = drv.get("kernel_module") or {}
        image = (self.facts.get("container") or {}).get("image") or {}
        return TriageRecord(
            host=self.host, kinds=self.kinds,
            files=[TriageFile(name=c.name, kind=c.kind, original_sha256=c.sha256, bytes=utf8_len(c.text),
                              stored=stored_name(i, c)) for i, c in enumerate(self.captures)],
            driver_version=km.get("version") or drv.get("driver_version"),
            image_digest=image.get("digest") if isinstance(image, dict) else None,
            findings=self.findings, startup=self.startup, metrics=self.metrics, chat=self.chat, facts=self.facts,
            exit_code=self.exit_code)

    def to_json(self) -> dict[str, Any]:
        return self.record().model_dump(mode="json")


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8, without a second copy of a long one."""
    if text.isascii():
        return len(text)
    return sum(len(text[i:i + (1 << 20)].encode("utf-8", "surrogatepass")) for i in range(0, len(text), 1 << 20))


def stored_name(i: int, c: Capture) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", c.name)[:80] or "capture"
    return f"{layout.INPUTS}/{i + 1:02d}-{safe}"


STDIN = Path("-")


def _read_stdin() -> bytes:
    """Standard input, bounded like a file (the capture cap): one line and exit 2 past it, or for binary data."""
    cap = cap_bytes("capture")

    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise UsageError("standard input is not readable")
    try:
        data = stream.read(cap + 1)
    except OSError as exc:
        raise UsageError(f"cannot read standard input: {exc.strerror or exc}") from exc
    if len(data) > cap:
        raise UsageError(f"standard input is over {cap} bytes: too large for a pasted capture "
                         f"({limit_hint('capture')})")
    if b"\x00" in data[:8192]:
        raise UsageError("standard input is binary, not a pasted capture")
    return data


def read_capture(path: Path, kind: str | None = None) -> Capture:
    raw = _read_stdin() if path == STDIN else read_input(path, "", kind="a pasted capture", limit="capture",
                                                          text=True)
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n")
    shown = "standard input" if path == STDIN else str(path)
    if not text.strip():
        raise UsageError(f"{shown} is empty")
    found = kind or sniff(text)
    if found is None:
        raise UsageError(f"cannot tell what {shown} is: none of {', '.join(KINDS)} (give --kind)")
    if found not in KINDS:
        raise UsageError(f"--kind {found!r}: choose one of {', '.join(KINDS)}")
    return Capture(path=path, name="stdin" if path == STDIN else path.name, kind=found, text=text,
                   sha256=hashlib.sha256(raw).hexdigest())


def _not_captured() -> dict[str, Any]:
    return {"status": "unknown", "reason": NOT_CAPTURED}


def build_facts(host: str, captures: Sequence[Capture]) -> dict[str, Any]:
    """Host facts of the audit's schema from the captures; every section not captured says so."""
    facts: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "host": host}
    for section in ("driver", "packages", "fabricmanager", "imex", "rdma", "nccl", "container", "scheduler"):
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
            elif c.kind == "kernel_log":
                drv["kernel_log"] = ad.kernel_log_from_text(c.text)
            elif c.kind in ("fabricmanager_status", "fabricmanager_version"):
                fm = fm or {"status": "ok", "reason": NOT_CAPTURED, "required": True, "nvswitch_present": None,
                            "unit": {"installed": None, "active": None, "enabled": None}}
                if c.kind == "fabricmanager_status":
                    fm["unit"] = ad.fabricmanager_unit(c.text)
                    named = ad.fabricmanager_mismatch(c.text)
                    if named is not None:
                        # The refusal names both versions: the comparison needs no driver capture.
                        fm["version"], fm["driver_version"] = named
                        fm["version_matches_driver"] = False
                        fm["version_named_in_text"] = True
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
        if fm.get("version") and version and not fm.get("version_named_in_text"):
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
    return layout.TRIAGE


def triage(paths: Sequence[Path], *, host: str = "capture", target: Target | Path | None = None,
           kinds: Sequence[str | None] = ()) -> TriageResult:
    """Read, sniff and judge every capture as one host's evidence (pure but for reading the files)."""
    if not paths:
        raise UsageError("give at least one captured file")
    # The run's target as given, or loaded from the file given (none: the packaged default).
    tgt = target if isinstance(target, Target) else load_target(target)
    forced = list(kinds) + [None] * (len(paths) - len(kinds))
    captures = [read_capture(p, k) for p, k in zip(paths, forced, strict=True)]
    facts = build_facts(host, captures)
    result = TriageResult(host=host, captures=captures, facts=facts)
    kinds_seen = {c.kind for c in captures}
    keep = covered(kinds_seen)
    if (facts.get("fabricmanager") or {}).get("version_named_in_text"):
        keep.add("fabricmanager.version_match")
    if keep:
        for f in evaluate_host(HostFacts.model_validate(facts), tgt):
            if f.check_id not in keep:
                continue
            if f.kind == "unknown" and NOT_CAPTURED in (f.message or ""):
                continue
            # The capture it was judged from stands for the rule's evidence.
            result.findings.append(f.model_copy(update={"host": host,
                                                        "evidence": {"file": _file_of(f.check_id, captures)}}))
    for i, c in enumerate(captures):
        if c.kind in FOREIGN:
            _foreign_into(result, c, stored_name(i, c), tgt)
        elif c.kind == "vllm_startup":
            _startup_into(result, c, stored_name(i, c), tgt)
        elif c.kind == "metrics":
            _metrics_into(result, c, stored_name(i, c), tgt)
        elif c.kind == "chat_completion":
            _chat_into(result, c, stored_name(i, c))
    return result


def _foreign_into(result: TriageResult, c: Capture, stored: str, target: Target) -> None:
    """gpud's states or events, or DCGM's health report: their findings under the audit's check ids."""
    data = parse_json(c.text.encode("utf-8"), str(c.path))
    try:
        found = foreign_findings(c.kind, data, result.host, target)
    except ForeignError as exc:
        raise UsageError(f"{c.path}: read as {KINDS[c.kind]} but {exc}") from exc
    for f in found:
        result.findings.append(f.model_copy(update={"evidence": {**f.evidence, "file": stored}}))


def _startup_into(result: TriageResult, c: Capture, stored: str, target: Target) -> None:
    probe = analyse_startup(c.text, None, target=target, source=str(c.path))
    result.startup = probe.model_dump(mode="json")
    for f in probe.findings:
        result.findings.append(f.model_copy(update={"host": result.host, "evidence": {"file": stored}}))


def _accept_finding(result: TriageResult, check_id: str, severity: Severity, message: str, layer: str | None,
                    stored: str) -> None:
    """An acceptance probe's finding about the capture stored as ``stored``."""
    result.findings.append(finding(check_id, severity, message, layer=layer).model_copy(
        update={"host": result.host, "evidence": {"file": stored}}))


def _metrics_into(result: TriageResult, c: Capture, stored: str, target: Target) -> None:
    # lazy: the metrics reader brings prometheus_client and httpx; only a /metrics capture needs them,
    # and decide and report read triage records through this package
    from k3fleet.accept.metrics import REMOVED_NAMES, MetricsError, parse_metrics

    text, cut = c.text, None
    try:
        snap = parse_metrics(text, None)
    except MetricsError as exc:
        # A pasted excerpt ends where the copy stopped: a last line cut mid-way is dropped and said,
        # the rest of the page is read.
        lines = text.rstrip("\n").split("\n")
        try:
            retry = parse_metrics("\n".join(lines[:-1]) + "\n", None) if len(lines) > 1 else None
        except MetricsError:
            retry = None
        if retry is None:
            raise UsageError(f"{c.path}: read as /metrics text but {exc}") from exc
        snap, cut = retry, lines[-1]
    summary = snap.summary()
    result.metrics = {"has_vllm": snap.has_vllm, "old_names": snap.old_names(), "old_server": snap.is_old_server,
                      "cache_config": snap.cache_config(), "prefix_caching_enabled": snap.prefix_caching_enabled(),
                      "summary": summary}

    def add(fid: str, severity: Severity, message: str, layer: str | None) -> None:
        _accept_finding(result, f"accept.metrics.{fid}", severity, message, layer, stored)

    if cut is not None:
        add("cut_line", "info", f"the last line is cut mid-way and was left out: {cut[:120]!r}", None)
    declared = sorted(set(re.findall(r"^# (?:HELP|TYPE) (vllm:[A-Za-z_:]+)", snap.raw, re.M)))
    if not snap.has_vllm and declared:
        families = {n[:-len("_total")] if n.endswith("_total") else n for n in declared}
        old = sorted(n for n in families if n in REMOVED_NAMES)
        result.metrics.update(old_names=old, old_server=bool(old), values_known=False)
        if old:
            add("old_server", "warning", f"only # HELP / # TYPE lines, of removed metric names "
                                         f"({', '.join(old[:4])}): a vLLM server older than 0.12 whose values are "
                                         "unknown (the excerpt has no samples)", "config")
        else:
            add("no_values", "warning", f"only # HELP / # TYPE lines of {len(families)} vllm: metric(s): a vLLM "
                                        "server whose values are unknown (the excerpt has no samples)", "http")
        return
    if not snap.has_vllm:
        add("not_vllm", "warning", "the page has no vllm: metrics: not a vLLM server's /metrics", "http")
        return
    if snap.is_old_server:
        add("old_server", "warning", f"only removed metric names ({', '.join(snap.old_names())}): a server older "
                                     "than vLLM 0.12, its cache counters cannot be read as current ones", "config")
    enabled = snap.prefix_caching_enabled()
    if enabled is False and "--enable-prefix-caching" in target.serve.required_flags:
        add("prefix_caching_off", "error", "vllm:cache_config_info says enable_prefix_caching=False; Kimi K3 needs "
                                           "--enable-prefix-caching", "config")
    if summary.get("preemptions"):
        add("preemptions", "info", f"{summary['preemptions']:g} preemptions since start: the KV cache ran full",
            "traffic")


# Defects that break an agent's tool call outright; the rest are warnings (docs/acceptance.md).
_CALL_BREAKING = frozenset({"empty_tool_calls", "merged_stream_calls", "invalid_arguments", "marker_in_content",
                            "malformed_response", "wrong_finish_reason", "kimi_marker_leak",
                            "tool_call_text_in_content"})


def chat_stream(text: str) -> tuple[dict[str, Any], list[str]]:
    """An SSE capture folded as a client folds it: the assembled message as a chat completion, and what is
    wrong with the stream itself (a chunk that is not JSON, no ``[DONE]``)."""
    from k3fleet.accept.client import assemble_stream  # lazy: the HTTP side, for stream captures only

    chunks: list[Any] = []
    problems: list[str] = []
    for i, m in enumerate(_SSE_DATA.finditer(text), 1):
        payload = m.group(1).strip()
        if payload == "[DONE]":
            chunks.append("[DONE]")
            continue
        try:
            chunks.append(loads_json(payload))
        except ValueError:
            problems.append(f"data line {i} is not JSON (cut mid-chunk?): {payload[:80]!r}")
    msg = assemble_stream(chunks)
    if not msg.done:
        problems.append("the stream ends without data: [DONE] (cut, or the capture stops early)")
    message = {"role": "assistant", "content": msg.content or None, "reasoning": msg.reasoning or None,
               "tool_calls": msg.tool_calls}
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message,
                                                     "finish_reason": msg.finish_reason}]}, problems


def chat_body(text: str) -> Any:
    """A captured chat completion as JSON data: the JSON body itself, or the OpenAI SDK's printed
    ``ChatCompletion(...)`` repr read as a literal tree (never evaluated)."""
    head = text.strip()
    if not head.startswith("ChatCompletion("):
        try:
            return loads_json(head)
        except ValueError as exc:
            raise ad.CaptureError(f"not JSON: {exc}") from exc

    try:
        tree = ast.parse(head, mode="eval")
    except SyntaxError as exc:
        raise ad.CaptureError(f"the ChatCompletion(...) repr does not parse (cut?): {exc.msg} at line "
                              f"{exc.lineno}") from exc

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Call):
            # Choice(...), ChatCompletionMessage(...): the SDK's models print their fields as keywords.
            return {kw.arg: value(kw.value) for kw in node.keywords if kw.arg is not None}
        if isinstance(node, ast.List | ast.Tuple):
            return [value(x) for x in node.elts]
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and isinstance(node.operand.value, int | float):
            return -node.operand.value
        raise ad.CaptureError(f"unexpected {type(node).__name__} in the ChatCompletion(...) repr")

    return value(tree.body)


def expect_for(view: Any) -> Any:
    """What a captured turn must be, from the turn itself: a call to every tool it names (in
    ``tool_calls``, in call markers such as ``functions.NAME:0``, or as the ``name`` of a JSON object in
    the content), else a text answer."""
    from k3fleet.accept import toolcheck  # lazy: jsonschema and the SDK views, for chat captures only

    names = [c.get("name") for c in view.tool_calls if c.get("name")]
    for text in (view.content, view.reasoning):
        names += re.findall(r"\bfunctions\.([A-Za-z_][\w-]*):\d+", text or "")
    content = (view.content or "").strip()
    if not names and content.startswith("{"):
        try:
            data = loads_json(content)
        except ValueError:
            data = None
        if isinstance(data, dict):
            fn: dict[str, Any] = data["function"] if isinstance(data.get("function"), dict) else data
            name = fn.get("name")
            if isinstance(name, str) and ("arguments" in fn or "parameters" in fn):
                names.append(name)
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return toolcheck.Expect(calls=seen, content=not seen)


def _chat_into(result: TriageResult, c: Capture, stored: str) -> None:
    """A captured response judged by the agent probe's own classifier at the http layer (the raw body);
    finding ids are the probe's (``accept.agent.<defect>``)."""
    from k3fleet.accept import toolcheck  # lazy: jsonschema and the SDK views, for chat captures only

    head = c.text.strip()
    form = "sse" if _is_chat_stream(head) else "sdk_repr" if head.startswith("ChatCompletion(") else "json"
    problems: list[str] = []
    if form == "sse":
        body, problems = chat_stream(c.text)
    else:
        try:
            body = chat_body(c.text)
        except ad.CaptureError as exc:
            if form == "json" and _is_chat_json(head):
                # Cut mid-JSON: nothing in it can be read as a turn, but the cut itself is the finding.
                result.chat = {"form": form, "cut": True, "defects": ["malformed_response"]}
                _chat_finding(result, "malformed_response", f"the body is cut mid-JSON ({exc}) after "
                              f"{len(head.encode())} bytes", stored, toolcheck)
                return
            raise UsageError(f"{c.path}: read as {KINDS[c.kind]} but {exc}") from exc
    view = toolcheck.raw_view(body)
    if view is None:
        raise UsageError(f"{c.path}: read as {KINDS[c.kind]} but it has no choices[0].message")
    view.streamed = form == "sse"
    expect = expect_for(view)
    defects = toolcheck.classify(view, expect)
    if problems:
        # A cut stream never got its last chunk: its finish reason is not the server's word.
        defects.pop("wrong_finish_reason", None)
    for problem in problems:
        defects.setdefault("malformed_response", problem)
    result.chat = {"form": form, "expected_calls": expect.calls, "defects": sorted(defects),
                   "finish_reason": view.finish_reason, "tool_calls": len(view.tool_calls),
                   "stream_problems": problems}
    for d, evidence in sorted(defects.items()):
        _chat_finding(result, d, evidence, stored, toolcheck)


def _chat_finding(result: TriageResult, defect: str, evidence: str, stored: str, toolcheck: Any) -> None:
    """One defect of a captured response, at its layer, with the fix."""
    sev: Severity = "error" if defect in _CALL_BREAKING else "warning"
    seat = toolcheck.seat_of(defect, "http")
    fix = toolcheck.FIXES.get(defect)
    message = f"{toolcheck.DEFECTS.get(defect, defect)}: {evidence} ({seat} layer)" + (f"; fix: {fix}" if fix else "")
    _accept_finding(result, f"accept.agent.{defect}", sev, message, seat, stored)


def write_run(result: TriageResult, argv: Sequence[str], *, runs_dir: Path, out: Path | None) -> Any:
    """The triage run directory (kind ``triage``): every capture (through the redactor), triage.json,
    report.md and the manifest. It enters ``decide`` as operator-supplied evidence."""
    rd = RunDir.create(runs_dir, "triage", argv, out=out, record={"operator_supplied": True})
    for i, c in enumerate(result.captures):
        rd.write_text(stored_name(i, c), c.text)
    rd.write_json(layout.TRIAGE, result.to_json())
    rd.write_manifest()
    # The report is rendered from the verified run itself, as `k3fleet report` would.
    run = open_run(rd.path, ("triage",), "triage writes")
    view = triage_view(parse_triage_record(run.json(layout.TRIAGE), run.label), run.label)
    rd.write_text(layout.REPORT, render_markdown(with_run(view, run.label, run.command.started_at)))
    rd.write_manifest()
    return rd
