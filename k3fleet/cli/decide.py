"""`k3fleet decide`, `verify-evidence`, `report`, `triage` and `watch`: from evidence to a signed decision.

Exit codes as everywhere: 0 go / intact and signed by an allowed signer, 1 no-go / a signature that
fails, 2 usage or bad input, 3 evidence missing, tampered, incomplete or unsigned (docs/decision.md).
"""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from k3fleet.bounds import seconds_option
from k3fleet.cli.base import app, err, out
from k3fleet.contracts import EXIT_OK
from k3fleet.errors import UsageError

if TYPE_CHECKING:
    from k3fleet.models.findings import Finding

_ITEM_STYLE = {"pass": "green", "fail": "red", "missing": "yellow"}


@app.command()
def decide(
    runs: Annotated[list[Path], typer.Argument(help="Run directories: audit, change, accept, triage.",
                                               show_default=False)],
    reviewer: Annotated[str, typer.Option("--reviewer", help="Who signs the decision (required).")],
    owner: Annotated[str | None, typer.Option("--owner", help="The service owner accountable for the limits.")] = None,
    owners: Annotated[Path | None, typer.Option("--owners", help="YAML: owner, deadline and rollback per failed "
                                                                 "checklist item.")] = None,
    build: Annotated[Path | None, typer.Option("--build", help="YAML: the custom-build record (source branch, "
                                                               "commit, lockfile, build command, digest, rollback "
                                                               "image).")] = None,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (default: the audit's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON on stdout.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Decision run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    archive: Annotated[Path | None, typer.Option("--archive", help="Evidence package path (default: the "
                                                                   "run directory's name + .tar.gz).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --archive file.")] = False,
    sign_key: Annotated[Path | None, typer.Option("--sign-key", help="OpenSSH key that signs the package "
                                                                     "(ssh-keygen -Y sign, namespace "
                                                                     "k3fleet-evidence; an encrypted key needs "
                                                                     "ssh-agent).")] = None,
    profile: Annotated[Path | None, typer.Option("--profile", help="Production profile (YAML) the tested envelope "
                                                                   "must cover; without it the decision cannot be "
                                                                   "go_live.")] = None,
    second_reviewer: Annotated[str | None, typer.Option("--second-reviewer", help="A second reviewer, recorded "
                                                                                   "beside --reviewer.")] = None,
    rollback_owner: Annotated[str | None, typer.Option("--rollback-owner", help="Who rolls the service back when "
                                                                                 "watch fires (required for "
                                                                                 "approval).")] = None,
) -> None:
    """Decide go-live from the evidence: one of four outcomes, the checklist, one evidence package."""
    from k3fleet.decide.flow import DecideOptions, run_decide
    from k3fleet.evidence import layout

    opts = DecideOptions(runs=list(runs), reviewer=reviewer, owner=owner, owners_file=owners, build_file=build,
                         target=target, out=out_dir, runs_dir=runs_dir, archive=archive, sign_key=sign_key,
                         force=force, profile=profile, second_reviewer=second_reviewer, rollback_owner=rollback_owner)
    result = run_decide(opts, sys.argv)
    d = result.decision
    if as_json:
        out.print_json(json.dumps(d.model_dump(mode="json")))
    else:
        _print_decision(d)
        out.print(f"full checklist: {result.run_dir.path / layout.REPORT} ({layout.CHECKLIST} beside it)",
                  markup=False)
    for warning in d.warnings:
        err.print(f"warning: {warning}", markup=False)
    err.print(f"run directory: {result.run_dir.path}")
    err.print(f"evidence package: {result.archive} (sha256 {result.archive_sha256})", markup=False)
    if result.signer is not None:
        err.print(f"signed: {result.signer.key_type} key {result.signer.fingerprint} (namespace k3fleet-evidence)",
                  markup=False)
    elif d.draft:
        err.print(f"DRAFT: the evidence supports {d.outcome}, but go-live needs a reviewer's signature: run decide "
                  "again with --sign-key KEY (exit 3 until then)", markup=False)
    else:
        err.print("unsigned: verify-evidence will not call it trusted; sign with --sign-key KEY", markup=False)
    raise typer.Exit(d.exit_code)


def _print_decision(d: object) -> None:
    from k3fleet.models.evidence import Decision
    from k3fleet.report.terminal import outcome_style, wrapped
    from k3fleet.report.view import approval_words

    assert isinstance(d, Decision)
    # The outcome first, then what is not proven and who owns it; the whole checklist (detail,
    # evidence) is in the run directory (checklist.json, report.md), not 150 lines here.
    style = outcome_style(d.outcome)
    approval = approval_words(d.approved, d.draft)
    out.print(f"decision: [{style}]{d.outcome}[/{style}] ({approval}, exit {d.exit_code})")
    for r in d.reasons:
        # Whole and wrapped, the rule id first: a rule naming 700 hosts names them in report.md, and its
        # text says so (the rules cap their host lists).
        out.print(wrapped(f"[{r.rule}] {r.text}", out.width - 1), markup=False, soft_wrap=False)
    open_items = [i for i in d.checklist if i.status != "pass"]
    passed = len(d.checklist) - len(open_items)
    out.print(f"checklist: {passed} of {len(d.checklist)} items pass; not passed:" if open_items
              else f"checklist: all {len(d.checklist)} items pass", markup=False)
    for item in open_items:
        st = _ITEM_STYLE.get(item.status, "white")
        owner = (f"owner {item.owner.owner}, by {item.owner.deadline}" if item.owner is not None
                 else "no owner: give --owners FILE")
        out.print(f"  [{st}]{item.status:<7}[/{st}] {escape(item.title)} [dim]({escape(owner)})[/dim]")
    for lim in d.limits:
        own = ", ".join(f"{k} {v}" for k, v in (("owner", lim.owner), ("deadline", lim.deadline),
                                                 ("rollback", lim.rollback)) if v)
        out.print(f"  limit {lim.kind}: {lim.text}" + (f" ({own})" if own else ""), markup=False)
    if d.missing:
        out.print(f"missing evidence: {', '.join(d.missing)}", markup=False)
    for u in d.unproven:
        out.print(f"unproven: {u}", markup=False)
    if d.approved:
        out.print(f"rollback owner: {d.rollback_owner}; rate limits in force: "
                  + ("; ".join(d.rate_limits) or "none"), markup=False)
    people = f"reviewer {d.reviewer}" + (f", second reviewer {d.second_reviewer}" if d.second_reviewer else "")
    out.print(f"{people}; evidence run by {', '.join(d.operators) or 'nobody recorded'}", markup=False)


@app.command("verify-evidence")
def verify_evidence(
    archive: Annotated[Path, typer.Argument(help="An evidence package (.tar.gz) written by k3fleet decide.")],
    allowed_signers: Annotated[Path | None, typer.Option("--allowed-signers", help="OpenSSH allowed-signers "
                                                                                   "file: who may sign evidence "
                                                                                   "(principal namespaces="
                                                                                   "\"k3fleet-evidence\" KEY).")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
    runs_dir: Annotated[list[Path] | None, typer.Option("--runs-dir", help="The runs tree a later decision "
                                                                           "would be in (repeatable; default: "
                                                                           "the archive's directory).")] = None,
    max_age: Annotated[str | None, typer.Option("--max-age", help="Refuse an approval older than this (30d, "
                                                                  "12h; at most 3650d).")] = None,
) -> None:
    """Check an evidence package: every member against PACKAGE.json and every run against its own manifest,
    PACKAGE.json's signature against --allowed-signers and the reviewer it names, and that no later decision
    replaced it. Exit 0 intact and signed by the reviewer, 1 the signature fails or the approval is replaced
    or too old, 3 any difference, unsigned, or the signature not checked."""
    from k3fleet.bounds import parse_seconds
    from k3fleet.decide.package import check_fresh, verify_package
    from k3fleet.evidence import sha256_file

    age = parse_seconds(max_age, "--max-age", "--max-age") if max_age is not None else None
    res = verify_package(archive, allowed_signers)
    if res.trusted:
        check_fresh(res, runs_dir or [archive.parent], age)
    digest = sha256_file(archive)
    if as_json:
        s = res.signer
        out.print_json(json.dumps({
            "archive": str(archive), "sha256": digest, "ok": res.exit_code == EXIT_OK, "intact": res.ok,
            "exit_code": res.exit_code, "files_checked": res.checked, "problems": res.problems,
            "reviewer": res.reviewer, "reviewed_at": res.reviewed_at.isoformat() if res.reviewed_at else None,
            "decision": (res.manifest or {}).get("decision"), "superseded": res.stale,
            "signature": {"status": res.signature, "problem": res.signature_problem,
                          "principal": s.principal if s else None, "key_type": s.key_type if s else None,
                          "key_fingerprint": s.fingerprint if s else None, "claimed": res.claimed_signer}}))
    else:
        _print_package_check(res, archive, digest)
    if res.exit_code != EXIT_OK:
        err.print(f"k3fleet: {archive}: {_package_verdict(res)}", markup=False)
    raise typer.Exit(res.exit_code)


def _package_verdict(res: object) -> str:
    from k3fleet.decide.package import FAILED, UNCHECKED, UNSIGNED, PackageCheck
    from k3fleet.report.escapes import safe_text

    assert isinstance(res, PackageCheck)
    if res.signature == FAILED:
        return f"signature FAILED: {safe_text(res.signature_problem)}"
    if res.stale is not None and res.trusted:
        return f"not the approval to act on: {safe_text(res.stale)}"
    if not res.ok:
        return f"{len(res.problems)} difference(s): the package is not intact"
    if res.signature == UNSIGNED:
        return ("unsigned: its files match PACKAGE.json, but anyone can rewrite both; nothing proves who "
                "wrote it (sign with k3fleet decide --sign-key KEY)")
    if res.signature == UNCHECKED:
        fp = (res.claimed_signer or {}).get("key_fingerprint", "?")
        return (f"signed (PACKAGE.json names key {safe_text(fp)}), signature not checked: give "
                "--allowed-signers FILE")
    return "intact"


def _print_package_check(res: object, archive: Path, digest: str) -> None:
    from k3fleet.decide.package import FAILED, UNCHECKED, VERIFIED, PackageCheck
    from k3fleet.report.escapes import safe_text

    assert isinstance(res, PackageCheck)
    for p in res.problems:
        out.print(f"DIFFERENT  {safe_text(p)}", markup=False)
    out.print(f"archive: {safe_text(archive.name)} sha256 {digest}", markup=False)
    manifest: dict[str, Any] = res.manifest if isinstance(res.manifest, dict) else {}
    dec = manifest.get("decision")
    dec = dec if isinstance(dec, dict) else {}
    what = f"{safe_text(dec.get('outcome', '?'))}, reviewer {safe_text(manifest.get('reviewer', '?'))}"
    s = res.signer
    if res.signature == FAILED:
        out.print(f"SIGNATURE FAILED  {safe_text(res.signature_problem)}", markup=False)
    if res.signature == VERIFIED and s is not None:
        out.print(f"signed by {safe_text(s.principal)} ({s.key_type} key {s.fingerprint}), namespace "
                  "k3fleet-evidence", markup=False)
        verb = "approved" if dec.get("approved") is True else "decided"
        when = res.reviewed_at.isoformat() if res.reviewed_at else "?"
        named = manifest.get("decision_id") or res.root
        out.print(f"{verb} by {safe_text(res.reviewer)} at {when}: {safe_text(dec.get('outcome', '?'))} "
                  f"(decision {safe_text(named)})", markup=False)
    if res.trusted:
        out.print(f"intact: {res.checked} files match {safe_text(archive.name)} ({what})", markup=False)
    elif res.ok:
        word = {FAILED: "signature FAILED", UNCHECKED: "signature not checked"}.get(res.signature, "unsigned")
        out.print(f"{word}: {res.checked} files match PACKAGE.json ({what}); not trusted", markup=False)


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="An audit, change, accept, triage or decision run directory.")],
    fmt: Annotated[str, typer.Option("--format", help="md, html, junit or prom.")] = "md",
    out_file: Annotated[Path | None, typer.Option("--out", help="Write here (atomically; - for stdout) instead "
                                                                "of stdout. Never a link, device or directory, "
                                                                "nor inside RUN.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
) -> None:
    """Render a run for people (Markdown, HTML), CI (JUnit XML) or node_exporter (Prometheus textfile)."""
    from k3fleet.decide.views import load_view
    from k3fleet.evidence.writer import STDOUT, check_output, is_stdout, write_output
    from k3fleet.report.render import FORMATS, render

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if out_file is not None and not is_stdout(out_file):
        check_output(out_file, "--out", force=force, inputs=[run])  # refused before the run is read
    view = load_view(run)
    text = render(view, fmt)
    write_output(out_file or Path(STDOUT), text.encode("utf-8"), "--out", force=force, inputs=[run])
    if out_file is not None and not is_stdout(out_file):
        err.print(f"wrote {out_file}", markup=False)


@app.command()
def triage(
    files: Annotated[list[Path], typer.Argument(help="Captured text: nvidia-smi (table or -q), "
                                                     "/proc/driver/nvidia/version, Fabric Manager status or "
                                                     "journal, ibstat, ibv_devinfo, docker inspect, container "
                                                     "start errors, vLLM start-up logs, /metrics.",
                                                show_default=False)],
    host: Annotated[str, typer.Option("--host", help="The node the captures come from.")] = "capture",
    kind: Annotated[str | None, typer.Option("--kind", help="Read every file as this kind instead of "
                                                             "sniffing it.")] = None,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (default: Kimi K3).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print triage.json on stdout.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
) -> None:
    """Judge raw captured text with the audit's parsers and rules; the run can enter decide."""
    from k3fleet.targets import load_target
    from k3fleet.triage import KINDS, write_run
    from k3fleet.triage import triage as run_triage

    if kind is not None and kind not in KINDS:
        raise UsageError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    if not host.strip() or any(ch in host for ch in "\n\r\t/"):
        raise UsageError(f"--host {host!r} is not a host name")
    result = run_triage(files, host=host.strip(), target=load_target(target), kinds=[kind] * len(files))
    rd = write_run(result, sys.argv, runs_dir=runs_dir, out=out_dir)
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        from k3fleet.report.terminal import whole_column

        table = Table(title=f"triage: {escape(result.host)} (operator-supplied)")
        table.add_column("file", overflow="fold")
        table.add_column("kind", overflow="fold")
        whole_column(table, "finding", (f.check_id for f in result.findings))
        table.add_column("severity", no_wrap=True)
        table.add_column("message", overflow="fold", ratio=1)
        by_file: dict[str, list[Finding]] = {}
        for f in result.findings:
            by_file.setdefault(str(f.evidence.get("file")), []).append(f)
        from k3fleet.triage import stored_name

        for i, c in enumerate(result.captures):
            found = by_file.get(stored_name(i, c), [])
            if not found:
                table.add_row(escape(c.name), c.kind, "-", "", "nothing wrong in this capture")
            for f in found:
                table.add_row(escape(c.name), c.kind, escape(f.check_id), f.severity, escape(f.message))
        out.print(table)
    err.print(f"run directory: {rd.path}")
    raise typer.Exit(result.exit_code)


@app.command()
def watch(
    base_url: Annotated[str, typer.Option("--base-url", help="The serving endpoint, e.g. http://10.0.0.5:8000.")],
    baseline: Annotated[Path, typer.Option("--baseline", help="The approved decision's signed .tar.gz evidence "
                                                              "package (or its run directory, with the package "
                                                              "beside it).")],
    allowed_signers: Annotated[Path | None, typer.Option("--allowed-signers", help="OpenSSH allowed-signers file "
                                                                                   "the package's signature must "
                                                                                   "verify against "
                                                                                   "(required).")] = None,
    duration: Annotated[str, typer.Option("--for", help="Length of the watch window (90s, 15m, 2h; at most "
                                                        "7d).")] = "15m",
    interval: Annotated[float, typer.Option("--interval", parser=seconds_option("--interval", "watch --interval"),
                                            help="Seconds between samples (0.1 to 86400).")] = 15.0,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Bad intervals in a row before a trigger "
                                                                "fires.")] = 2,
    cache_tolerance: Annotated[float, typer.Option("--cache-tolerance", min=0.0, max=1.0,
                                                   help="Allowed drop of the cache hit ratio (0.5: half).")] = 0.5,
    latency_tolerance: Annotated[float, typer.Option("--latency-tolerance", min=0.0, max=100.0,
                                                     help="Allowed rise of the mean prefill time before a lower "
                                                          "hit ratio counts (0.5: half again).")] = 0.5,
    min_requests: Annotated[int, typer.Option("--min-requests", min=1,
                                              help="Real requests (the watch's own probe not counted) a window "
                                                   "must hold before a ratio or rate trigger can fire.")] = 20,
    samples: Annotated[int | None, typer.Option("--samples", min=1, help="End the window after this many samples "
                                                                         "(else --for decides).")] = None,
    node_log: Annotated[list[Path] | None, typer.Option("--node-log", help="A node's kernel log or journal file "
                                                                           "(dmesg, journalctl -k) to judge for "
                                                                           "Xid and NCCL errors since the approval "
                                                                           "(repeatable; read again each "
                                                                           "interval).")] = None,
    agent_every: Annotated[int, typer.Option("--agent-every", min=0, help="Sample the critical tool-call cases "
                                                                          "every N intervals (0: never).")] = 1,
    agent_case: Annotated[list[str] | None, typer.Option("--agent-case", help="Critical case to sample "
                                                                              "(repeatable).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Served model (default: the baseline's).")] = None,
    api_key_env: Annotated[str | None, typer.Option("--api-key-env", help="Environment variable holding the "
                                                                          "API key.")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Turn TLS verification off.")] = False,
    telemetry_url: Annotated[str | None, typer.Option("--telemetry-url", help="A DCGM exporter's /metrics URL: "
                                                      "each sample keeps every GPU's memory, power and "
                                                      "utilisation.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    target: Annotated[Path | None, typer.Option("--target", help="Target to judge --node-log by when the "
                                                                 "decision's package records none (default: "
                                                                 "Kimi K3).")] = None,
    max_age: Annotated[str | None, typer.Option("--max-age", help="Refuse an approval older than this (30d, "
                                                                  "12h; at most 3650d).")] = None,
) -> None:
    """Watch a served model after approval; exit 1 with the trigger and the rollback artifact when one fires."""
    from k3fleet.bounds import parse_seconds
    from k3fleet.decide.watch import DEFAULT_AGENT_CASES, Sample, Trigger, WatchOptions, parse_duration, run_watch
    from k3fleet.targets import load_target

    opts = WatchOptions(base_url=base_url, baseline=baseline, duration_s=parse_duration(duration),
                        interval_s=interval, repeat=repeat, cache_tolerance=cache_tolerance,
                        latency_tolerance=latency_tolerance, min_requests=min_requests, max_samples=samples,
                        agent_every=agent_every, agent_cases=tuple(agent_case or DEFAULT_AGENT_CASES),
                        api_key_env=api_key_env, verify_tls=not insecure, model=model,
                        allowed_signers=allowed_signers, node_logs=tuple(node_log or ()),
                        target=load_target(target), telemetry_url=telemetry_url,
                        max_age_s=parse_seconds(max_age, "--max-age", "--max-age") if max_age is not None else None)

    def show(s: Sample, fired: list[Trigger]) -> None:
        def num(v: float | None, fmt: str = "g") -> str:
            return "-" if v is None else format(v, fmt)

        agent = "-" if s.agent is None else ("ok" if all(v == "pass" for v in s.agent.values()) else "FAIL")
        state = "TRIGGER " + ", ".join(t.id for t in fired) if fired else "ok"
        real = (s.window or {}).get("requests")
        err.print(f"[{s.t_s:7.1f}s] health={s.health or s.health_error or '-'} running={num(s.running)} "
                  f"waiting={num(s.waiting)} kv={num(s.kv_usage, '.2f')} caching={s.caching_enabled} "
                  f"real_requests={num(real)} probe={s.probe_requests} agent={agent} -> {state}", markup=False)

    watched = run_watch(opts, sys.argv, runs_dir=runs_dir, out=out_dir, on_sample=show)
    result, artifact = watched.result, watched.artifact
    if as_json:
        out.print_json(json.dumps(watched.record))
    elif result.triggers:
        for t in result.triggers:
            out.print(f"TRIGGER {t.id} at {t.t_s:.1f}s: {t.message}", markup=False)
        out.print("roll back to the accepted configuration:", markup=False)
        for key, value in artifact.items():
            if value not in (None, {}, []):
                out.print(f"  {key}: {value}", markup=False)
    else:
        out.print(f"no trigger in {len(result.samples)} samples over the window", markup=False)
    err.print(f"run directory: {watched.run_dir.path}")
    raise typer.Exit(result.exit_code)
