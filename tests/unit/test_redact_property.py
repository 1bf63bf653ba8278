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
