"""The ``skipsearch`` command: a thin typer layer over library functions that return data, one module per command
group (``decode``, ``optimize``, ``bench``, ``costs``, ``plan``, ``export``, ``listing``: methods and models, ``cache``,
``describe``: the profile and study groups), what they share at the edge in ``edge``, and the app here.

Every known kind of bad input (profile, model, data, config, storage) ends as one line on
stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
import typer.core

from skipsearch.cli import bench, cache, costs, decode, describe, edge, export, listing, optimize, plan
from skipsearch.cli.edge import line


class _OneLineErrors(typer.core.TyperGroup):
    """Typer's own option errors (``--max-new-tokens 0``, an unknown flag) as one ``error:`` line and
    exit 2, like every other kind of bad input, instead of a usage panel."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:  # Ctrl-C outside a command's own handler
            typer.echo("interrupted", err=True)
            code = 130
        except typer.TyperException as exc:  # typer's usage errors: a bad value, an unknown option
            message = exc.format_message()
            if type(exc).__name__ == "NoArgsIsHelpError":  # `skipsearch profile` alone: its help, as asked
                typer.echo(message)
                code = 0
            else:
                typer.echo(f"error: {line(message)}", err=True)
                code = 2
        if not standalone_mode:
            return code
        sys.exit(code or 0)


app = typer.Typer(
    cls=_OneLineErrors,
    help="Search, ship and run self-speculative decoding draft profiles.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion, --show-completion: bash, zsh, fish, PowerShell
)


def _print_version(value: bool) -> None:
    if value:
        from skipsearch.tested import version_text

        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="The version, the tested set of versions it was locked with, and "
                                               "whether this environment holds that set.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Also show third-party deprecation notices "
                                                            "(once each).")] = False,
) -> None:
    """Search, ship and run self-speculative decoding draft profiles."""
    edge.VERBOSE = verbose  # read by every command's warnings_to_stderr(); set on each run (CliRunner reuses it)


# One line per command, in the order ``skipsearch --help`` lists them.
app.command()(decode.decode)
app.command()(optimize.optimize)
app.command()(bench.bench)
app.command("costs")(costs.costs_command)
app.add_typer(plan.plan_app, name="plan")  # plan profile, plan hierarchical (and the old flat spelling)
app.command("export")(export.export_command)
app.command("methods")(listing.methods_command)
app.command("models")(listing.models_command)
app.command("cache")(cache.cache_command)
app.add_typer(describe.profile_app, name="profile")
app.add_typer(describe.study_app, name="study")

__all__ = ["app"]
