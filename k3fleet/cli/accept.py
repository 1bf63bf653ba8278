"""`k3fleet accept`: serving acceptance probes against a running vLLM endpoint.

Commands: ``startup`` (a start-up log), ``prefix-cache``, ``prefix-lint``, ``agent``, ``all``; ``load``
registers itself on ``accept_app`` from its own module. Exit codes as the audit's (docs/acceptance.md).
"""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.table import Table

from k3fleet.accept.result import ProbeResult
from k3fleet.bounds import seconds_option
from k3fleet.cli.base import app, err, out
from k3fleet.errors import UsageError, validation_line
from k3fleet.report.escapes import safe_markup
from k3fleet.report.terminal import SEVERITY_STYLE, whole_column

if TYPE_CHECKING:
    import httpx

    from k3fleet.accept.client import Endpoint
    from k3fleet.models.evidence import AcceptRecord

T = TypeVar("T")

accept_app = typer.Typer(help="Serving acceptance: start-up log, prefix cache, agent tool calls, load.",
                         no_args_is_help=True)
app.add_typer(accept_app, name="accept")

_STATUS_STYLE = {"pass": "green", "fail": "red", "inconclusive": "yellow", "error": "red", "skipped": "dim"}


def print_result(result: ProbeResult, *, as_json: bool, lines: list[str] | None = None) -> None:
    """One probe's result: JSON on stdout for machines, or a status line, the facts and the findings."""
    if as_json:
        out.print_json(json.dumps(result.model_dump(mode="json")))
        return
    style = _STATUS_STYLE.get(result.status, "")
    # Reasons and findings carry server messages and model ids: escaped, so their text stays text.
    out.print(f"[bold]{result.probe}[/bold]: [{style}]{result.status.upper()}[/{style}]  {safe_markup(result.reason)}",
              markup=True)
    for line in lines or []:
        out.print(f"  {line}", markup=False)
    if result.findings:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("severity", no_wrap=True)
        whole_column(table, "id", (f.check_id for f in result.findings))
        table.add_column("layer", no_wrap=True)
        table.add_column("finding", overflow="fold", ratio=1)
        for f in result.findings:
            sev = SEVERITY_STYLE[f.severity]
            table.add_row(f"[{sev}]{f.severity}[/{sev}]", safe_markup(f.check_id), safe_markup(f.layer or ""),
                          safe_markup(f.message))
        out.print(table)


# Endpoint options every HTTP probe takes. Keys come from the environment only: there is no --api-key.
BaseUrl = Annotated[str, typer.Option("--base-url", help="The server, e.g. http://10.0.0.5:8000 (/v1 optional).")]
Model = Annotated[str, typer.Option("--model", help="Served model name, as in /v1/models.")]
ApiKeyEnv = Annotated[str | None, typer.Option(
    "--api-key-env", help="Name of the environment variable holding the API key (never the key itself).")]
Insecure = Annotated[bool, typer.Option(
    "--insecure", help="Turn TLS certificate verification off (recorded in the evidence).")]
Timeout = Annotated[float, typer.Option("--timeout", parser=seconds_option("--timeout", "request --timeout"),
                                        help="Seconds per request, all of it: connect, headers and body "
                                             "(0.1 to 3600).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")]


@dataclasses.dataclass(frozen=True)
class EndpointArgs:
    """The endpoint options as given; ``endpoint()`` checks them when the command is ready to reach it."""

    base_url: str
    model: str
    api_key_env: str | None
    insecure: bool
    timeout: float

    def endpoint(self) -> Endpoint:
        from k3fleet.accept.client import Endpoint

        try:
            ep = Endpoint(base_url=self.base_url, model=self.model, api_key_env=self.api_key_env,
                          verify_tls=not self.insecure, timeout_s=self.timeout)
        except ValidationError as exc:
            raise UsageError(validation_line(exc, option=True)) from exc
        ep.api_key()  # an unset key variable is bad input now, not a 401 later
        if self.insecure:
            err.print("[yellow]TLS certificate verification is off (--insecure)[/yellow]")
        return ep


def endpoint_options(timeout: float) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command's endpoint options, declared once: the command takes ``server: EndpointArgs`` and its
    --help shows --base-url, --model, --api-key-env, --insecure and --timeout (default ``timeout``) first."""
    shared = [inspect.Parameter("base_url", inspect.Parameter.KEYWORD_ONLY, annotation=BaseUrl),
              inspect.Parameter("model", inspect.Parameter.KEYWORD_ONLY, annotation=Model),
              inspect.Parameter("api_key_env", inspect.Parameter.KEYWORD_ONLY, annotation=ApiKeyEnv, default=None),
              inspect.Parameter("insecure", inspect.Parameter.KEYWORD_ONLY, annotation=Insecure, default=False),
              inspect.Parameter("timeout", inspect.Parameter.KEYWORD_ONLY, annotation=Timeout, default=timeout)]

    def wrap(command: Callable[..., None]) -> Callable[..., None]:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "server"]

        @functools.wraps(command)
        def with_endpoint(*, base_url: str, model: str, api_key_env: str | None, insecure: bool, timeout: float,
                          **options: Any) -> None:
            command(server=EndpointArgs(base_url, model, api_key_env, insecure, timeout), **options)

        params = shared + own
        with_endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        with_endpoint.__annotations__ = {p.name: p.annotation for p in params}
        return with_endpoint

    return wrap


def run_probe(endpoint: Endpoint, fn: Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[T]],
              concurrency: int = 4) -> T:
    """Reach the server and find the model (one-line errors, exit 2 or 3), then run ``fn``."""
    from k3fleet.accept.client import preflight

    async def go() -> T:
        async with endpoint.async_client(concurrency) as client:
            info = await preflight(client, endpoint)
            return await fn(client, info)

    return asyncio.run(go())


def progress_printer(quiet: bool) -> Callable[[str], None]:
    if quiet:
        return lambda _msg: None
    return lambda msg: err.print(msg, markup=False, highlight=False)


@accept_app.command("prefix-cache")
@endpoint_options(timeout=120.0)
def prefix_cache(
    server: EndpointArgs,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=100, help="Warm requests.")] = 5,
    prefix_tokens: Annotated[int | None, typer.Option(
        "--prefix-tokens", min=16, help="Shared prefix size in tokens (default: 4.4 match units).")] = None,
    match_unit: Annotated[int | None, typer.Option(
        "--match-unit", min=1, help="Prefix match unit when the server does not publish prefix_match_unit.")] = None,
    replays: Annotated[int, typer.Option("--replays", min=1, max=20, help=(
        "Times the cold request is sent again once warm; each answer must be the cold one."))] = 1,
    settle_timeout: Annotated[float, typer.Option("--settle-timeout", min=0.1, max=300.0, help=(
        "Seconds /metrics may take to count each request and come to rest."))] = 10.0,
    as_json: AsJson = False,
    quiet: Quiet = False,
) -> None:
    """Prove prefix-cache reuse and that it keeps answers: cold, warm, replayed and control requests, /metrics
    read once settled after each."""
    from k3fleet.accept.prefix_cache import PrefixOptions, run_prefix_cache
    from k3fleet.targets import load_target

    ep = server.endpoint()
    # The CLI's default target (Kimi K3): its model's default match unit, when the server publishes none.
    opts = PrefixOptions(repeats=repeats, prefix_tokens=prefix_tokens, match_unit=match_unit, replays=replays,
                         settle_s=settle_timeout, target_model=load_target(None).serve.model)
    say = progress_printer(quiet or as_json)
    result = run_probe(ep, lambda client, _info: run_prefix_cache(ep, opts, progress=say, client=client))
    print_result(result, as_json=as_json, lines=_prefix_lines(result))
    raise typer.Exit(result.exit_code)


def _prefix_lines(result: ProbeResult) -> list[str]:
    d = result.data
    lines = []
    if d.get("match_unit") is not None:
        lines.append(f"match unit: {d['match_unit']} ({d.get('match_unit_source')})")
    pt = d.get("prefix_tokens") or {}
    if pt.get("high") is not None:
        lines.append(f"shared prefix: {pt.get('low')}-{pt.get('high')} tokens ({pt.get('method')})")
    ct = d.get("cached_tokens") or {}
    if ct.get("warm"):
        lines.append(f"cached tokens per warm request: {ct['warm']} ({ct.get('source')}), control {ct.get('control')}")
    tt = d.get("ttft_s") or {}
    if tt.get("cold") is not None and tt.get("warm_median") is not None:
        lines.append(f"TTFT cold {tt['cold'] * 1000:.0f} ms, warm median {tt['warm_median'] * 1000:.0f} ms")
    ans = d.get("answers") or {}
    if ans.get("comparisons"):
        same = sum(1 for c in ans["comparisons"] if c.get("same") or c.get("near_tie"))
        lines.append(f"warm replays with the cold answer: {same}/{len(ans['comparisons'])} ({ans.get('basis')})")
    st = d.get("settle") or {}
    if st.get("reads"):
        lines.append(f"/metrics settled after each request: longest wait {st['max_waited_s']:.2f} s, "
                     f"{st['total_reads']} reads")
    return lines


@accept_app.command("agent")
@endpoint_options(timeout=300.0)
def agent(
    server: EndpointArgs,
    repeats: Annotated[int, typer.Option("--repeats", "-n", min=1, max=1000, help="Runs per case.")] = 20,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=256, help="Runs in flight.")] = 4,
    case: Annotated[list[str] | None, typer.Option("--case", help="Run only this case (repeatable).")] = None,
    critical: Annotated[str | None, typer.Option(
        "--critical", help="Comma-separated cases that gate the result (default: all but structured_output).")] = None,
    min_pass_rate: Annotated[float, typer.Option("--min-pass-rate", min=0, max=1,
                                                 help="Pass rate a critical case needs.")] = 0.95,
    temperature: Annotated[float | None, typer.Option("--temperature", min=0, max=2,
                                                      help="Sampling temperature (default: the server's).")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", min=0, max=1,
                                                help="Sampling top_p (default: the server's).")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1,
                                                   help="Output tokens per request (default: per case).")] = None,
    extra_body: Annotated[str | None, typer.Option(
        "--extra-body", help="JSON object merged into every request (e.g. chat_template_kwargs).")] = None,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="Production profile (YAML): adds a case per production tool and response schema, "
                          "the invalid-schema case and, when the mix has it, a multimodal request.")] = None,
    as_json: AsJson = False,
    quiet: Quiet = False,
) -> None:
    """Run the agent tool-call contract suite, each case repeated, and report pass rates and defects."""
    from k3fleet.accept.agent import CASES, CRITICAL, AgentOptions, run_agent

    ep = server.endpoint()
    try:
        extra = json.loads(extra_body) if extra_body else {}
    except ValueError as exc:
        raise UsageError(f"--extra-body is not JSON: {exc}") from exc
    if not isinstance(extra, dict):
        raise UsageError("--extra-body must be a JSON object")
    crit = [c.strip() for c in critical.split(",") if c.strip()] if critical is not None else list(CRITICAL)
    opts = AgentOptions(repeats=repeats, concurrency=concurrency, cases=case or list(CASES), critical=crit,
                        min_pass_rate=min_pass_rate, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                        extra_body=extra)
    if profile is not None:
        from k3fleet.accept.profile_cases import agent_options_from_profile
        from k3fleet.models.profile import load_profile

        opts = agent_options_from_profile(load_profile(profile), opts)
    say = progress_printer(quiet or as_json)
    result = run_probe(ep, lambda client, _info: run_agent(ep, opts, progress=say, client=client),
                       concurrency=concurrency)
    print_result(result, as_json=as_json, lines=_agent_lines(result))
    raise typer.Exit(result.exit_code)


def _agent_lines(result: ProbeResult) -> list[str]:
    lines = []
    for case, v in (result.data.get("cases") or {}).items():
        defects = ", ".join(f"{d} {n}" for d, n in sorted(v["defects"].items())) or "no defect"
        mark = "*" if v["critical"] else " "
        lines.append(f"{mark} {case:20s} {v['passed']:>4}/{v['runs']:<4} {defects}"
                     + (f" [{v['layer']}]" if v["layer"] else ""))
    return lines


@accept_app.command("all")
@endpoint_options(timeout=300.0)
def accept_all(
    server: EndpointArgs,
    log: Annotated[Path | None, typer.Option("--log", help="vLLM start-up log: adds the startup probe.")] = None,
    launch_command: Annotated[Path | None, typer.Option("--launch-command", help="File with the launch command.")
                              ] = None,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (default: Kimi K3).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    skip: Annotated[list[str] | None, typer.Option(
        "--skip", help="Leave a probe out (prefix_cache, agent, load, startup); it is then reported as not run.")
                    ] = None,
    agent_repeats: Annotated[int, typer.Option("--agent-repeats", min=1, max=1000, help="Runs per agent case.")] = 20,
    agent_concurrency: Annotated[int, typer.Option("--agent-concurrency", min=1, max=256,
                                                   help="Agent cases run at once.")] = 4,
    agent_max_tokens: Annotated[int | None, typer.Option(
        "--agent-max-tokens", min=1, help="max_tokens of the agent cases (default: the server's).")] = None,
    budget: Annotated[str, typer.Option(
        "--budget", help="Time budget of the whole run (90s, 15m, 2h): the agent's rounds and the load schedule "
                         "are scaled to fit it.")] = "15m",
    prefix_repeats: Annotated[int, typer.Option("--prefix-repeats", min=1, max=100,
                                                help="Warm requests per prefix-cache proof.")] = 5,
    match_unit: Annotated[int | None, typer.Option("--match-unit", min=1,
                                                   help="Match unit if the server names none.")] = None,
    load_option: Annotated[list[str] | None, typer.Option(
        "--load-option", help="KEY=VALUE for the load probe's options (repeatable; over the profile's).")] = None,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="Production profile (YAML): the load schedule and the agent cases come from it, and "
                          "the run keeps it (profile.json) for decide.")] = None,
    no_bodies: Annotated[bool, typer.Option(
        "--no-bodies", help="Keep request and response bodies out of the run directory (requests/*.jsonl "
                            "holds sizes, status and timings only).")] = False,
    as_json: AsJson = False,
    quiet: Quiet = False,
) -> None:
    """Run every probe against one endpoint and write the evidence into one run directory."""
    import sys

    from k3fleet.accept.agent import AgentOptions
    from k3fleet.accept.prefix_cache import PrefixOptions
    from k3fleet.accept.probes import PROBES
    from k3fleet.accept.run import AllOptions, load_available, run_all

    bad = [p for p in skip or [] if p not in PROBES]
    if bad:
        raise UsageError(f"--skip {bad[0]}: not a probe (one of {', '.join(PROBES)})")
    from k3fleet.bounds import check_input

    for path, flag in ((log, "--log"), (launch_command, "--launch-command")):
        if path is not None:
            check_input(path, flag, kind="a text log", limit="log")
    loaded = None
    if profile is not None:
        from k3fleet.models.profile import load_profile

        loaded = load_profile(profile)
    ep = server.endpoint()
    overrides = _key_values(load_option or [], "--load-option")
    load_opts = None
    if "load" not in (skip or []) and load_available():
        if loaded is not None:
            from k3fleet.accept.profile_cases import load_options_from_profile

            load_opts = load_options_from_profile(loaded, overrides)
        else:
            from k3fleet.accept.load.options import load_options

            load_options(overrides)
    from k3fleet.bounds import parse_seconds
    from k3fleet.change.interrupt import cancel_on_signals

    budget_s = parse_seconds(budget, "--budget", "load step")
    agent_opts = AgentOptions(repeats=agent_repeats, concurrency=agent_concurrency, max_tokens=agent_max_tokens)
    if loaded is not None:
        from k3fleet.accept.profile_cases import agent_options_from_profile

        agent_opts = agent_options_from_profile(loaded, agent_opts)
    opts = AllOptions(runs_dir=runs_dir, out=out_dir, log=log, launch_command=launch_command, target=target,
                      skip=list(skip or []), prefix=PrefixOptions(repeats=prefix_repeats, match_unit=match_unit),
                      agent=agent_opts, load_overrides=overrides, load_opts=load_opts, profile=loaded,
                      no_bodies=no_bodies, budget_s=budget_s)
    say = progress_printer(quiet or as_json)
    # The first Ctrl-C ends the probe that runs with what it measured and writes the run; a second aborts.
    opts.stop = cancel_on_signals(lambda: err.print("[yellow]interrupt: stopping; writing what was measured "
                                                    "(Ctrl-C again to abort)[/yellow]"))
    res = asyncio.run(run_all(ep, opts, sys.argv, progress=say))
    if as_json:
        out.print_json(json.dumps(res.summary.dump(), default=str))
    else:
        _print_summary(res.summary, res.results)
    err.print(f"run directory: {res.run_dir.path}", markup=False)
    if res.summary.error:
        err.print(f"k3fleet: error: {res.summary.error}", markup=False)
    if res.summary.interrupted:
        err.print("[yellow]interrupted: evidence is incomplete[/yellow]")
    raise typer.Exit(res.exit_code)


def _key_values(items: list[str], flag: str) -> dict[str, Any]:
    outd: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            outd[key] = json.loads(value)
        except ValueError:
            outd[key] = value
    return outd


def _print_summary(summary: AcceptRecord, results: dict[str, ProbeResult]) -> None:
    out.print(f"[bold]accept[/bold] {safe_markup(summary.base_url)} model {safe_markup(summary.model)}"
              + ("" if summary.tls_verify else "  [yellow](TLS verification off)[/yellow]"), markup=True)
    elapsed = (summary.budget or {}).get("elapsed_s") or {}
    for name, result in results.items():
        style = _STATUS_STYLE.get(result.status, "")
        took = f"{elapsed[name]:>5.0f}s " if isinstance(elapsed.get(name), int | float) else ""
        out.print(f"  {name:13s} [{style}]{result.status.upper():12s}[/{style}] {took}{safe_markup(result.reason)}",
                  markup=True)
    for name, why in summary.aborted.items():
        took = f"{elapsed[name]:>5.0f}s " if isinstance(elapsed.get(name), int | float) else ""
        out.print(f"  {name:13s} [red]ABORTED[/red]      {took}{safe_markup(why)}", markup=True)
    for name, why in summary.not_run.items():
        out.print(f"  {name:13s} [dim]NOT RUN[/dim]      {safe_markup(why)}", markup=True)
    failing = [f for r in results.values() for f in r.failing()]
    for f in failing[:20]:
        out.print(f"    [red]{safe_markup(f.check_id)}[/red] {safe_markup(f.message)}", markup=True)


@accept_app.command("prefix-lint")
def prefix_lint(
    captures: Annotated[Path, typer.Argument(help="JSON Lines of captured request bodies (before/after a gateway).")],
    as_json: AsJson = False,
) -> None:
    """Name what breaks the shared prompt prefix between captured requests."""
    from k3fleet.accept.prefix_lint import lint_captures

    result = lint_captures(captures)
    lines = [f"pair {p['a']}->{p['b']} ({p['kind']}): {', '.join(p['breaks']) or 'prefix kept'}"
             for p in result.data.get("pairs", [])]
    print_result(result, as_json=as_json, lines=lines)
    raise typer.Exit(result.exit_code)


@accept_app.command("startup")
def startup(
    log: Annotated[Path, typer.Option("--log", help="vLLM start-up log (container or journal output).")],
    launch_command: Annotated[Path | None, typer.Option(
        "--launch-command", help="File with the launch command (vllm serve ... or docker run ...).")] = None,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (default: Kimi K3).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
) -> None:
    """Read a vLLM start-up log: versions, parallel layout, caching, parsers, and start-up failures."""
    from k3fleet.accept.startup import run_startup, summary_lines
    from k3fleet.targets import load_target

    result = run_startup(log, launch_command, target=load_target(target))
    print_result(result, as_json=as_json, lines=list(summary_lines(result)))
    raise typer.Exit(result.exit_code)
