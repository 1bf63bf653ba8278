"""Node text made safe to display: secrets redacted, terminal escapes and control characters removed.

Host names, reasons, messages and versions come from the nodes; a node (or whoever controls
its output) must not be able to move the cursor, recolour, retitle or hide text on the
operator's terminal, nor inject Markdown table rows into the report; and what the terminal
shows (often kept in CI logs) passes the same redactor as the evidence (docs/safety.md).
"""

from __future__ import annotations

import re

from k3fleet.evidence.redact import redact_text

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
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NEWLINES = re.compile(r"[\t\n]+")


def safe_text(text: object, *, one_line: bool = True) -> str:
    """``text`` redacted, without terminal escapes or control characters (newlines and tabs become
    spaces when ``one_line``)."""
    s = "" if text is None else str(text)
    s = redact_text(_CONTROLS.sub("", _ESCAPES.sub("", s)))
    if one_line:
        s = _NEWLINES.sub(" ", s)
    return s
