"""`k3fleet lab vllm up|down|status|prepare`: the CPU build of vLLM serving a tiny model on loopback."""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k3fleet.cli.base import err, lab_app, out

vllm_app = typer.Typer(help="A real vLLM (the CPU build) serving a tiny model made on the spot, on 127.0.0.1.",
                       no_args_is_help=True)
lab_app.add_typer(vllm_app, name="vllm")

_WORKDIR_HELP = "Work directory: state and start-up log (default: .lab/vllm in the checkout)."
_VENV_HELP = "The vLLM venv (default: .cache/vllm-venv in the checkout, or $K3FLEET_VLLM_VENV)."


def _say(message: str) -> None:
    err.print(message, markup=False, highlight=False)


@vllm_app.command("prepare")
def vllm_prepare(venv: Annotated[Path | None, typer.Option("--venv", help=_VENV_HELP)] = None) -> None:
    """Build (or reuse) the pinned vLLM venv and the tiny model, without starting a server."""
    from k3fleet.lab import vllm

    py, model = vllm.prepare(venv=venv, progress=_say)
    out.print(f"{py} {model}", markup=False)


@vllm_app.command("up", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def vllm_up(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port on 127.0.0.1 (0 picks a free one).")]
    = 8000,
    workdir: Annotated[Path | None, typer.Option("--workdir", help=_WORKDIR_HELP)] = None,
    venv: Annotated[Path | None, typer.Option("--venv", help=_VENV_HELP)] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=10, max=7200, help="Seconds to wait for readiness.")]
    = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the state as JSON.")] = False,
) -> None:
    """Start the server (vLLM arguments after `--` are appended and win) and wait until it answers."""
    from k3fleet.errors import UsageError
    from k3fleet.lab import vllm

    extra = list(ctx.args)
    stray = [a for a in extra if a in ("--port", "--host", "--model", "--served-model-name")]
    if stray:
        raise UsageError(f"lab vllm up: {stray[0]} is set by the lab (use --port before `--`)")
    state = vllm.up(port, extra, workdir=workdir, venv=venv, timeout_s=timeout, progress=_say)
    if as_json:
        out.print_json(state.model_dump_json())
    else:
        out.print(f"{state.base_url} {state.model} {state.log}", markup=False)


@vllm_app.command("down")
def vllm_down(workdir: Annotated[Path | None, typer.Option("--workdir", help=_WORKDIR_HELP)] = None) -> None:
    """Stop the server, its engine and its supervisor (also after an interrupted run); the log stays."""
    from k3fleet.lab import vllm

    stopped = vllm.down(workdir)
    _say(f"vllm: down ({len(stopped)} process(es) stopped), nothing left" if stopped
         else "vllm: nothing was running")


@vllm_app.command("status")
def vllm_status(
    workdir: Annotated[Path | None, typer.Option("--workdir", help=_WORKDIR_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Whether it runs and answers, where, and where its start-up log is."""
    from k3fleet.lab import vllm

    st = vllm.status(workdir)
    if as_json:
        out.print_json(json.dumps(st.model_dump(mode="json")))
        return
    if st.base_url is None:
        out.print(f"phase {st.phase}: no lab vLLM started here" + (f"; venv {st.venv}" if st.venv else ""),
                  markup=False)
        return
    health = "answering" if st.healthy else "not answering"
    out.print(f"phase {st.phase}: {st.base_url} model {st.model}, {health}, {len(st.pids)} process(es); "
              f"start-up log {st.log}" + (f"; {st.error}" if st.error else ""), markup=False)
