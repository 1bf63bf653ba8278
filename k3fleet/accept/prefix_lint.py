"""`accept prefix-lint`: name what breaks the shared prompt prefix between captured requests.

A prefix cache only hits when the tokens match from the first one. Chat templates render the tool
definitions (with ``tojson``, so key order counts) and the system prompt first, then the
conversation; anything that changes there between two requests of the same agent makes every later
token a miss. The input is JSON Lines of request bodies as captured (before and after a gateway, or
the turns of one agent); docs/acceptance.md ("accept prefix-lint") has the format and the rules.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from k3fleet.accept.result import ProbeResult, finding
from k3fleet.bounds import loads_json, read_input
from k3fleet.errors import UsageError
from k3fleet.evidence.redact import excerpt
from k3fleet.models.findings import Finding

PROBE = "prefix_lint"

# ISO 8601 / RFC 3339 date-times (2026-12-04T15:30:00.123Z, +01:00), times, epoch seconds or
# milliseconds, RFC 2822 dates, bare dates. Bounded by non-digits, not \b: "T15:30:00Z" has no word
# boundary around its time.
_TIMESTAMP = re.compile(
    r"(?<!\d)\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?!\d)"
    r"|(?<!\d)\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?(?!\d)|\b1[6-9]\d{8}(?:\d{3})?\b"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? \d{1,2} \w+ \d{4}")
_ID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[0-9a-f]{16,}\b|"
                 r"\b(?:req|request|trace|session|conv|msg|run)[_-]?(?:id)?[=:_ -]+[\w-]{6,}", re.IGNORECASE)
_MM_TYPES = ("image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "file")


def _record_body(row: Any, lineno: int, path: Path) -> tuple[str | None, dict[str, Any]]:
    """(stage label, request body) of one captured line: a bare body or a {stage, body|request} envelope."""
    if not isinstance(row, Mapping):
        raise UsageError(f"{path}:{lineno}: a line must be a JSON object (a request body)")
    label = None
    body: Any = row
    for key in ("body", "request"):
        if isinstance(row.get(key), Mapping):
            body = row[key]
            label = row.get("stage") or row.get("label") or row.get("where")
            break
        if isinstance(row.get(key), str):
            try:
                body = loads_json(row[key])
            except ValueError as exc:
                raise UsageError(f"{path}:{lineno}: '{key}' is a string that is not JSON") from exc
            label = row.get("stage") or row.get("label") or row.get("where")
            break
    if not isinstance(body, Mapping) or not isinstance(body.get("messages"), list):
        raise UsageError(f"{path}:{lineno}: no chat request here (an object with 'messages' was expected)")
    return (str(label) if label is not None else None), dict(body)


def read_captures(path: Path) -> list[tuple[str | None, dict[str, Any]]]:
    """Each line's stage label and parsed body (JSON keeps key order, which the checks rely on)."""
    raw = read_input(path, "capture file", kind="captured request bodies (JSON Lines)", limit="requests")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read capture file {path}: {exc}") from exc
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = loads_json(line)
        except ValueError as exc:
            raise UsageError(f"{path}:{lineno}: not JSON ({exc.args[0] if exc.args else exc})") from exc
        out.append(_record_body(row, lineno, path))
    if len(out) < 2:
        raise UsageError(f"{path}: at least two captured requests are needed to compare prefixes")
    return out


def _pairs(records: list[tuple[str | None, dict[str, Any]]]) -> list[tuple[int, int, str]]:
    """Before/after pairs when lines are labelled so; otherwise each request against the one before."""
    labels = [(r[0] or "").lower() for r in records]
    before = [i for i, lab in enumerate(labels) if lab in ("before", "client", "in", "upstream")]
    after = [i for i, lab in enumerate(labels) if lab in ("after", "gateway", "out", "downstream", "server")]
    if before and after:
        return [(b, a, "gateway") for b, a in zip(before, after, strict=False)]
    return [(i - 1, i, "turn") for i in range(1, len(records))]


def _system_text(body: Mapping[str, Any]) -> str:
    parts = []
    for m in body.get("messages", []):
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "developer"):
            break
        parts.append(_content_text(m.get("content")))
    return "\n".join(parts)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _first_change(a: str, b: str) -> tuple[int, int, int, int] | None:
    """Where two texts first differ: (i1, i2) in ``a`` and (j1, j2) in ``b``, or None when equal."""
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op != "equal":
            return i1, i2, j1, j2
    return None


def _changed_fragment(a: str, b: str) -> tuple[str, str]:
    """The first differing stretch of two texts (with a little context), for evidence."""
    at = _first_change(a, b)
    if at is None:
        return "", ""
    i1, i2, j1, j2 = at
    return a[max(0, i1 - 12): i2 + 12], b[max(0, j1 - 12): j2 + 12]


def _change_in(pattern: re.Pattern[str], a: str, b: str) -> bool:
    """Whether the first change between ``a`` and ``b`` falls inside a match of ``pattern`` in either
    text: a timestamp whose minutes changed is a changed timestamp, however little of it the diff shows."""
    at = _first_change(a, b)
    if at is None:
        return False
    i1, i2, j1, j2 = at
    return any(m.start() <= max(lo, hi - 1) and m.end() > lo
               for text, lo, hi in ((a, i1, i2), (b, j1, j2)) for m in pattern.finditer(text))


def _first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _tools_findings(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    ta, tb = a.get("tools") or [], b.get("tools") or []
    if ta == tb:
        if json.dumps(ta) != json.dumps(tb):
            return [("tools_key_order", "tool definitions have the same content but a different key order: the "
                     "template renders them with tojson, so the prompt text changes", _tool_key_order_hint(ta, tb))]
        return []
    names_a, names_b = [_tool_name(t) for t in ta], [_tool_name(t) for t in tb]
    if sorted(map(str, names_a)) == sorted(map(str, names_b)) and names_a != names_b:
        by_a = {_tool_name(t): t for t in ta}
        if all(by_a.get(_tool_name(t)) == t for t in tb):
            return [("tools_reordered", "the same tools in a different order", f"{names_a} -> {names_b}")]
    if _normalise_ws(json.dumps(ta, sort_keys=True)) == _normalise_ws(json.dumps(tb, sort_keys=True)):
        return [("whitespace", "tool definitions differ only in whitespace", "tools")]
    fa, fb = _changed_fragment(json.dumps(ta, sort_keys=True), json.dumps(tb, sort_keys=True))
    return [("tools_changed", "tool definitions changed", f"{fa!r} -> {fb!r}")]


def _tool_name(tool: Any) -> str | None:
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) else None


def _tool_key_order_hint(ta: list[Any], tb: list[Any]) -> str:
    for x, y in zip(ta, tb, strict=False):
        if json.dumps(x) != json.dumps(y):
            fa, fb = _changed_fragment(json.dumps(x), json.dumps(y))
            return f"{fa!r} -> {fb!r}"
    return "tools"


def _normalise_ws(text: str) -> str:
    return " ".join(text.split())


def _system_findings(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    sa, sb = _system_text(a), _system_text(b)
    if sa == sb:
        return []
    fa, fb = _changed_fragment(sa, sb)
    evidence = f"at char {_first_diff(sa, sb)}: {fa!r} -> {fb!r}"
    if _normalise_ws(sa) == _normalise_ws(sb):
        return [("whitespace", "the system prompt differs only in whitespace", evidence)]
    out = []
    if _change_in(_TIMESTAMP, sa, sb):
        out.append(("timestamp_in_system", "a timestamp or date in the system prompt changes between requests",
                    evidence))
    if _change_in(_ID, sa, sb):
        out.append(("id_in_system", "an id (request, session, trace, UUID) in the system prompt changes between "
                    "requests", evidence))
    if not out:
        out.append(("system_changed", "the system prompt text changed", evidence))
    return out


def _mm_parts(content: Any) -> list[Mapping[str, Any]]:
    if not isinstance(content, list):
        return []
    return [p for p in content if isinstance(p, Mapping) and p.get("type") in _MM_TYPES]


def _message_findings(a: Mapping[str, Any], b: Mapping[str, Any], kind: str) -> list[tuple[str, str, str]]:
    """Messages both requests share (after the system prompt): every change there breaks the prefix."""
    ma = [m for m in a.get("messages", []) if isinstance(m, Mapping)]
    mb = [m for m in b.get("messages", []) if isinstance(m, Mapping)]
    # For consecutive turns the earlier conversation is the later one's prefix; the last message of the
    # earlier request may be the turn that then changed, so all of it is compared.
    n = min(len(ma), len(mb))
    out: list[tuple[str, str, str]] = []
    for i in range(n):
        x, y = ma[i], mb[i]
        if x.get("role") in ("system", "developer") and y.get("role") in ("system", "developer"):
            continue
        if x == y:
            continue
        px, py = _mm_parts(x.get("content")), _mm_parts(y.get("content"))
        if px or py:
            kinds_x, kinds_y = [p.get("type") for p in px], [p.get("type") for p in py]
            if kinds_x == kinds_y and _content_text(x.get("content")) == _content_text(y.get("content")):
                fa, fb = _changed_fragment(json.dumps(px, sort_keys=True), json.dumps(py, sort_keys=True))
                out.append(("multimodal_metadata", f"message {i}: the same media parts with changed metadata "
                            "(URL, detail, ids or other fields of the image/audio part)", f"{fa!r} -> {fb!r}"))
                continue
        if i == len(ma) - 1 and kind == "turn" and x.get("role") == "user" and y.get("role") == "user":
            # The last user turn of the earlier request may be edited by design; not a prefix breaker.
            continue
        tx, ty = _content_text(x.get("content")), _content_text(y.get("content"))
        if tx != ty and _normalise_ws(tx) == _normalise_ws(ty):
            out.append(("whitespace", f"message {i} ({x.get('role')}) differs only in whitespace", f"message {i}"))
        elif x.get("role") != y.get("role") or tx != ty:
            fa, fb = _changed_fragment(tx, ty)
            out.append(("history_changed", f"message {i} ({x.get('role')}) of the shared history changed",
                        f"{fa!r} -> {fb!r}"))
        else:
            fa, fb = _changed_fragment(json.dumps(x, sort_keys=True), json.dumps(y, sort_keys=True))
            out.append(("history_changed", f"message {i} ({x.get('role')}) changed outside its text "
                        "(tool calls, names or ids)", f"{fa!r} -> {fb!r}"))
    return out


def lint_captures(path: Path) -> ProbeResult:
    records = read_captures(path)
    findings: list[Finding] = []
    compared = []
    seen: set[tuple[str, str]] = set()
    for ia, ib, kind in _pairs(records):
        a, b = records[ia][1], records[ib][1]
        causes = (_tools_findings(a, b) + _system_findings(a, b)
                  + _message_findings(a, b, kind))
        compared.append({"a": ia + 1, "b": ib + 1, "kind": kind, "breaks": [c[0] for c in causes]})
        for cid, message, evidence in causes:
            key = (cid, message)
            if key in seen:
                continue
            seen.add(key)
            findings.append(finding(check_id=f"accept.prefix_lint.{cid}", severity="error", layer="client",
                                    message=f"lines {ia + 1} -> {ib + 1}: {message}",
                                    evidence=excerpt(evidence, 300, tail="", one_line=False)))
    data = {"requests": len(records), "pairs": compared}
    if findings:
        kinds = sorted({f.check_id.rsplit(".", 1)[1] for f in findings})
        return ProbeResult(probe=PROBE, status="fail", reason="the shared prefix breaks: " + ", ".join(kinds),
                           findings=findings, data=data)
    return ProbeResult(probe=PROBE, status="pass", data=data,
                       reason=f"{len(compared)} pair(s) compared: tools and system prompt byte-stable, history kept")
