"""The go-live decision: evidence -> one of four outcomes, the signed checklist, one evidence package.

Public API::

    decide(summary: EvidenceSummary) -> Decision           pure: the decision table (rules.RULES)
    build_checklist(summary) -> list[ChecklistItem]         pure: the sign-off checklist
    run_decide(DecideOptions, argv) -> DecideResult         verify + read runs, decide, write, package
    verify_package(archive, allowed_signers) -> PackageCheck  ``k3fleet verify-evidence``: members and signature
    signing_key(path) -> SigningKey                         an OpenSSH key that has shown it can sign (signing.py)

docs/decision.md describes the table, the checklist, the package and the baseline.
"""

from __future__ import annotations

from k3fleet.decide.checklist import build_checklist
from k3fleet.decide.rules import RULES, decide
from k3fleet.models.evidence import Decision, EvidenceSummary

__all__ = ["RULES", "Decision", "EvidenceSummary", "build_checklist", "decide"]
