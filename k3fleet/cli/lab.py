"""`k3fleet lab`: the simulated lab fleet and the real testbed."""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k3fleet.cli.base import lab_app, out

testbed_app = typer.Typer(help="The real testbed: SSH into booted systemd guests (root).", no_args_is_help=True)
lab_app.add_typer(testbed_app, name="testbed")


@lab_app.command("generate")
def lab_generate(
    dest: Annotated[Path, typer.Argument(help="Directory to write host roots and inventory.yml into.")],
    fleet: Annotated[Path | None, typer.Option("--fleet", help="Fleet spec (default: packaged lab).")] = None,
    count: Annotated[int | None, typer.Option("--count", min=1, help="Scale the fleet to N hosts.")] = None,
) -> None:
    """Generate the simulated lab fleet and print its inventory path."""
    from k3fleet.lab.fleet import generate_fleet, load_fleet

    out.print(str(generate_fleet(load_fleet(fleet), dest, count=count)))


@testbed_app.command("up")
def testbed_up(
    hosts: Annotated[int, typer.Option("--hosts", "-n", min=1, max=32, help="How many guests.")] = 4,
    workdir: Annotated[Path, typer.Option("--workdir", help="The testbed's state directory.")] = Path(".testbed"),
) -> None:
    """Bring up the real testbed (root)."""
    from k3fleet.lab import testbed

    state = testbed.up(n=hosts, workdir=workdir)
    out.print(str(getattr(state, "inventory", workdir / "inventory.yml")))


@testbed_app.command("down")
def testbed_down(workdir: Annotated[Path, typer.Option("--workdir",
                                                       help="Testbed state dir.")] = Path(".testbed")) -> None:
    """Tear the testbed down: no process, namespace, mount or veth left."""
    from k3fleet.lab import testbed

    testbed.down(workdir)


@testbed_app.command("status")
def testbed_status(workdir: Annotated[Path, typer.Option("--workdir",
                                                         help="Testbed state dir.")] = Path(".testbed")) -> None:
    """Show the testbed's hosts and processes."""
    from k3fleet.lab import testbed

    state = testbed.status(workdir)
    data = state.model_dump(mode="json") if hasattr(state, "model_dump") else state.__dict__
    out.print_json(json.dumps(data, default=str))


@testbed_app.command("driver")
def testbed_driver(
    hosts: Annotated[list[str], typer.Argument(help="The guests (tb-node01...).")],
    release: Annotated[str, typer.Option("--release", help="The stand-in driver release, e.g. 575.57.08.")],
    workdir: Annotated[Path, typer.Option("--workdir", help="The testbed's state directory.")] = Path(".testbed"),
) -> None:
    """Put guests on one driver release, held and loaded, idle in Slurm: nodes before their first night (root)."""
    from k3fleet.lab import testbed
    from k3fleet.lab.testbed.driver import install_release

    state = testbed.status(workdir)
    for host in hosts:
        out.print(install_release(state, host, release), markup=False)


@testbed_app.command("fault")
def testbed_fault(
    host: Annotated[str, typer.Argument(help="The guest (tb-node01...).")],
    at: Annotated[str, typer.Option("--at", help="The stage the night fails at: drain, packages, verify; none "
                                    "removes every fault.")],
    workdir: Annotated[Path, typer.Option("--workdir", help="The testbed's state directory.")] = Path(".testbed"),
) -> None:
    """Make the change night fail on a guest at a chosen stage, to rehearse the rollback path (root)."""
    from k3fleet.lab import testbed
    from k3fleet.lab.testbed.fault import inject

    out.print(inject(testbed.status(workdir), host, at), markup=False)


@lab_app.command("demo")
def lab_demo(
    workdir: Annotated[Path, typer.Option("--workdir", help="Where the demo's runs, keys and lab state go "
                                          "(a previous demo's directory is replaced).")] = Path("runs/demo"),
) -> None:
    """The whole path on the lab: audit, plan, upgrade --check, accept all, decide, watch (make demo)."""
    from k3fleet.lab.demo import run_demo

    raise typer.Exit(run_demo(workdir))
