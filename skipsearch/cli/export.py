"""``skipsearch export``: a profile as the configuration of the engine a user decodes with, and its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli import options
from skipsearch.cli.edge import user_errors


def export_command(
    profile: Annotated[str, typer.Option(help="The draft profile to export.")],
    engine: options.Engine,
    out: Annotated[Path, typer.Option(help="The export directory (replaced whole, with --force; its manifest is "
                                           "export.yaml).")],
    costs: Annotated[str | None, typer.Option(help="Re-plan K for this cost file (the target's) first.")] = None,
    nearest: Annotated[bool, typer.Option(help="Write the nearest setting the engine runs where it cannot express "
                                               "the profile (otherwise: one line, exit 2).")] = False,
    force: Annotated[bool, typer.Option(help="Replace --out where it holds an export already (a directory that holds "
                                             "anything else is never replaced).")] = False,
    allow_slower: Annotated[bool, typer.Option(help="Write the profile's own setting even where the engine measured "
                                                    "nothing faster than its plain decoding (optimize --engine).")]
    = False,
) -> None:
    """The profile as the engine's own configuration, with a manifest naming the profile, model, hardware and
    speedup it came from."""
    from skipsearch.api.export import export_profile

    with user_errors():
        done = export_profile(profile, engine=engine, out=out, costs=costs, nearest=nearest, force=force,
                              allow_slower=allow_slower)
    if done.nearest:
        typer.echo(f"note: {done.nearest}; written", err=True)
    speed = f"{done.speedup.value:.2f}x" if done.speedup.value is not None else "no figure"
    typer.echo(f"{done.engine}: {done.setting} ({done.speedup.kind} {speed}, {done.speedup.source})")
    typer.echo(f"wrote {done.out}: {', '.join(done.manifest['files'])}")
    typer.echo(f"use: {done.written.usage.strip()}")
