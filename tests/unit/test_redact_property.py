"""Property tests of the redactor (docs/safety.md "Redaction"): on long random lines built from the
characters its rules look for, redaction terminates, and a secret planted in any of the shapes it
knows never survives, whatever surrounds it.

Speed is not asserted here (scripts/bench_redact.py prints the time per line length); a quadratic
rule would make these examples, up to ~200,000 characters each, take minutes instead of seconds.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3fleet.evidence import redact, redact_text
from k3fleet.evidence.redact import redact_pieces
from k3fleet.report.escapes import safe_markdown, safe_text

# The characters the rules branch on, plus letters and digits that extend keys, values and runs.
_ALPHABET = "aZ09_-.:=@/\\'\"[]{}(),; \t\n<>$+~|#*!?`\x1b\u202e"
# Units that keep a naive rule retrying at every position when repeated.
_UNITS = ["a=", "a:", '"', '"a', "-a ", "--token ", "a://", "token ", "{'api_key': ['", "bearer ", "http://a:b",
          "hf_", "a", "A" * 7, "=" * 3, "\\\"", "'--api-key', '", "api key ", "-----BEGIN RSA PRIVATE KEY-----"]
# Each shape plants the secret S where a rule must find it.
_SHAPES = [
    "token={S}", "HF_TOKEN={S}", "api_key: {S}", '"password": "{S}"', "'hf_token': '{S}'", "'api_key': ['{S}']",
    "--api-key {S}", "--token={S}", "'--api-key', '{S}'", '["--password", "{S}"]', "https://u:{S}@host/x",
    "https://__token__:{S}@pypi.example/simple", "Authorization: Bearer {S}", "Bearer {S}", "api key: {S}",
    "api key {S}", "bearer token {S}", "access token is {S}", "BMC password {S}", "--build-arg NGC_API_KEY={S}",
    "-e SOME_PASSWORD={S}",
]

_filler = st.one_of(
    st.text(alphabet=_ALPHABET, max_size=3000),
    st.builds(lambda unit, n: unit * n, st.sampled_from(_UNITS), st.integers(min_value=1, max_value=8000)),
)
# A secret: distinct from the filler's characters, long enough to be told apart from them.
_secret = st.text(alphabet="BCDFGHJKLMNPQRSTVWXYZbcdfghjklmnpqrstvwxyz2345678", min_size=10, max_size=24).map(
    lambda s: "Qx" + s)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(before=_filler, shape=st.sampled_from(_SHAPES), secret=_secret, after=_filler)
def test_a_planted_secret_never_survives_a_long_line(before: str, shape: str, secret: str, after: str) -> None:
    # A space on each side: a shape glued to a word would be another word ("xtoken=").
    line = f"{before} {shape.format(S=secret)} {after}"
    out = redact_text(line)
    assert secret not in out
    assert secret not in safe_text(line) and secret not in safe_markdown(line, cell=True)
    assert secret not in str(redact({"message": line, "argv": ["x", line]}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(unit=st.sampled_from(_UNITS), n=st.integers(min_value=10_000, max_value=40_000), tail=_filler)
def test_long_adversarial_lines_terminate(unit: str, n: int, tail: str) -> None:
    line = unit * n + tail
    out = redact_text(line)
    assert isinstance(out, str)
    # Redaction only ever replaces values: what it keeps of the line is the line's own text.
    assert len(out) <= len(line) + 8 * out.count("***")


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=_ALPHABET, max_size=400))
def test_redaction_is_idempotent(text: str) -> None:
    """Evidence is redacted when written and again when printed: the second pass changes nothing."""
    once = redact_text(text)
    assert redact_text(once) == once


# Lines of a long log, among them the shapes whose match runs past a line's end: a private key block, a
# name/value pair in block form, an option continued by a backslash, a flow pair broken after its comma.
_LOG_LINES = [
    "(APIServer pid=1) INFO 08-14 10:00:01 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\n"
    "aFDrBz9vFqU4yQ==\n-----END RSA PRIVATE KEY-----",
    "env:\n  - name: HF_TOKEN\n    value: planted-block-value",
    "vllm serve m --api-key \\\n  planted-continued-value",
    "{name: HF_TOKEN,\n value: planted-flow-value}",
    "HF_TOKEN=planted-plain-value",
    "  indented continuation of the line before",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_LOG_LINES), min_size=1, max_size=60), st.integers(min_value=16, max_value=400))
def test_a_long_text_redacted_in_pieces_is_redacted_as_a_whole(lines: list[str], chunk: int) -> None:
    """Pieces end only where no rule's match continues: joined, they are the whole text redacted, and
    nothing planted survives, wherever the pieces fall."""
    text = "\n".join(lines) + "\n"
    pieces = list(redact_pieces(text, chunk))
    assert "".join(pieces) == redact_text(text)
    assert "planted" not in "".join(pieces) and "MIIEow" not in "".join(pieces)
