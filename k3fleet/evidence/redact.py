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
           "redact_file_text", "redact_ini", "redact_text", "redact_yaml", "remember_environment_secrets",
           "remember_secret"]


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
