"""``skipsearch cache``: the compiled graphs this machine keeps (``kernels/graphs.py``), with its kept packed weights
(``kernels/lowbit/arena.py``), and clearing them."""

from __future__ import annotations

from typing import Annotated

import typer


def cache_command(
    clear: Annotated[bool, typer.Option("--clear", help="Remove every kept folder; the next compiled decode "
                                                        "compiles its graphs and packs its weights again.")] = False,
) -> None:
    """The compiled graphs kept on disk (one folder per torch version, thread count and CPU, and one of packed
    weights), or --clear them."""
    from skipsearch.kernels import graphs
    from skipsearch.kernels.lowbit.arena import kept_folder, kept_note

    kept = graphs.caches()
    if clear:
        graphs.clear(kept)
        total = sum(c.bytes for c in kept)
        typer.echo(f"removed {len(kept)} folder{'s' if len(kept) != 1 else ''} ({total / 1e6:.1f} MB) under "
                   f"{graphs.graphs_root().parent}")
        return
    if not kept:
        typer.echo(f"no compiled graphs kept yet (they go to {graphs.graphs_root()})")
        return
    weights = kept_folder()
    for c in kept:
        mark = "  (this machine)" if c.here else f"  ({kept_note(weights)})" if c.path == str(weights) else ""
        typer.echo(f"{c.path}  {c.files} files  {c.bytes / 1e6:.1f} MB  written {graphs.age(c)} ago{mark}")
