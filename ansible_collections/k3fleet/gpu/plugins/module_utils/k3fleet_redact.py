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
- **By value shape**, in any text: URL user-info (``https://user:X@``, ``__token__:X@``),
  ``Bearer X``, ``Authorization:``/``Cookie:`` headers, ``--api-key X`` / ``--token=X`` options and
  argv lists (``'--api-key', 'X'``), ``KEY=X``, ``KEY: X`` and ``"key": "X"`` pairs (also quoted keys
  of a Python repr with a list value: vLLM's ``non-default args: {'api_key': ['X']}``), key phrases
  in prose (``api key: X``, ``bearer token X``, ``access token is X``, ``BMC password X``), private
  key blocks and the published prefixes of common API tokens (``hf_``, ``sk-``, ``nvapi-``,
  ``ghp_`` ...).
- **By value**: a secret this process knows (``remember_secret``: the API key a probe sends) is
  masked wherever it appears, e.g. echoed back in a server's error message.

The text rules run in one left-to-right scan, in time linear in the text's length (see the
comment above ``_SCAN``).

Structural redaction of inventory files (YAML, INI) needs a YAML parser and lives on the
controller, in ``k3fleet.evidence.redact``, on top of these rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

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
    # A file name ("cannot read hf_token.txt: permission denied"): the name of a secret's file.
    "txt", "json", "yaml", "yml", "toml", "ini", "cfg", "conf", "log",
})
# ``key`` ends many evidence names: only a key that is not public or structural is a secret.
_PUBLIC_KEY_WORDS = frozenset({"host", "hosts", "public", "pub", "sort", "primary", "foreign", "partition", "dict",
                               "map", "group", "cache", "index", "lookup", "row", "column", "result", "gpg"})
# Joined words that are secrets whatever surrounds them (``dbpassword``, ``mysecret``, ``xapikey``).
_EMBEDDED = ("password", "passwd", "passphrase", "apikey", "privatekey", "secret")

_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def is_secret_name(name: str) -> bool:
    """True when ``name`` (a variable, option, header or key) names a secret value."""
    # Names are few and short; a long one (a scanned word of a 64 KB line) is judged uncached, so
    # it does not fill the cache.
    return _judge_name(name) if len(name) <= 128 else _judge_name.__wrapped__(name)


@lru_cache(maxsize=4096)
def _judge_name(name: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words:
        return False
    last = words[-1]
    if len(words) > 1 and words[-2] == "per":
        # A rate or a cost (``prefill_ms_per_token``, ``usd_per_token``) is a number about tokens.
        return False
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
#
# One left-to-right scan (``_SCAN``) finds the head of every shape: a key and its separator, an
# option, a prose phrase, a header name, a URL up to its password, a token prefix. The value is
# then read at the end of the head (``_VALUE``, ``_OPTION_VALUE``, ``_PROSE_VALUE``) only when the
# head names a secret; otherwise the scan goes on right after the head, so a non-secret value is
# scanned like any other text ({"operator": "alice token=X"}, --build-arg HF_TOKEN=X).
#
# Linear time in the text's length: the scan never goes back, and no part of a pattern can start
# inside a run of the characters it reads (each starts behind a lookbehind that refuses a position
# inside its own run), or it reads only up to a character that starts the next attempt, or it
# always succeeds and consumes what it read (a quote that never closes runs to the end of the
# line and is redacted with it). scripts/bench_redact.py prints the time per line length.

# A quoted value, double (with escapes) or single, on one line (the controller's inventory redactor
# reads values with it too).
QUOTED_VALUE = r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\''

# Words that follow a secret word in prose without being the secret ("the api key is missing").
_PROSE_STOP = frozenset({
    "a", "an", "the", "is", "was", "are", "were", "be", "been", "not", "no", "none", "null", "missing", "required",
    "needed", "invalid", "incorrect", "wrong", "expired", "revoked", "provided", "given", "set", "unset", "empty",
    "for", "from", "of", "to", "in", "on", "at", "by", "with", "without", "and", "or", "if", "must", "should",
    "has", "have", "had", "file", "env", "environment", "variable", "authentication", "failed", "denied",
    "rejected", "error", "ok", "changed", "found", "here", "there", "this", "that", "it", "as", "prompt",
})
# Secret-named values that say nothing secret and stay readable: empty (``'api_key': None``), a
# placeholder of a usage line (``--sign-key KEY``, ``token=<token>``) or a variable reference
# (``--api-key $VLLM_API_KEY``).
_EMPTY_VALUES = frozenset({"None", "null", "NULL", "nil", "~", "''", '""', REDACTED, "'" + REDACTED + "'",
                           '"' + REDACTED + '"', "KEY", "FILE", "PATH", "VAR", "VALUE", "NAME", "TOKEN", "SECRET",
                           "PASSWORD", "ENV", "..."})
# A variable reference, <token>, {{ template }}, or X / XXX standing for a value in a usage line.
_PLACEHOLDER = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|<[A-Za-z][\w .-]{0,30}>|\{\{[\w .|()'\"-]{1,60}\}\}"
                          r"|X(?:XX)?")


def _says_nothing(value: str) -> bool:
    # A placeholder that closes the sentence around it ("(sign with --sign-key KEY)") is still one:
    # the closing bracket or stop is prose, not part of a value.
    value = value.rstrip(")]}.,;:") or value
    return value in _EMPTY_VALUES or _PLACEHOLDER.fullmatch(value) is not None


_SCAN = re.compile(
    # A private key block, to its END line or, cut short, to the end of the text.
    r"(?P<pkey>-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----)"
    r"(?:[\s\S]*?(?P<pkey_end>-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----)|[\s\S]*)"
    # scheme://user:PASSWORD@host (a bare user is kept; __token__:X@ too).
    r"|(?P<url>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s:/@'\"<>]*:)(?P<url_v>[^\s@/'\"<>]+)@"
    # Headers whose whole value is a credential, to the end of the line or the closing quote.
    r"|(?P<header>(?<![\w-])(?i:(?:proxy-)?(?:authorization|set-cookie|cookie))[ \t]*:[ \t]*)"
    r"(?P<header_v>[^\r\n'\"]+)"
    # Published token prefixes (Hugging Face, OpenAI, NVIDIA NGC, GitHub, GitLab, Slack).
    r"|(?P<known>\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|nvapi-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}))"
    # Prose: "api key: X", "api key X", "bearer token X", "access token is X", "BMC password X".
    r"|(?P<prose>(?<![\w.-])(?i:(?:(?:api|access|bearer|auth|refresh|session|secret|private|client|hf|ngc"
    r"|openai|github|gitlab|personal[ \t]+access)[ \t]+(?:key|token|secret)s?|password|passwd|passphrase))"
    r"(?P<prose_sep>[ \t]*(?:=>|[=:])[ \t]*|[ \t]+(?:(?i:is|was)[ \t]+)?))"
    # Bearer <token> (a credential without a header name: "sent Bearer X").
    r"|(?P<bearer>(?<![\w-])(?i:bearer)[ \t]+)(?=[A-Za-z0-9._~+/-]{8})"
    # --option value, --option=value, and argv lists: '--api-key', 'X' / "--token" "X".
    r"|(?P<opt>(?:(?P<opt_q>\\?[\"'])|(?<![\w-]))--?(?P<opt_k>[A-Za-z][\w.-]*)"
    r"(?P<opt_sep>=|(?(opt_q)(?P=opt_q)(?:[ \t]*,)?[ \t]*|(?:\\?[\"'](?:[ \t]*,)?[ \t]*|(?:[ \t]|\\\r?\n)+))))"
    # KEY=value, KEY: value, "key": "value", 'key' => value, {'api_key': ['X']}: the key decides (a bare
    # key may end in a stray quote whose opening one another value took).
    r"|(?P<pair>(?:(?P<pair_q>\\?[\"'])(?P<pair_qk>[A-Za-z_][\w.-]*(?: [\w.-]+)*)(?P=pair_q)"
    r"|(?<![\w.-])(?P<pair_k>[A-Za-z_][\w.-]*)(?:\\?[\"'])?)[ \t]*(?:=>|[=:])[ \t]*)"
)
# A secret key's value: a quoted string (one that never closes runs to the end of the line), an
# escaped-quoted string inside a JSON string, a list or a flat mapping closed on the line, or a word.
_VALUE = re.compile(
    r"\"(?:[^\"\\\n]|\\.)*\"?|'[^'\n]*'?"
    r"|\\([\"'])(?:[^\\\n]|\\(?!\1)[^\n])*(?:\\\1)?"
    r"|(?P<list>\[[^\[\]\n]*\])|(?P<map>\{[^{}\n]*\})"
    r"|[^\s,;'\"}\])\[{]+")
# An option's value: the next word unless it is the next option.
_OPTION_VALUE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"?|'[^'\n]*'?|\\([\"'])(?:[^\\\n]|\\(?!\1)[^\n])*(?:\\\1)?"
                           r"|[^\s'\"\\-][^\s'\"\\]*")
_BEARER_VALUE = re.compile(r"[A-Za-z0-9._~+/-]{8,}=*")
_PROSE_VALUE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"?|'[^'\n]*'?|[^\s'\",;\[\]()]+")
_LIST_ITEM = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s,\[\]'\"]+")


# Every shape above needs one of these; most evidence strings (versions, names, states) have
# none, and skip the scan at the cost of one search.
_TRIGGER = re.compile(r"[=:@]|(?<![\w-])-[A-Za-z-]|bearer|passw|passphrase|PRIVATE KEY|hf_|sk-|nvapi-|gh[pousr]_"
                      r"|github_pat_|glpat-|xox|key|token|secret", re.IGNORECASE)

# Secret values known to this process (the API key an acceptance probe sends): masked wherever
# they appear, whatever surrounds them (a server that echoes the key in an error message).
_KNOWN_VALUES: set[str] = set()
_MIN_KNOWN = 6


def remember_secret(value: object) -> None:
    """Mask ``value`` in every text redacted from now on in this process (too short a value is ignored)."""
    if isinstance(value, str) and len(value.strip()) >= _MIN_KNOWN and value.strip() != REDACTED:
        _KNOWN_VALUES.add(value.strip())
        _forget_results()


# A secret-named variable whose value is a path (SSH_AUTH_SOCK) or a flag says nothing secret.
_MIN_ENV_SECRET = 8


def remember_environment_secrets(environ: Mapping[str, str]) -> None:
    """Mask the values of the secret-named variables of ``environ`` (HF_TOKEN, OPENAI_API_KEY, ...)
    wherever they appear, whatever shape surrounds them: the controller's own secrets never reach
    a run directory or the terminal, even echoed back by a server or a tool."""
    for name, value in environ.items():
        if len(value) >= _MIN_ENV_SECRET and not value.startswith(("/", "~", ".")) and is_secret_name(name):
            remember_secret(value)


def forget_secrets() -> None:
    """Forget the values ``remember_secret`` was given (tests)."""
    _KNOWN_VALUES.clear()
    _forget_results()


def keep_quotes(value: str) -> str:
    """A secret value's replacement that keeps its quotes (``"***"``, ``\\"***\\"``, a quote never closed)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    if len(value) >= 4 and value[0] == "\\" and value[1] in "\"'" and value[-2:] == value[:2]:
        return value[:2] + REDACTED + value[:2]
    if value[:1] in ("\"", "'"):  # a quote that never closed (a cut line): the rest of the line went
        return value[0] + REDACTED
    return REDACTED


def _masked_value(m: re.Match[str]) -> str:
    """A secret value matched by ``_VALUE``: the shape stays ([ '***' ], {***}, "***"), the content goes."""
    value = m.group(0)
    if m.group("list") is not None:
        return _LIST_ITEM.sub(lambda i: keep_quotes(i.group(0)), value)
    if m.group("map") is not None:
        return "{" + REDACTED + "}"
    return keep_quotes(value)


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _head_key(m: re.Match[str]) -> str:
    return m.group("pair_qk") if m.group("pair_qk") is not None else m.group("pair_k")


def _carries_secret(m: re.Match[str]) -> bool:
    """Whether the head ``m`` (a ``_SCAN`` match) redacts something: a secret key, option or phrase,
    a header, a URL password, a token."""
    if m.group("pair") is not None:
        return is_secret_name(_head_key(m))
    if m.group("opt") is not None:
        return is_secret_name(m.group("opt_k"))
    return True


def _value_at(pattern: re.Pattern[str], text: str, pos: int) -> re.Match[str] | None:
    """The value a secret head takes at ``pos``, or None. A value that is itself the head of a secret
    shape ("api key  api_key: X", "password --token X") is left to that shape: taking the word would
    end the value before the secret that follows it."""
    v = pattern.match(text, pos)
    if v is None or _says_nothing(v.group(0)):
        return None
    head = _SCAN.match(text, pos)
    if head is not None and _carries_secret(head):
        return None
    return v


def _scan(text: str) -> str:
    out: list[str] = []
    pos = 0
    search = _SCAN.search
    while True:
        m = search(text, pos)
        if m is None:
            break
        out.append(text[pos:m.start()])
        end = m.end()
        if m.group("pkey") is not None:
            out.append(m.group("pkey") + "\n" + REDACTED)
            if m.group("pkey_end") is not None:
                out.append("\n" + m.group("pkey_end"))
        elif m.group("url") is not None:
            out.append(m.group("url") + REDACTED + "@")
        elif m.group("header") is not None:
            out.append(m.group("header") + REDACTED)
        elif m.group("known") is not None:
            out.append(REDACTED)
        elif m.group("bearer") is not None:
            out.append(m.group("bearer"))
            v = _value_at(_BEARER_VALUE, text, end)
            if v is not None:
                out.append(REDACTED)
                end = v.end()
        elif m.group("prose") is not None:
            out.append(m.group("prose"))
            v = _value_at(_PROSE_VALUE, text, end)
            if v is not None and v.group(0).lower().rstrip(".:") not in _PROSE_STOP:
                out.append(keep_quotes(v.group(0)))
                end = v.end()
        elif m.group("opt") is not None:
            out.append(m.group("opt"))
            if is_secret_name(m.group("opt_k")):
                v = _value_at(_OPTION_VALUE, text, end)
                if v is not None:
                    keep = names_key_file(m.group("opt_k"), _unquoted(v.group(0)))
                    out.append(v.group(0) if keep else keep_quotes(v.group(0)))
                    end = v.end()
        else:
            out.append(m.group("pair"))
            if is_secret_name(_head_key(m)):
                v = _value_at(_VALUE, text, end)
                if v is not None:
                    keep = names_key_file(_head_key(m), _unquoted(v.group(0)))
                    out.append(v.group(0) if keep else _masked_value(v))
                    end = v.end()
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact_text(text: str) -> str:
    """``text`` with every secret-shaped value replaced by ``***`` (the key or option is kept)."""
    if not text:
        return text
    if len(text) <= _CACHED_LEN:
        return _redact_short(text)
    if len(text) <= _CACHED_MEDIUM_LEN:
        return _redact_medium(text)
    return _redact_text(text)


# Evidence repeats its short strings (states, versions, argv words, paths: a fleet's facts have a
# few hundred distinct ones across thousands), and redact_text is a function of the text and the
# known secrets only: the result of a short text is kept, and forgotten whenever the known secrets
# change. A verdict repeats some longer ones too, once per host (a check's fix, a plan's package
# line: a 2,000-host merge redacted 7,339 texts of 257 to 4,096 characters, 220 distinct), kept in a
# smaller cache (at most 1,024 of them, a few MB). Long texts (logs, bodies, a whole report) are rarely
# seen twice and would fill the cache.
_CACHED_LEN = 256
_CACHED_MEDIUM_LEN = 4096


@lru_cache(maxsize=16384)
def _redact_short(text: str) -> str:
    return _redact_text(text)


@lru_cache(maxsize=1024)
def _redact_medium(text: str) -> str:
    return _redact_text(text)


def _forget_results() -> None:
    """Drop the kept results: the known secrets changed."""
    _redact_short.cache_clear()
    _redact_medium.cache_clear()


def _redact_text(text: str) -> str:
    for value in _KNOWN_VALUES:
        if value in text:
            text = text.replace(value, REDACTED)
    if "alue" in text and ("ame" in text or "ey" in text):
        text = _mask_pairs(text)
    if not _TRIGGER.search(text):
        return text
    return _scan(text)


# Name/value pairs in text (a Kubernetes env list in group_vars, a JSON env array): the name decides
# for the value, as redact() does for parsed data. Flow form on one line ({name: X, value: Y}), and
# block form where the value key sits at the name key's column in the same list item.
_PAIR_FLOW = re.compile(
    r"(?P<head>[{,]\s*[\"']?(?:name|key|Name|Key)[\"']?\s*:\s*[\"']?(?P<n>[A-Za-z_][\w.-]{0,127})[\"']?\s*,\s*"
    r"[\"']?(?:value|Value|val)[\"']?\s*:\s*)(?P<v>\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^,}\n]+)")
_PAIR_NAME_LINE = re.compile(
    r"^(?P<lead>[ \t]*(?:-[ \t]+)?)[\"']?(?:name|key|Name|Key)[\"']?[ \t]*:[ \t]*[\"']?(?P<n>[A-Za-z_][\w.-]{0,127})"
    r"[\"']?[ \t]*,?[ \t]*$")
_PAIR_VALUE_LINE = re.compile(
    r"^(?P<lead>[ \t]*(?:-[ \t]+)?)(?P<k>[\"']?(?:value|Value|val)[\"']?[ \t]*:[ \t]*)(?P<v>\S.*?)(?P<end>,?)[ \t]*$")


def _mask_pairs(text: str) -> str:
    text = _PAIR_FLOW.sub(lambda m: m.group("head") + keep_quotes(m.group("v").strip())
                          if is_secret_name(m.group("n")) else m.group(0), text)
    if "\n" not in text:
        return text
    lines = text.split("\n")
    column = None  # the name key's column while a secret-named pair is open
    for i, line in enumerate(lines):
        m = _PAIR_NAME_LINE.match(line)
        if m is not None:
            column = len(m.group("lead")) if is_secret_name(m.group("n")) else None
            continue
        if column is None:
            continue
        v = _PAIR_VALUE_LINE.match(line)
        if v is not None and len(v.group("lead")) == column:
            lines[i] = line[:v.start("v")] + keep_quotes(v.group("v")) + v.group("end")
            column = None
        elif line.strip() and len(line) - len(line.lstrip(" \t-")) <= column - 2:
            column = None  # the list item ended before its value
    return "\n".join(lines)


def excerpt(text: object, limit: int, tail: str = "...", one_line: bool = True) -> str:
    """``text`` redacted, then cut to ``limit`` characters (``tail`` marks a cut; whitespace runs
    become one space when ``one_line``). Redacting first matters: a cut can leave the start of a
    secret that no rule recognises any more ("auth=*** sk-E")."""
    text = redact_text(str(text))
    if one_line:
        text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[:max(0, limit - len(tail))] + tail


_OPTION_NAME = re.compile(r"--?[A-Za-z][\w.-]*")

# Where a key file lives is not the key: under a name ending in "key" that is not an API or access
# key (ssh_key, --sign-key, tls_client_key), a path of two or more plain file-name parts is kept.
# Key material never has that shape: a PEM block is redacted whatever its name, and base64 or a
# token carries "+", "=" or no "/" at all.
_KEY_FILE_PATH = re.compile(r"(?:~|\.{1,2})?/(?:[A-Za-z0-9_.@-]+/)+[A-Za-z0-9_.@-]+")
_NOT_FILE_KEYS = frozenset({"api", "apikey", "access", "secret", "auth", "client_secret", "master", "encryption"})


def names_key_file(name: object, value: object) -> bool:
    """True when ``value`` under ``name`` is the path of a key file (readable evidence), not a key."""
    if not isinstance(name, str) or not isinstance(value, str):
        return False
    return _names_a_key_file(name) and _KEY_FILE_PATH.fullmatch(value) is not None


def _names_a_key_file(name: str) -> bool:
    """The name's half of names_key_file: ``ssh_key``, ``tls-client-key`` (not ``api_key``)."""
    return _judge_key_file_name(name) if len(name) <= 128 else _judge_key_file_name.__wrapped__(name)


@lru_cache(maxsize=4096)
def _judge_key_file_name(name: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(name)]
    return len(words) > 1 and words[-1] == "key" and not _NOT_FILE_KEYS.intersection(words[:-1])


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with ``--token X``, ``--token=X``, ``KEY=X`` and secret shapes redacted."""
    out: list[str] = []
    hide_next: str | None = None
    for arg in argv:
        if hide_next is not None:
            out.append(arg if names_key_file(hide_next, arg) else REDACTED)
            hide_next = None
            continue
        if _OPTION_NAME.fullmatch(arg) and is_secret_name(arg.lstrip("-")):
            out.append(arg)
            hide_next = arg.lstrip("-")
            continue
        out.append(redact_text(arg))
    return out


# -- structures --------------------------------------------------------------------------------

# Under a secret key holding a mapping ({"value": X, "source": "/etc/nccl.conf"}), these describe
# where the secret came from and stay readable.
METADATA_KEYS = frozenset({"source", "file", "path", "origin", "line", "lineno", "type", "kind", "present", "set",
                           "defined", "status", "reason"})
# Name/value pairs ({"name": "HF_TOKEN", "value": X}): the name decides for the value.
_PAIR_NAMES = ("name", "key", "Name", "Key", "env", "variable")
_PAIR_VALUES = ("value", "Value", "values", "val", "default")


def _secret_value(value: Any) -> Any:
    """A secret key's value with every scalar replaced; bools and nulls say nothing and stay."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Mapping):
        return {k: (redact(v) if k in METADATA_KEYS else _secret_value(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_secret_value(v) for v in value]
    return REDACTED


_SCALARS = frozenset({int, float, bool, type(None)})


def redact(obj: Any) -> Any:
    """A JSON-like structure with secrets redacted by key name and by value shape."""
    # The exact types of parsed JSON first (a fleet's facts are hundreds of nodes per host), then
    # their subclasses and other mappings and sequences.
    kind = type(obj)
    if kind is str:
        return redact_text(obj)
    if kind in _SCALARS:
        return obj
    if kind is dict or isinstance(obj, Mapping):
        named = None
        for n in _PAIR_NAMES:
            candidate = obj.get(n)
            if isinstance(candidate, str):
                named = candidate
                break
        pair_secret = named is not None and is_secret_name(named)
        out = {}
        for k, v in obj.items():
            kind = type(v)
            if isinstance(k, str):
                if kind is str and _names_a_key_file(k) and _KEY_FILE_PATH.fullmatch(v):
                    out[k] = v
                    continue
                if is_secret_name(k):
                    out[k] = _secret_value(v)
                    continue
            if pair_secret and k in _PAIR_VALUES:
                out[k] = _secret_value(v)
            # The leaves of parsed JSON without a call of their own (a host's facts are ~590 of them).
            elif kind is str:
                out[k] = redact_text(v)
            elif kind in _SCALARS:
                out[k] = v
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, (int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, str) for v in obj):
            # A list of strings may be a command line: ["vllm", "serve", "--api-key", "X"].
            return redact_argv(obj)
        return [redact(v) for v in obj]
    return obj
