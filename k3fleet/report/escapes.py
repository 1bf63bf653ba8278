"""Text made safe to display: secrets redacted, terminal escapes and control characters removed,
markup escaped for where it goes.

Host names, reasons, messages and versions come from the nodes; server messages and model ids
from the serving endpoint; reviewer names, hosts and owners files from the operator. None of them
may move the cursor, recolour, retitle or hide text on the operator's terminal, inject Rich
markup (or crash the printout with it), inject Markdown table rows or HTML into a report; and
what the terminal shows (often kept in CI logs) passes the same redactor as the evidence
(docs/safety.md "Redaction", "Display"). Stored files keep the text as given (redacted); every
renderer escapes it for its own format with the functions here:

- ``safe_text``: plain text (terminal, one line by default);
- ``safe_markup``: a value interpolated into a Rich markup string;
- ``safe_rich_text``: a Rich ``Text`` about to be printed (``k3fleet.cli.base``'s consoles call it
  for everything they print, markup already parsed);
- ``safe_json``: a structure about to be dumped as JSON (structural redaction);
- ``safe_markdown``, ``safe_html``: a value in a Markdown report or an HTML page.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

# The rules module itself (stdlib only): printing must not import the whole evidence package.
from k3fleet.evidence.redact import redact, redact_text

if TYPE_CHECKING:
    from rich.text import Text

# ESC [ ... final (CSI), ESC ] ... BEL/ST (OSC), ESC P/X/^/_ ... ST (DCS, SOS, PM, APC), two-byte ESC
# sequences, the 8-bit CSI/OSC forms, then every other C0/C1 control and the bidi overrides.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x9d[^\x07\x9c]*[\x07\x9c]?"
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NEWLINES = re.compile(r"[\t\n]+")
# Markdown: backslash, code spans, links and raw HTML; a table cell also its pipes.
_MARKDOWN = re.compile(r"[\\`\[\]<]")
_MARKDOWN_CELL = re.compile(r"[\\`\[\]<|]")


def safe_text(text: object, *, one_line: bool = True) -> str:
    """``text`` redacted, without terminal escapes or control characters (newlines and tabs become
    spaces when ``one_line``)."""
    s = "" if text is None else str(text)
    # Redacted before and after the escapes go: an escape can swallow the first letter of a key
    # ("\x1b[ token=..." loses its "t" to the CSI) and removing one can join a key split by it.
    s = redact_text(_CONTROLS.sub("", _ESCAPES.sub("", redact_text(s))))
    if one_line:
        s = _NEWLINES.sub(" ", s)
    return s


def safe_markup(text: object, *, one_line: bool = True) -> str:
    """``safe_text`` with Rich markup escaped: for a value inside a string printed with markup on."""
    from rich.markup import escape  # lazy: Rich only for the terminal (the file renderers use this module)

    return escape(safe_text(text, one_line=one_line))


def safe_markdown(text: object, *, cell: bool = False, code: bool = False) -> str:
    """``safe_text`` for a Markdown report: one line, code spans, links and HTML escaped (and
    table pipes in a ``cell``). Inside a code span (``code``) nothing is markup but its closing
    backtick, which becomes a quote (a backslash does not escape there)."""
    s = safe_text(text)
    if code:
        s = s.replace("`", "'")
        return s.replace("|", "\\|") if cell else s
    return (_MARKDOWN_CELL if cell else _MARKDOWN).sub(lambda m: "\\" + m.group(0), s)


def safe_html(text: object, quote: bool = True) -> str:
    """``safe_text`` (lines kept) HTML-escaped: for element text and quoted attribute values."""
    return html.escape(safe_text(text, one_line=False), quote=quote)


def safe_json(data: Any) -> Any:
    """``data`` redacted structurally (by key name and value shape), ready to be dumped as JSON.

    Control characters stay in the values: a JSON dump escapes them (``ensure_ascii``), so the
    values print as given without reaching the terminal raw."""
    return redact(data)


def safe_rich_text(text: Text) -> Text:
    """A Rich ``Text`` with its plain text passed through ``safe_text`` (lines kept), styles kept.

    Secrets and control characters are found in the whole text, so one split by styles cannot
    hide them: when cleaning each styled piece alone would not give the clean whole, the clean
    whole is printed without its styles."""
    # lazy: Rich only for the terminal (the file renderers use this module)
    from rich.text import Span
    from rich.text import Text as RichText

    plain = text.plain
    clean = safe_text(plain, one_line=False)
    if clean == plain:
        return text
    cuts = sorted({i for span in text.spans for i in (span.start, span.end) if 0 < i < len(plain)})
    pieces = list(text.divide(cuts)) if text.spans else [text]
    cleaned = [safe_text(p.plain, one_line=False) for p in pieces]
    out = RichText(style=text.style, justify=text.justify, overflow=text.overflow, no_wrap=text.no_wrap,
                   end=text.end, tab_size=text.tab_size)
    if "".join(cleaned) != clean:
        out.append(clean)
        return out
    for piece, part in zip(pieces, cleaned, strict=True):
        out.append_text(RichText(part, spans=[Span(0, len(part), s.style) for s in piece.spans]))
    return out
