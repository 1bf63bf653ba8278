"""Evidence: the run directory, the one redactor, and verification (docs/safety.md).

Everything written into a run directory goes through ``RunDir`` (``write_json``, ``write_text``,
``write_jsonl``, ``append_jsonl``, ``copy_input``, ``copy_inventory``), which redacts, writes
atomically and keeps inside the directory; ``verify_run`` checks a finished run against its
manifest before anyone trusts it. The package exports the redactor's entry points that other
packages call; the rest of the redactor is imported from ``k3fleet.evidence.redact``.
"""

from __future__ import annotations

from k3fleet.evidence.layout import COMMAND, MANIFEST, host_file_name, host_from_file_name
from k3fleet.evidence.redact import REDACTED, is_secret_name, redact, redact_argv, redact_text
from k3fleet.evidence.rundir import (
    EvidenceWriteError,
    JsonEntries,
    RunDir,
    atomic_write,
    new_run_id,
    sha256_file,
)
from k3fleet.evidence.verify import VerifyReport, verify_run

__all__ = [
    "COMMAND",
    "MANIFEST",
    "REDACTED",
    "EvidenceWriteError",
    "JsonEntries",
    "RunDir",
    "VerifyReport",
    "atomic_write",
    "host_file_name",
    "host_from_file_name",
    "is_secret_name",
    "new_run_id",
    "redact",
    "redact_argv",
    "redact_text",
    "sha256_file",
    "verify_run",
]
