"""``skipsearch profile validate|show`` and ``skipsearch study show``: check and describe the files teams share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli import options
from skipsearch.cli.edge import user_errors
from skipsearch.files.errors import StudyError
from skipsearch.files.figures import check_plot_target
from skipsearch.profile import load_profile

profile_app = typer.Typer(help="Check and describe draft profiles.", no_args_is_help=True)
study_app = typer.Typer(help="Inspect search studies.", no_args_is_help=True)


@profile_app.command("validate")
def profile_validate(path: Annotated[str, typer.Argument(help="Profile YAML to check.")]) -> None:
    """Exit 0 if the profile is valid; else print one line saying what is wrong and exit 2."""
    with user_errors():
        load_profile(path)
    typer.echo(f"{path}: valid")


@profile_app.command("show")
def profile_show(path: Annotated[str, typer.Argument(help="Profile YAML to describe.")]) -> None:
    """Human summary: model, method, skips, measured figures."""
    with user_errors():
        prof = load_profile(path)
    typer.echo(prof.describe())


@study_app.command("show")
def study_show(
    study: Annotated[str | None, typer.Argument(help="Study directory.")] = None,
    storage: options.Storage = None,
    study_name: options.StudyName = None,
    top: Annotated[int, typer.Option(help="Rows to list, best first.")] = 10,
    plot: Annotated[Path | None, typer.Option(
        help="Draw the search history, predicted against measured speedup, and the trials' cost-acceptance front "
             "to this PNG.")] = None,
    force: Annotated[bool, typer.Option(help="Replace --plot where it holds a PNG plot already.")] = False,
) -> None:
    """Trials, best so far, and status of a study.

    To browse a study in a browser: optuna-dashboard sqlite:///path/to/study.db (pip install optuna-dashboard).
    """
    import optuna
    from rich.console import Console
    from rich.table import Table

    from skipsearch.search.study import STUDY_COLUMNS, load_records, study_table
    from skipsearch.search.study.plot import plot_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with user_errors():
        if top < 0:
            raise StudyError(f"--top must be >= 0, got {top}")
        if plot:
            check_plot_target(plot, replace=force)
        info, recs = load_records(study_dir=study, storage=storage, study_name=study_name)
    states: dict[str, int] = {}
    for r in recs:
        states[r.state] = states.get(r.state, 0) + 1
    typer.echo(f"study {info}: {len(recs)} trials (" + ", ".join(f"{v} {k.lower()}" for k, v in states.items()) + ")")
    table = Table(*STUDY_COLUMNS)
    for row in study_table(recs, top=top):
        table.add_row(*row)
    Console().print(table)
    for r in recs:
        if r.error:
            typer.echo(f"trial {r.number} failed: {r.error}")
    if plot:
        with user_errors():
            plot_study(recs, plot, title=info)
        typer.echo(f"wrote {plot}")
