"""``skipsearch methods`` and ``skipsearch models``: what this skipsearch can draft with, and what this machine
holds."""

from __future__ import annotations

import typer


def methods_command() -> None:
    """The draft methods a profile can name, and the strategy that searches each."""
    from skipsearch import methods

    for name in methods.names():
        m = methods.get(name)
        search = f"--strategy {m.strategy}" if m.strategy else "skipsearch plan"
        typer.echo(f"{name:<14} {m.summary} [{search}]")


def models_command() -> None:
    """The names --model takes besides a directory, and where each loads from on this machine."""
    from skipsearch.checkpoints import list_models

    for info in list_models():
        where = str(info.path) if info.path is not None else "not on this machine"
        typer.echo(f"{info.name:<24} {info.hub_id or info.description or '':<44} {where}")
