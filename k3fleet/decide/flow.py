"""``k3fleet decide``: verify and read the runs, decide, write the decision's run directory and package.

The decision itself is :func:`k3fleet.decide.rules.decide` (pure); everything with I/O is here.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from k3fleet.accept.profile_cases import write_profile_evidence
from k3fleet.bounds import load_yaml, read_input
from k3fleet.decide.checklist import ITEM_IDS, image_repository
from k3fleet.decide.envelope import profile_brief
from k3fleet.decide.package import check_member_name, write_package
from k3fleet.decide.readers import (
    curve_points,
    merge_accept,
    open_run,
    read_accept,
    read_audit,
    read_change,
    read_target,
    read_triage,
    target_brief,
)
from k3fleet.decide.rules import decide
from k3fleet.decide.signing import SigningKey, signing_key
from k3fleet.errors import UsageError, validated
from k3fleet.evidence import RunDir, layout, sha256_file
from k3fleet.evidence.reader import RunReader
from k3fleet.evidence.writer import check_output, is_stdout
from k3fleet.models.evidence import (
    AcceptEvidence,
    AuditEvidence,
    ChangeEvidence,
    CustomBuild,
    Decision,
    EvidenceSummary,
    OwnersFile,
    Policy,
    Ref,
    RunInfo,
    TargetBrief,
    TriageEvidence,
)
from k3fleet.models.profile import load_profile
from k3fleet.report.decision_md import render_markdown
from k3fleet.report.view import decision_view
from k3fleet.targets import load_target


@dataclass
class DecideOptions:
    runs: list[Path]
    reviewer: str
    owner: str | None = None
    owners_file: Path | None = None
    build_file: Path | None = None
    target: Path | None = None
    out: Path | None = None
    runs_dir: Path = field(default_factory=lambda: Path("runs"))
    archive: Path | None = None
    policy: Policy = field(default_factory=Policy)
    sign_key: Path | None = None
    force: bool = False  # replace an existing --archive file
    profile: Path | None = None  # the production profile the evidence is held against
    second_reviewer: str | None = None
    rollback_owner: str | None = None


@dataclass
class DecideResult:
    decision: Decision
    summary: EvidenceSummary
    run_dir: RunDir
    archive: Path
    archive_sha256: str
    signer: SigningKey | None = None


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0)


def _yaml_file(path: Path, what: str) -> Any:
    raw = read_input(path, what, kind="a YAML file", limit="record")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path} cannot be read: {exc}") from exc
    try:
        return load_yaml(text, f"{what} {path}")  # depth and alias budget first (k3fleet.bounds)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{what} {path} is not valid YAML{where}") from exc


def load_owners(path: Path) -> OwnersFile:
    data = _yaml_file(path, "owners file")
    owners = validated(OwnersFile, data, f"owners file {path}", "expected a mapping with 'items:'")
    unknown = sorted(set(owners.items) - set(ITEM_IDS))
    if unknown:
        raise UsageError(f"owners file {path}: items.{unknown[0]}: not a checklist item "
                         f"(known: {', '.join(ITEM_IDS)})")
    bad = sorted(set(owners.limits) - set(LIMIT_KINDS))
    if bad:
        raise UsageError(f"owners file {path}: limits.{bad[0]}: not a limit kind (known: {', '.join(LIMIT_KINDS)})")
    return owners


# The kinds of limit a decision can set (k3fleet/decide/rules.py), each owned through owners.yaml ``limits:``.
LIMIT_KINDS = ("concurrency_ceiling", "max_context_tokens", "rate_limit", "retry", "hosts_left_out",
               "tested_envelope")


def load_build(path: Path) -> CustomBuild:
    data = _yaml_file(path, "build record")
    return validated(CustomBuild, data, f"build record {path}", "expected a mapping")


def validate_name(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    name = value.strip()
    if not name or len(name) > 128 or any(ch in name for ch in "\n\r\t\x00"):
        raise UsageError(f"{option} {value!r} is not valid: one line, at most 128 characters")
    return name


@dataclass
class Sources:
    runs: list[RunInfo] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)
    audits: list[AuditEvidence] = field(default_factory=list)
    changes: list[ChangeEvidence] = field(default_factory=list)
    accepts: list[AcceptEvidence] = field(default_factory=list)
    triage: list[TriageEvidence] = field(default_factory=list)
    targets: list[TargetBrief] = field(default_factory=list)


def read_sources(paths: Sequence[Path]) -> Sources:
    """Verify and read every run; labels stay unique (a repeated directory name gets a suffix)."""
    src = Sources()
    seen: set[Path] = set()
    for path in paths:
        real = path.resolve()
        if real in seen:
            raise UsageError(f"run {path} is given twice")
        seen.add(real)
        label = check_member_name(path.name, "run label")
        n = 2
        while label in src.paths:
            label = f"{path.name}-{n}"
            n += 1
        info, _ = open_run(path, label=label)
        src.runs.append(info)
        src.paths[label] = path
        if info.kind == "audit":
            src.audits.append(read_audit(path, info))
            tb = read_target(path, label)
            if tb is not None:
                src.targets.append(tb)
        elif info.kind == "change":
            src.changes.append(read_change(path, info))
        elif info.kind == "accept":
            src.accepts.append(read_accept(path, info))
        else:
            src.triage.append(read_triage(path, info))
    return src


def _newest(items: Sequence[Any]) -> Any:
    return max(items, key=lambda x: x.started_at or "") if items else None


def build_summary(src: Sources, opts: DecideOptions, reviewed_at: str) -> EvidenceSummary:
    if src.targets and opts.target is None:
        # The target the newest audit recorded: the runs' own, not one derived again.
        newest_audit = _newest(src.audits)
        target = next((t for t in src.targets if t.ref and t.ref.run == newest_audit.run), src.targets[0])
    else:
        # --target, or (no run records one) the CLI's default, the packaged target.
        target = target_brief(load_target(opts.target))
    owners = load_owners(opts.owners_file) if opts.owners_file else None
    build = load_build(opts.build_file) if opts.build_file else None
    profile = None
    if opts.profile is not None:
        profile = profile_brief(load_profile(opts.profile), Ref(run="decision", file=layout.PROFILE_SOURCE))
    summary = EvidenceSummary(
        runs=src.runs, target=target, audit=_newest(src.audits), change=_newest(src.changes),
        accept=merge_accept(src.accepts), triage=src.triage, owners=owners,
        owners_ref=Ref(run="decision", file=layout.OWNERS_SOURCE) if owners else None, build=build,
        build_ref=Ref(run="decision", file=layout.BUILD_SOURCE) if build else None,
        reviewer=validate_name(opts.reviewer, "--reviewer"), reviewed_at=reviewed_at,
        service_owner=validate_name(opts.owner, "--owner"), policy=opts.policy,
        second_reviewer=validate_name(opts.second_reviewer, "--second-reviewer"),
        rollback_owner=validate_name(opts.rollback_owner, "--rollback-owner"), profile=profile,
        signed=opts.sign_key is not None)
    _refuse_mixed_tracks(summary, src)
    return summary


def _refuse_mixed_tracks(s: EvidenceSummary, src: Sources) -> None:
    """Official-image and custom-build results are separate tracks: never decided together."""
    repos: dict[str, list[str]] = {}
    for acc in src.accepts:
        if acc.startup is not None and acc.startup.image:
            repo = image_repository(acc.startup.image) or acc.startup.image
            repos.setdefault("official" if repo == s.target.image_repository else "custom", []).append(acc.run)
    if len(repos) > 1:
        raise UsageError(f"runs mix official-image evidence ({', '.join(repos['official'])}) with custom-build "
                         f"evidence ({', '.join(repos['custom'])}): decide each track separately")


def _jsonable(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


def run_decide(opts: DecideOptions, argv: Sequence[str]) -> DecideResult:
    if not opts.runs:
        raise UsageError("give at least one run directory (audit, change, accept or triage)")
    if not opts.reviewer or not opts.reviewer.strip():
        raise UsageError("--reviewer NAME is required: a decision is signed by a named reviewer")
    validate_name(opts.reviewer, "--reviewer")
    # A key that cannot sign (missing, unreadable, encrypted without the agent) fails before anything is written.
    key = signing_key(opts.sign_key) if opts.sign_key is not None else None
    if opts.out is not None:
        check_member_name(opts.out.name, "--out")  # the package's root is named after it
    src = read_sources(opts.runs)
    # The archive may not land in a run it packages (it would change that run under its manifest),
    # nor replace anything without --force: refused before the decision's run directory exists.
    archive_inputs = [*src.paths.values(), *([opts.out] if opts.out is not None else [])]
    if opts.archive is not None:
        if is_stdout(opts.archive):
            raise UsageError("--archive -: an evidence package is written to a file, not to stdout")
        check_output(opts.archive, "--archive", force=opts.force, inputs=archive_inputs)
    elif opts.out is not None:
        # The default archive sits beside --out: judged now too, not after the decision is written.
        check_output(layout.package_beside(opts.out), "evidence package", force=opts.force,
                     inputs=archive_inputs)
    now = _now()
    summary = build_summary(src, opts, now.isoformat())
    decision = decide(summary)
    rd = RunDir.create(opts.runs_dir, "decision", argv, out=opts.out)
    if opts.owners_file is not None:
        rd.copy_input(opts.owners_file, layout.OWNERS_SOURCE)
    if opts.build_file is not None:
        rd.copy_input(opts.build_file, layout.BUILD_SOURCE)
    if opts.target is not None:
        rd.copy_input(opts.target, layout.TARGET_SOURCE)
    if opts.profile is not None:
        write_profile_evidence(rd, load_profile(opts.profile))
    rd.write_json(layout.SUMMARY, _jsonable(summary))
    rd.write_json(layout.CHECKLIST, [_jsonable(i) for i in decision.checklist])
    rd.write_json(layout.DECISION, _jsonable(decision))
    if decision.baseline is not None:
        rd.write_json(layout.BASELINE, _jsonable(decision.baseline))
    curves = _curves(src)
    if curves:
        rd.write_json(layout.CURVES, curves)
    rd.write_text(layout.REPORT, render_markdown(decision_view(decision, summary, rd.path.name, curves)))
    rd.write_manifest()
    # The decision's files were written relative to the directory claimed; it is read back by its path (the
    # command line, then to be packaged), so that path must still be that directory, not a link swapped in.
    rd.check_claim()
    archive = opts.archive or layout.package_beside(rd.path)
    operators = sorted({r.user for r in src.runs if r.user} | {r.operator for r in src.runs if r.operator}
                       | {c.operator for c in src.changes if c.operator})
    meta = {
        "decision_id": rd.path.name,
        "decision": {"outcome": decision.outcome, "approved": decision.approved, "exit_code": decision.exit_code,
                     "track": decision.track},
        "reviewer": summary.reviewer, "reviewed_at": summary.reviewed_at, "service_owner": summary.service_owner,
        "second_reviewer": summary.second_reviewer, "rollback_owner": summary.rollback_owner,
        "rate_limits": decision.rate_limits,
        "profile": ({"name": summary.profile.name, "sha256": summary.profile.sha256} if summary.profile else None),
        "operators": operators,
        "target": {"name": summary.target.name, "image": summary.target.image,
                   "file": str(summary.target.ref) if summary.target.ref else
                   (str(opts.target) if opts.target else "packaged default")},
        "runs": [{"label": r.label, "kind": r.kind, "started_at": r.started_at, "argv": r.argv, "user": r.user,
                  "k3fleet_version": r.k3fleet_version, "operator_supplied": r.operator_supplied}
                 for r in src.runs],
        "command": _command_argv(rd),
    }
    write_package(archive, rd.path.name, rd.path, [(lbl, p) for lbl, p in src.paths.items()], meta, mtime=now,
                  sign=key, force=opts.force, inputs=[*archive_inputs, rd.path])

    return DecideResult(decision=decision, summary=summary, run_dir=rd, archive=archive,
                        archive_sha256=sha256_file(archive), signer=key)


def _curves(src: Sources) -> list[dict[str, Any]]:
    """The load curves of the acceptance run whose load probe the decision used (for the reports)."""
    merged = merge_accept(src.accepts)
    if merged is None or merged.load is None:
        return []
    run = RunReader(src.paths[merged.load.ref.run], merged.load.ref.run)
    data = run.object(merged.load.ref.file).get("data") or {}
    return curve_points(run, data if isinstance(data, dict) else {})


def _command_argv(rd: RunDir) -> list[str]:
    return list(RunReader(rd.path).command.argv)
