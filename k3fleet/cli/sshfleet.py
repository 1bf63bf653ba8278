"""`k3fleet lab ssh-fleet up|down|status`: the lab fleet behind real sshd in network namespaces (root)."""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k3fleet.cli.base import err, lab_app, out

ssh_fleet_app = typer.Typer(
    help="The lab fleet over real SSH: one network namespace and one sshd per host (root).",
    no_args_is_help=True)
lab_app.add_typer(ssh_fleet_app, name="ssh-fleet")

_WORKDIR_HELP = "Work directory (default: .lab/ssh-fleet in the checkout, else in the current directory)."


@ssh_fleet_app.command("up")
def ssh_fleet_up(
    hosts: Annotated[int, typer.Option("-n", "--hosts", min=1, help="How many lab hosts.")] = 20,
    workdir: Annotated[Path | None, typer.Option("--workdir", help=_WORKDIR_HELP)] = None,
    fleet: Annotated[Path | None, typer.Option("--fleet", help="Lab fleet spec (default: the packaged lab).")] = None,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (its serving image).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the state as JSON.")] = False,
) -> None:
    """Bring up N lab hosts behind real sshd and print the inventory to audit."""
    from k3fleet.lab import sshfleet

    state = sshfleet.up(hosts, workdir, fleet=fleet, target=target, progress=lambda m: err.print(f"ssh-fleet: {m}"))
    err.print(f"ssh-fleet: {len(state.hosts)} hosts up in {state.up_seconds:.1f}s")
    if as_json:
        out.print_json(state.model_dump_json())
    else:
        out.print(str(state.inventory), markup=False)


@ssh_fleet_app.command("down")
def ssh_fleet_down(workdir: Annotated[Path | None, typer.Option("--workdir", help=_WORKDIR_HELP)] = None) -> None:
    """Remove everything: sshd, sessions, ssh mux masters, namespaces, veths, keys, roots."""
    from k3fleet.lab import sshfleet

    sshfleet.down(workdir)
    err.print("ssh-fleet: down, nothing left")
    # `up` refuses while another work directory's fleet is up: say where it is.
    for other in sshfleet.other_fleets(workdir):
        err.print(f"ssh-fleet: another SSH lab fleet is still up in {other} "
                  f"(k3fleet lab ssh-fleet down --workdir {other})", markup=False)


@ssh_fleet_app.command("status")
def ssh_fleet_status(
    workdir: Annotated[Path | None, typer.Option("--workdir", help=_WORKDIR_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Hosts, running sshd, their memory, the inventory."""
    from k3fleet.lab import sshfleet

    st = sshfleet.status(workdir)
    if as_json:
        out.print_json(json.dumps(st.model_dump(mode="json")))
        return
    out.print(f"phase {st.phase}: {st.sshd_running}/{st.sshd_expected} sshd running for {st.hosts} hosts, "
              f"{st.sshd_rss_mib:.0f} MiB resident; inventory {st.inventory}", markup=False)
