"""The one redactor: everything that enters a run directory passes through here.

The rules by key name and by value shape live in the collection's module_utils
``k3fleet_redact.py`` (stdlib only, so the journal module applies the same rules to the lines it
writes); this module adds the structural redaction of inventories on top. Rules (docs/safety.md "Redaction"):

- **By key name** and **by value shape**: the rules module's docstring lists them.
- **Structurally** for inventories: YAML (any depth, quoted or not, block scalars, flow style,
  ``!vault`` values) and INI (host lines and ``:vars`` sections) are parsed and only the values
  under secret keys are replaced, in place, so the file keeps its shape and comments.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_redact import (
    METADATA_KEYS,
    QUOTED_VALUE,
    REDACTED,
    excerpt,
    forget_secrets,
    is_secret_name,
    keep_quotes,
    redact_text,
    remember_environment_secrets,
    remember_secret,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_redact import redact as _redact
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_redact import redact_argv as _redact_argv

__all__ = ["REDACTED", "VAULT_HEADER", "excerpt", "forget_secrets", "is_secret_name", "redact", "redact_argv",
           "redact_file_text", "redact_ini", "redact_pieces", "redact_text", "redact_yaml",
           "remember_environment_secrets", "remember_secret"]


def redact(obj: Any) -> Any:
    """A JSON-like structure with secrets redacted by key name and by value shape."""
    return _redact(obj)


def redact_argv(argv: Any) -> list[str]:
    """A command line with ``--token X``, ``--token=X``, ``KEY=X`` and secret shapes redacted."""
    return list(_redact_argv(argv))


# -- inventories and other input files -----------------------------------------------------

VAULT_HEADER = "$ANSIBLE_VAULT;"
_VAULT_PLACEHOLDER = "$ANSIBLE_VAULT; (vault-encrypted file: its content is not copied into evidence)\n"


def _secret_scalars(node: yaml.Node, spans: list[tuple[int, int]]) -> None:
    if isinstance(node, yaml.ScalarNode):
        if node.value not in ("", "~", "null", "true", "false") or node.style:
            spans.append((node.start_mark.index, node.end_mark.index))
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _secret_scalars(item, spans)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value in METADATA_KEYS:
                continue
            _secret_scalars(value, spans)


def _walk(node: yaml.Node, spans: list[tuple[int, int]], seen: set[int]) -> None:
    if id(node) in seen:  # anchors and aliases share nodes
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and is_secret_name(key.value):
                _secret_scalars(value, spans)
            else:
                _walk(value, spans, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _walk(item, spans, seen)


def _yaml_spans(text: str) -> list[tuple[int, int]] | None:
    """Character spans of every scalar under a secret key, or None when ``text`` is not YAML."""
    spans: list[tuple[int, int]] = []
    try:
        for doc in yaml.compose_all(text, Loader=yaml.SafeLoader):
            if doc is not None:
                _walk(doc, spans, set())
    except yaml.YAMLError:
        return None
    return spans


def redact_yaml(text: str) -> str | None:
    """YAML with the values under secret keys replaced in place; None when it does not parse."""
    spans = _yaml_spans(text)
    if spans is None:
        return None
    out = text
    for start, end in sorted(set(spans), reverse=True):
        original = out[start:end]
        # A block scalar's span runs past its last newline: keep the line structure.
        tail = original[len(original.rstrip("\n")):]
        out = out[:start] + f'"{REDACTED}"' + tail + out[end:]
    return redact_text(out)


_INI_SECTION = re.compile(r"^\s*\[(?P<name>[^\]]+)\]\s*$")
_INI_VARS_LINE = re.compile(r"^(?P<pre>\s*(?P<k>[^=:\s#;][^=:\s]*)\s*[=:]\s*)(?P<v>.*?)\s*$")
_INI_HOST_VAR = re.compile(r"(?P<pre>(?<!\S)(?P<k>[A-Za-z_][\w.-]*)=)(?P<v>" + QUOTED_VALUE + r"|\S+)")


def redact_ini(text: str) -> str:
    """An INI inventory with the values of secret host variables and ``:vars`` entries replaced."""
    lines = []
    in_vars = False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        ending = line[len(body):]
        section = _INI_SECTION.match(body)
        if section:
            in_vars = section.group("name").strip().endswith(":vars")
        elif body.lstrip().startswith(("#", ";")) or not body.strip():
            pass
        elif in_vars:
            m = _INI_VARS_LINE.match(body)
            if m and is_secret_name(m.group("k")) and m.group("v"):
                body = m.group("pre") + REDACTED
        else:
            body = _INI_HOST_VAR.sub(
                lambda m: m.group("pre") + keep_quotes(m.group("v")) if is_secret_name(m.group("k")) else m.group(0),
                body)
        lines.append(body + ending)
    return redact_text("".join(lines))


_YAML_SUFFIXES = (".yml", ".yaml", ".json")


def redact_file_text(name: str, text: str) -> str:
    """Redact an input file by what it is: vault, YAML/JSON (structural), INI inventory, or plain text."""
    if text.lstrip().startswith(VAULT_HEADER):
        return _VAULT_PLACEHOLDER
    lower = name.lower()
    if lower.endswith(_YAML_SUFFIXES):
        done = redact_yaml(text)
        return done if done is not None else redact_ini(text)
    if lower.endswith((".ini", ".cfg", ".conf", ".hosts")) or "." not in lower.rsplit("/", 1)[-1]:
        # Inventories without a suffix are INI or YAML; YAML that parses as a mapping wins.
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError:
            loaded = None
        if isinstance(loaded, dict):
            done = redact_yaml(text)
            if done is not None:
                return done
        return redact_ini(text)
    return redact_text(text)


# -- long texts, a piece at a time ------------------------------------------------------------

STREAM_CHUNK = 1 << 20  # characters redacted at a time in a long text (a 50 MB log: about 50 pieces)
_STREAM_MAX = 16 << 20  # a piece never grows past this while it waits for a safe place to cut
_PKEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----")
_PKEY_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----")


def _safe_cut(text: str, start: int, stop: int) -> int:
    """The last newline in ``text[start:stop]`` after which a piece may end, or -1.

    Every rule of the redactor that reads past a line's end starts on one line and continues on the
    next: a private key block (BEGIN to END), a name/value pair in block form (the value line indented
    under its name line), an option continued with a backslash, a flow pair broken after its comma. A
    cut is safe where the line before it ends none of those and the line after it starts at column 0
    with neither a dash, a quote nor a value key, and outside an open private key block.
    """
    cut = text.rfind("\n", start, stop)
    while cut > start:
        before = text[text.rfind("\n", start, cut) + 1:cut].rstrip("\r")
        after = text[cut + 1:cut + 16]
        if (after[:1].strip() and after[:1] not in "-\"'{[" and not after.lower().startswith(("value", "val:"))
                and not before.endswith(("\\", ",", "{", "[", ":", "="))):
            begin = next(reversed(list(_PKEY_BEGIN.finditer(text, start, cut))), None)
            if begin is None or _PKEY_END.search(text, begin.end(), cut):
                return cut
            cut = text.rfind("\n", start, begin.start())
            continue
        cut = text.rfind("\n", start, cut)
    return -1


def redact_pieces(text: str, chunk: int = STREAM_CHUNK) -> Iterator[str]:
    """``redact_text(text)`` a piece at a time, for a long text (a 50 MB log): pieces end at newlines
    where no rule's match can continue (:func:`_safe_cut`), so each is redacted as it would be inside
    the whole, and no more than a piece's copies are held at once."""
    start = 0
    while len(text) - start > chunk:
        stop = start + chunk
        cut = _safe_cut(text, start, stop)
        while cut < 0 and stop - start < _STREAM_MAX and stop < len(text):
            stop = min(len(text), stop + chunk)
            cut = _safe_cut(text, start, stop)
        if cut < 0:
            cut = text.rfind("\n", start, stop)
            if cut < 0:  # one line longer than the whole budget: redacted as it is
                cut = text.find("\n", stop)
                if cut < 0:
                    break
        yield redact_text(text[start:cut + 1])
        start = cut + 1
    if start < len(text):
        yield redact_text(text[start:])
