# -*- coding: utf-8 -*-
# Stdlib only: the journal module redacts its lines with it on the controller, and the
# controller's evidence writer (k3fleet.evidence) builds on it: one set of rules for both.
"""The redactor's rules: secrets by key name and by value shape (docs/safety.md "Redaction").

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

Structural redaction of inventory files (YAML, INI) needs a YAML parser and lives on the
controller, in ``k3fleet.evidence.redact``, on top of these rules.
"""

from __future__ import absolute_import, division, print_function

import re
from collections.abc import Mapping
from functools import lru_cache

__metaclass__ = type

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
def is_secret_name(name):
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


def _keep_quotes(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    return REDACTED


def _pair(m):
    head = f"{m.group('q')}{m.group('k')}{m.group('q')}{m.group('sep')}"
    if is_secret_name(m.group("k")):
        return head + _keep_quotes(m.group("v"))
    # A quoted value may carry pairs of its own ({"operator": "alice token=X"}).
    return head + _PAIR.sub(_pair, m.group("v"))


def _option(m):
    if not is_secret_name(m.group("k")):
        return m.group(0)
    return m.group("pre") + _keep_quotes(m.group("v"))


def _masked(m):
    return m.group("pre") + REDACTED


def redact_text(text):
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


def redact_argv(argv):
    """A command line with ``--token X``, ``--token=X``, ``KEY=X`` and secret shapes redacted."""
    out = []
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


def _secret_value(value):
    """A secret key's value with every scalar replaced; bools and nulls say nothing and stay."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Mapping):
        return {k: (redact(v) if k in _METADATA else _secret_value(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_secret_value(v) for v in value]
    return REDACTED


def redact(obj):
    """A JSON-like structure with secrets redacted by key name and by value shape."""
    if isinstance(obj, str):  # the most common node first: facts are mostly strings
        return redact_text(obj)
    if isinstance(obj, (int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, Mapping):
        named = next((obj[n] for n in _PAIR_NAMES if isinstance(obj.get(n), str)), None)
        pair_secret = named is not None and is_secret_name(named)
        out = {}
        for k, v in obj.items():
            if (isinstance(k, str) and is_secret_name(k)) or (pair_secret and k in _PAIR_VALUES):
                out[k] = _secret_value(v)
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, str) for v in obj):
            # A list of strings may be a command line: ["vllm", "serve", "--api-key", "X"].
            return redact_argv(obj)
        return [redact(v) for v in obj]
    return obj
