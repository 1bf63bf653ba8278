"""The one redactor: everything that enters a run directory passes through here.

Rules (docs/safety.md "Redaction"):

- **By key name.** A value whose key names a secret (``password``, ``pass``, ``secret``, ``token``,
  ``api_key``, ``auth``, ``credential``, ``cookie`` ...) is replaced by ``***``; the key stays, so a
  reviewer sees that a secret was there. Names are split into words (``ansible_become_pass``,
  ``HF_TOKEN``, ``x-api-key``, ``apiKey``) and judged by word: ``passed``, ``pass_rate``,
  ``prompt_tokens``, ``author``, ``keyboard``, ``host_key_checking`` and ``api_key_env`` (the NAME
  of a variable) are evidence, not secrets.
- **By value shape**, in any text: URL user-info (``https://user:X@``), ``Bearer X``,
  ``Authorization:``/``Cookie:`` headers, ``--api-key X`` / ``--token=X`` options, ``KEY=X`` and
  ``"key": "X"`` pairs, ``password X`` in prose (a Slurm reason), private key blocks and the
  published prefixes of common API tokens (``hf_``, ``sk-``, ``nvapi-``, ``ghp_`` ...).
- **Structurally** for inventories: YAML (any depth, quoted or not, block scalars, flow style,
  ``!vault`` values) and INI (host lines and ``:vars`` sections) are parsed and only the values
  under secret keys are replaced, in place, so the file keeps its shape and comments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import yaml

REDACTED = "***"

# -- names -------------------------------------------------------------------------------------

# Words that make a name secret when they end it: ``ansible_become_pass``, ``HF_TOKEN``, ``auth``.
_TAIL_WORDS = frozenset({
    "password", "passwd", "passphrase", "pass", "secret", "secrets", "token", "credential", "credentials",
    "cookie", "cookies", "auth", "authorization", "apikey", "privatekey", "bearer", "jwt", "pat",
})
# Words that make a name secret wherever they stand (``password_hash``, ``secret_access_key``) unless
# the name ends in a word that says the value is about the secret, not the secret itself.
_ANYWHERE_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "secrets", "credential",
                             "credentials", "token", "apikey", "privatekey", "auth"})
_ABOUT_TAIL = frozenset({
    "file", "files", "path", "dir", "name", "names", "id", "ids", "ref", "env", "var", "vars", "count", "rate",
    "length", "len", "size", "type", "method", "mode", "checking", "url", "uri", "endpoint", "expiry", "expires",
    "ttl", "hint", "policy", "prompt", "enabled", "required", "source", "sources", "format", "prefix", "header",
    "headers", "used", "set", "present", "missing", "redacted",
})
# ``key`` ends many evidence names: only a key that is not public or structural is a secret.
_PUBLIC_KEY_WORDS = frozenset({"host", "hosts", "public", "pub", "sort", "primary", "foreign", "partition", "dict",
                               "map", "group", "cache", "index", "lookup", "row", "column", "result", "gpg"})
# Joined words that are secrets whatever surrounds them (``dbpassword``, ``mysecret``, ``xapikey``).
_EMBEDDED = ("password", "passwd", "passphrase", "apikey", "privatekey", "secret")

_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


@lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """True when ``name`` (a variable, option, header or key) names a secret value."""
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words:
        return False
    last = words[-1]
    if last in _TAIL_WORDS:
        return True
    if last == "key" and len(words) > 1:
        return not any(w in _PUBLIC_KEY_WORDS for w in words[:-1])
    if last in _ABOUT_TAIL:
        return False
    if any(w in _ANYWHERE_WORDS for w in words):
        return True
    return any(e in w for w in words for e in _EMBEDDED if len(w) > len(e))


# -- text shapes -------------------------------------------------------------------------------

_QUOTED = r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\''
# scheme://user:SECRET@host (the password part; a bare user is kept).
_URL_USERINFO = re.compile(r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"<>]*:)(?P<v>[^\s@/'\"<>]+)(?=@)")
# Headers whose whole value is a credential, up to the end of the line or the closing quote.
_HEADER = re.compile(r"(?P<pre>\b(?:proxy-)?(?:authorization|cookie|set-cookie)\s*:\s*)(?P<v>[^\r\n'\"]+)",
                     re.IGNORECASE)
_BEARER = re.compile(r"(?P<pre>\bbearer\s+)(?P<v>[A-Za-z0-9._~+/-]{8,}=*)", re.IGNORECASE)
# KEY=value, KEY: value, "key": "value", 'key' => value; the key decides.
_PAIR = re.compile(
    r"(?P<q>[\"']?)(?P<k>[A-Za-z_][\w.-]*)(?P=q)(?P<sep>\s*(?:=>|[=:])[ \t]*)"
    r"(?P<v>" + _QUOTED + r"|[^\s,;'\"}\])]+)")
# --option value (the option names a secret; the value is the next word).
_OPTION = re.compile(r"(?P<pre>(?<![\w-])--?(?P<k>[A-Za-z][\w.-]*)\s+)(?P<v>" + _QUOTED + r"|[^\s'\"-][^\s'\"]*)")
# A password in prose: "BMC password hunter2", "root password is hunter2".
_PROSE = re.compile(r"(?P<pre>\b(?:password|passwd|passphrase)\s+(?:(?:is|was)\s+)?)(?P<v>[^\s'\",;\[\]()]+)",
                    re.IGNORECASE)
_PRIVATE_KEY = re.compile(r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY-----)")
# Published token prefixes (Hugging Face, OpenAI, NVIDIA NGC, GitHub, GitLab, Slack).
_KNOWN_TOKEN = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|nvapi-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,})")


# Every shape above needs one of these; most evidence strings (versions, names, states) have
# none, and skip the rules at the cost of one scan.
_TRIGGER = re.compile(r"[=:@]|(?<![\w-])-[A-Za-z-]|bearer|passw|passphrase|PRIVATE KEY|hf_|sk-|nvapi-|gh[pousr]_"
                      r"|github_pat_|glpat-|xox", re.IGNORECASE)


def _keep_quotes(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    return REDACTED


def _pair(m: re.Match[str]) -> str:
    head = f"{m.group('q')}{m.group('k')}{m.group('q')}{m.group('sep')}"
    if is_secret_name(m.group("k")):
        return head + _keep_quotes(m.group("v"))
    # A quoted value may carry pairs of its own ({"operator": "alice token=X"}).
    return head + _PAIR.sub(_pair, m.group("v"))


def _option(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("k")):
        return m.group(0)
    return m.group("pre") + _keep_quotes(m.group("v"))


def _masked(m: re.Match[str]) -> str:
    return m.group("pre") + REDACTED


def redact_text(text: str) -> str:
    """``text`` with every secret-shaped value replaced by ``***`` (the key or option is kept)."""
    if not text or not _TRIGGER.search(text):
        return text
    text = _PRIVATE_KEY.sub(lambda m: f"{m.group(1)}\n{REDACTED}\n{m.group(2)}", text)
    text = _URL_USERINFO.sub(_masked, text)
    text = _HEADER.sub(_masked, text)
    text = _BEARER.sub(_masked, text)
    text = _PAIR.sub(_pair, text)
    text = _OPTION.sub(_option, text)
    text = _PROSE.sub(_masked, text)
    return _KNOWN_TOKEN.sub(REDACTED, text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with ``--token X``, ``--token=X``, ``KEY=X`` and secret shapes redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" not in arg and len(arg) > 1 and is_secret_name(arg.lstrip("-")):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg))
    return out


# -- structures --------------------------------------------------------------------------------

# Under a secret key holding a mapping ({"value": X, "source": "/etc/nccl.conf"}), these describe
# where the secret came from and stay readable.
_METADATA = frozenset({"source", "file", "path", "origin", "line", "lineno", "type", "kind", "present", "set",
                       "defined", "status", "reason"})
# Name/value pairs ({"name": "HF_TOKEN", "value": X}): the name decides for the value.
_PAIR_NAMES = ("name", "key", "Name", "Key", "env", "variable")
_PAIR_VALUES = ("value", "Value", "values", "val", "default")


def _secret_value(value: Any) -> Any:
    """A secret key's value with every scalar replaced; bools and nulls say nothing and stay."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Mapping):
        return {k: (redact(v) if k in _METADATA else _secret_value(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_secret_value(v) for v in value]
    return REDACTED


def redact(obj: Any) -> Any:
    """A JSON-like structure with secrets redacted by key name and by value shape."""
    if isinstance(obj, str):  # the most common node first: facts are mostly strings
        return redact_text(obj)
    if isinstance(obj, int | float | bool) or obj is None:
        return obj
    if isinstance(obj, Mapping):
        named = next((obj[n] for n in _PAIR_NAMES if isinstance(obj.get(n), str)), None)
        pair_secret = named is not None and is_secret_name(named)
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if (isinstance(k, str) and is_secret_name(k)) or (pair_secret and k in _PAIR_VALUES):
                out[k] = _secret_value(v)
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    return obj


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
            if isinstance(key, yaml.ScalarNode) and key.value in _METADATA:
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
_INI_HOST_VAR = re.compile(r"(?P<pre>(?<!\S)(?P<k>[A-Za-z_][\w.-]*)=)(?P<v>" + _QUOTED + r"|\S+)")


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
                lambda m: m.group("pre") + _keep_quotes(m.group("v")) if is_secret_name(m.group("k")) else m.group(0),
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
