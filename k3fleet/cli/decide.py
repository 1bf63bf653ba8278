"""`k3fleet decide`, `verify-evidence`, `report`, `triage` and `watch`: from evidence to a signed decision.

Exit codes as everywhere: 0 go / intact, 1 no-go, 2 usage or bad input, 3 evidence missing,
tampered or incomplete (docs/decision.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from k3fleet.cli.base import app, err, out
from k3fleet.errors import EXIT_INCOMPLETE, EXIT_OK, UsageError

_OUTCOME_STYLE = {"go_live": "bold green", "observe_with_limits": "bold yellow",
                  "rebuild_environment": "bold red", "expand_capacity": "bold magenta"}
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
) -> None:
    """Decide go-live from the evidence: one of four outcomes, the checklist, one evidence package."""
    from k3fleet.decide.flow import DecideOptions, run_decide

    opts = DecideOptions(runs=list(runs), reviewer=reviewer, owner=owner, owners_file=owners, build_file=build,
                         target=target, out=out_dir, runs_dir=runs_dir, archive=archive)
    result = run_decide(opts, sys.argv)
    d = result.decision
    if as_json:
        out.print_json(json.dumps(d.model_dump(mode="json")))
    else:
        _print_decision(d)
    err.print(f"run directory: {result.run_dir.path}")
    err.print(f"evidence package: {result.archive} (sha256 {result.archive_sha256})")
    raise typer.Exit(d.exit_code)


def _print_decision(d: object) -> None:
    from k3fleet.decide.models import Decision

    assert isinstance(d, Decision)
    table = Table(title="Sign-off checklist")
    for col in ("item", "status", "detail", "evidence"):
        table.add_column(col)
    for item in d.checklist:
        st = _ITEM_STYLE.get(item.status, "white")
        table.add_row(escape(item.title), f"[{st}]{item.status}[/{st}]", escape(item.detail),
                      escape(", ".join(str(e) for e in item.evidence)))
    out.print(table)
    style = _OUTCOME_STYLE.get(d.outcome, "bold")
    approval = "approved" if d.approved else "NOT approved"
    out.print(f"decision: [{style}]{d.outcome}[/{style}] ({approval}, exit {d.exit_code})")
    for r in d.reasons:
        out.print(f"  - [{r.rule}] {r.text}", markup=False)
    for lim in d.limits:
        out.print(f"  limit {lim.kind}: {lim.text}" + (f" (owner {lim.owner})" if lim.owner else ""), markup=False)
    if d.missing:
        out.print(f"missing evidence: {', '.join(d.missing)}", markup=False)


@app.command("verify-evidence")
def verify_evidence(
    archive: Annotated[Path, typer.Argument(help="An evidence package (.tar.gz) written by k3fleet decide.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Check an evidence package against its manifest: exit 0 intact, 3 on any difference (each listed)."""
    from k3fleet.decide.package import verify_package
    from k3fleet.evidence import sha256_file

    res = verify_package(archive)
    if as_json:
        out.print_json(json.dumps({"archive": str(archive), "sha256": sha256_file(archive), "ok": res.ok,
                                   "files_checked": res.checked, "problems": res.problems}))
    else:
        for p in res.problems:
            out.print(f"DIFFERENT  {p}", markup=False)
        if res.ok:
            manifest = res.manifest or {}
            dec = manifest.get("decision") or {}
            out.print(f"intact: {res.checked} files match {archive.name} ({dec.get('outcome', '?')}, reviewer "
                      f"{manifest.get('reviewer', '?')})", markup=False)
    if not res.ok:
        err.print(f"k3fleet: {archive}: {len(res.problems)} difference(s): the package is not intact", markup=False)
    raise typer.Exit(EXIT_OK if res.ok else EXIT_INCOMPLETE)


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="An audit, change, accept, triage or decision run directory.")],
    fmt: Annotated[str, typer.Option("--format", help="md, html, junit or prom.")] = "md",
    out_file: Annotated[Path | None, typer.Option("--out", help="Write here (atomically) instead of stdout.")] = None,
) -> None:
    """Render a run for people (Markdown, HTML), CI (JUnit XML) or node_exporter (Prometheus textfile)."""
    from k3fleet.report.render import FORMATS, render, write_atomic
    from k3fleet.report.view import load_view

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    view = load_view(run)
    text = render(view, fmt)
    if out_file is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(out_file, text)
    err.print(f"wrote {out_file}")


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
        table = Table(title=f"triage: {result.host} (operator-supplied)")
        for col in ("file", "kind", "finding", "severity", "message"):
            table.add_column(col)
        by_file: dict[str, list[dict[str, object]]] = {}
        for f in result.findings:
            by_file.setdefault(str(f["file"]), []).append(f)
        from k3fleet.triage import stored_name

        for i, c in enumerate(result.captures):
            found = by_file.get(stored_name(i, c), [])
            if not found:
                table.add_row(escape(c.name), c.kind, "-", "", "nothing wrong in this capture")
            for f in found:
                table.add_row(escape(c.name), c.kind, escape(str(f["id"])), str(f["severity"]),
                              escape(str(f["message"])))
        out.print(table)
    err.print(f"run directory: {rd.path}")
    raise typer.Exit(result.exit_code)


@app.command()
def watch(
    base_url: Annotated[str, typer.Option("--base-url", help="The serving endpoint, e.g. http://10.0.0.5:8000.")],
    baseline: Annotated[Path, typer.Option("--baseline", help="The approved decision: its run directory or "
                                                              "its .tar.gz evidence package.")],
    duration: Annotated[str, typer.Option("--for", help="Length of the watch window (90s, 15m, 2h).")] = "15m",
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between samples.")] = 15.0,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Bad intervals in a row before a trigger "
                                                                "fires.")] = 2,
    cache_tolerance: Annotated[float, typer.Option("--cache-tolerance", min=0.0, max=1.0,
                                                   help="Allowed drop of the cache hit ratio (0.5: half).")] = 0.5,
    agent_every: Annotated[int, typer.Option("--agent-every", min=0, help="Sample the critical tool-call cases "
                                                                          "every N intervals (0: never).")] = 1,
    agent_case: Annotated[list[str] | None, typer.Option("--agent-case", help="Critical case to sample "
                                                                              "(repeatable).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Served model (default: the baseline's).")] = None,
    api_key_env: Annotated[str | None, typer.Option("--api-key-env", help="Environment variable holding the "
                                                                          "API key.")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Turn TLS verification off.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
) -> None:
    """Watch a served model after approval; exit 1 with the trigger and the rollback artifact when one fires."""
    from k3fleet.evidence import RunDir
    from k3fleet.watch import (
        DEFAULT_AGENT_CASES,
        Sample,
        Trigger,
        WatchOptions,
        load_baseline,
        parse_duration,
        rollback_artifact,
        run_watch,
    )

    opts = WatchOptions(base_url=base_url, baseline=baseline, duration_s=parse_duration(duration),
                        interval_s=interval, repeat=repeat, cache_tolerance=cache_tolerance, agent_every=agent_every,
                        agent_cases=tuple(agent_case or DEFAULT_AGENT_CASES), api_key_env=api_key_env,
                        verify_tls=not insecure, model=model)
    load_baseline(baseline)  # refuse an unapproved or tampered decision before anything is written
    rd = RunDir.create(runs_dir, "watch", sys.argv, out=out_dir, record={"baseline": str(baseline)})

    def show(s: Sample, fired: list[Trigger]) -> None:
        rd.append_jsonl("samples.jsonl", s.model_dump(mode="json"))

        def num(v: float | None, fmt: str = "g") -> str:
            return "-" if v is None else format(v, fmt)

        agent = "-" if s.agent is None else ("ok" if all(v == "pass" for v in s.agent.values()) else "FAIL")
        state = "TRIGGER " + ", ".join(t.id for t in fired) if fired else "ok"
        err.print(f"[{s.t_s:7.1f}s] health={s.health or s.health_error or '-'} running={num(s.running)} "
                  f"waiting={num(s.waiting)} kv={num(s.kv_usage, '.2f')} caching={s.caching_enabled} "
                  f"agent={agent} -> {state}", markup=False)

    try:
        result = run_watch(opts, show)
    except BaseException:
        rd.write_manifest()
        raise
    artifact = rollback_artifact(result.baseline)
    data = {"samples": len(result.samples), "triggers": [t.model_dump(mode="json") for t in result.triggers],
            "rollback": artifact if result.triggers else None, "exit_code": result.exit_code}
    rd.write_json("watch.json", data)
    rd.write_manifest()
    if as_json:
        out.print_json(json.dumps(data))
    elif result.triggers:
        for t in result.triggers:
            out.print(f"TRIGGER {t.id} at {t.t_s:.1f}s: {t.message}", markup=False)
        out.print("roll back to the accepted configuration:", markup=False)
        for key, value in artifact.items():
            if value not in (None, {}, []):
                out.print(f"  {key}: {value}", markup=False)
    else:
        out.print(f"no trigger in {len(result.samples)} samples over the window", markup=False)
    err.print(f"run directory: {rd.path}")
    raise typer.Exit(result.exit_code)
