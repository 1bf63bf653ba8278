"""The `k3fleet` command line.

Exit codes: 0 pass / go, 1 checks failed / no-go, 2 usage or bad input,
3 hosts unreachable or evidence incomplete. Progress goes to stderr, results to stdout.
"""

# lazy: `import k3fleet.cli` loads only this module; what printing, error mapping and clean-up need (the
# escapes, the lab's and the target's errors, the run directory) is imported where it is used.
from __future__ import annotations

import json as jsonlib
import sys
from collections.abc import Iterable
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console, ConsoleOptions, RenderableType
from rich.errors import MarkupError
from rich.segment import Segment
from rich.text import Text

from k3fleet import __version__
from k3fleet.contracts import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE
from k3fleet.errors import K3FleetError, validation_line


def _conventional_help() -> None:
    """Help in the usual shape: a flag shows no type (Typer 0.2x prints ``<bool>``), and a required
    argument is ``RUNS...`` in the usage line, an optional one ``[RUN]`` (it prints ``{runs}``)."""
    from typer import core

    option_type = core.TyperOption.display_type_rich

    def display_type_rich(self: core.TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag or self.count else option_type(self, ctx)

    def usage_name(self: core.TyperArgument) -> str:
        name = (self.metavar or self.name or "arg").upper()
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    if hasattr(core.TyperOption, "display_type_rich"):
        core.TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
    if hasattr(core.TyperArgument, "_usage_display_name"):
        core.TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]


_conventional_help()

app = typer.Typer(
    name="k3fleet",
    help="Audit a GPU fleet for Kimi K3 on vLLM, run the R575 -> R580 change night, roll back, decide.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
lab_app = typer.Typer(help="The simulated lab fleet, the real testbed and the serving simulator.",
                      no_args_is_help=True)
app.add_typer(lab_app, name="lab")



class SafeConsole(Console):
    """A Rich console that prints nothing unsafe: the one chokepoint of the terminal.

    Every string and ``Text`` it renders (a line, a table cell, a title, a progress column) passes
    ``safe_rich_text``: redacted, terminal escapes and control characters removed, styles kept. A
    string whose markup does not parse (a value that carried ``[/bold]``) is printed as plain text
    instead of raising; call sites still escape the values they interpolate into markup
    (``safe_markup``), so a value cannot style or hide the text around it. ``print_json`` redacts
    structurally and escapes every non-ASCII character, so a value prints as given (``\u202e``).
    """

    def render_str(self, text: str, **kwargs: Any) -> Text:
        from k3fleet.report.escapes import safe_rich_text

        try:
            rendered = super().render_str(text, **kwargs)
        except MarkupError:
            rendered = super().render_str(text, **{**kwargs, "markup": False})
        return safe_rich_text(rendered)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        if isinstance(renderable, Text):
            from k3fleet.report.escapes import safe_rich_text

            renderable = safe_rich_text(renderable)
        return super().render(renderable, options)

    def print_json(self, json: str | None = None, *, data: Any = None, **kwargs: Any) -> None:
        from k3fleet.report.escapes import safe_json

        value = jsonlib.loads(json) if json is not None else data
        super().print_json(data=safe_json(value), **{**kwargs, "ensure_ascii": True})


err = SafeConsole(stderr=True, highlight=False, soft_wrap=True)
out = SafeConsole(highlight=False, soft_wrap=True)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        out.print(__version__)
        raise typer.Exit(EXIT_OK)


# Each command group registers itself on ``app`` when imported; a new group is one more name here,
# and its top-level command names go into COMMAND_OWNERS.
_COMMAND_MODULES = ("audit", "change", "lab", "accept", "accept_load", "sshfleet", "merge", "serve_vllm", "lab_vllm",
                    "decide", "evidence")

# Which modules define a top-level command: `k3fleet audit ...` imports only k3fleet.cli.audit, so a
# command does not pay for the others' imports (the accept group's HTTP clients alone cost about
# 0.4 s of CPU per start). tests/unit/test_cli_registry.py checks this table against the commands.
COMMAND_OWNERS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("audit", "plan", "checks", "schema"), ("audit",)),
    **dict.fromkeys(("upgrade", "rollback"), ("change",)),
    **dict.fromkeys(("decide", "verify-evidence", "report", "triage", "watch"), ("decide",)),
    "merge": ("merge",),
    **dict.fromkeys(("verify", "prune"), ("evidence",)),
    "lab": ("lab", "serve_vllm", "sshfleet", "lab_vllm"),
    # `accept load` is its own module, hung on the accept group (k3fleet.cli.accept_load).
    "accept": ("accept", "accept_load"),
}


def register_commands(names: tuple[str, ...] = _COMMAND_MODULES) -> None:
    """Import the command modules ``names`` (all by default); importing one registers its commands."""
    import importlib

    for name in names:
        importlib.import_module(f"k3fleet.cli.{name}")


def _modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules a command line needs: its command's owners, or all of them (help, an
    unknown command, which Typer then names)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return COMMAND_OWNERS.get(first or "", _COMMAND_MODULES)


def _input_errors() -> tuple[type[Exception], ...]:
    """Bad-input exceptions of the target loader and the lab, which speak in one line already."""
    from k3fleet.lab.fleet import LabFleetError, LabProfileError
    from k3fleet.targets import TargetError

    return (TargetError, LabProfileError, LabFleetError)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure is one line on stderr and a documented exit code."""
    from k3fleet.evidence.rundir import forget_claims

    forget_claims()  # only this command's claims count below
    rc = _main(argv)
    if rc == EXIT_USAGE:
        # A usage error writes nothing: a run directory claimed before the error was found goes again.
        from k3fleet.evidence.rundir import discard_unstarted

        discard_unstarted()
    return rc


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP end any command as Ctrl-C does (exit 3, a temporary file removed, no traceback);
    a command that runs plays replaces this with its own stop (k3fleet.change.interrupt)."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, stop)


def _main(argv: list[str] | None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    import os

    from k3fleet.evidence.redact import remember_environment_secrets

    # The controller's own secrets (HF_TOKEN, the API key a probe sends) are masked by value in
    # everything printed or written, whatever shape a server or a tool echoes them back in.
    remember_environment_secrets(os.environ)
    _stop_on_signals()
    try:
        register_commands(_modules_for(argv))
        rc = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        err.print("k3fleet: aborted")
        return EXIT_INCOMPLETE
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            err.print(exc.format_message(), markup=False)
        else:
            err.print(f"k3fleet: error: {exc.format_message()}", markup=False)
        return EXIT_USAGE
    except K3FleetError as exc:
        err.print(f"k3fleet: error: {exc}", markup=False)
        return exc.exit_code
    except _input_errors() as exc:
        err.print(f"k3fleet: error: {exc}", markup=False)
        return EXIT_USAGE
    except ValidationError as exc:
        err.print(f"k3fleet: error: {validation_line(exc, 'invalid input')}", markup=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("k3fleet: interrupted")
        return EXIT_INCOMPLETE
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
