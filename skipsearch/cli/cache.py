"""``skipsearch cache``: what this machine keeps under the cache root (``skipsearch.kept``): the compiled graphs
(``kernels/graphs.py``) with the kept packed weights (``kernels/lowbit/arena.py``), the converted models, the builds
of the C++ products and the llama.cpp peer's GGUFs; and clearing them."""

from __future__ import annotations

from typing import Annotated

import typer


def cache_command(
    clear: Annotated[bool, typer.Option("--clear", help="Remove the compiled graphs and packed weights; the next "
                                                        "compiled decode compiles its graphs and packs its weights "
                                                        "again.")] = False,
    everything: Annotated[bool, typer.Option("--all", help="With --clear: remove everything listed, the converted "
                                                           "models, C++ builds and GGUFs too.")] = False,
) -> None:
    """What skipsearch keeps on disk: compiled graphs (one folder per torch version, thread count and CPU), packed
    weights, converted models, C++ builds and GGUFs; or --clear them."""
    from skipsearch import kept
    from skipsearch.kernels import graphs
    from skipsearch.kernels.lowbit.arena import kept_folder, kept_note

    compiled, others = graphs.caches(), kept.folders()
    if everything and not clear:
        raise typer.BadParameter("--all goes with --clear", param_hint="--all")
    if clear:
        dropped = others if everything else ()
        graphs.clear(compiled)
        for f in dropped:
            kept.remove(f.path)
        count, size = len(compiled) + len(dropped), sum(c.bytes for c in compiled) + sum(f.bytes for f in dropped)
        typer.echo(f"removed {count} folder{'s' if count != 1 else ''} ({size / 1e6:.1f} MB) under {kept.cache_dir()}")
        return
    if not compiled:
        typer.echo(f"no compiled graphs kept yet (they go to {graphs.graphs_root()})")
    weights = kept_folder()
    for c in compiled:
        mark = "  (this machine)" if c.here else f"  ({kept_note(weights)})" if c.path == str(weights) else ""
        typer.echo(f"{c.path}  {c.files} files  {c.bytes / 1e6:.1f} MB  written {kept.age(c.modified)} ago{mark}")
    for f in others:
        typer.echo(f"{f.path}  {f.files} files  {f.bytes / 1e6:.1f} MB  written {kept.age(f.modified)} ago  "
                   f"({kept.FOLDERS[f.path.name]})")
