"""``optimize``'s strategy flags, made from what the registered strategies declare (``Strategy.options``).

One flag per declared spelling (``--n``, ``--schemes``), in a help panel named after the strategies that take it, its
help and default said per strategy. The flags are read from the registry whenever typer builds the command, so a
strategy registered later (a plug-in's, a test's) gets its flags with no edit here; ``--strategy``'s help lists the
registry the same way. The command gets what was given as ``strategy_flags`` (option name -> the flag's text or
number) and turns it into the strategy's options with ``strategy_options``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from skipsearch.config import ConfigError, int_list
from skipsearch.search.strategies import REGISTRY, Option


@dataclass(frozen=True)
class Flag:
    """One command-line flag: the option it sets, as each strategy that takes it declares it."""

    spelling: str  # e.g. --vocab-sizes
    takers: tuple[tuple[str, Option], ...]  # (strategy, its declaration), in registry order

    @property
    def option(self) -> Option:
        return self.takers[0][1]

    @property
    def panel(self) -> str:
        return "Strategy options: " + ", ".join(name for name, _ in self.takers)

    @property
    def help(self) -> str:
        """Each strategy's help, and its default; strategies that say the same share one clause."""
        said: dict[str, list[tuple[str, str]]] = {}  # help -> (strategy, its default shown)
        for name, o in self.takers:
            shown = ",".join(map(str, o.default)) if isinstance(o.default, tuple) else str(o.default)
            said.setdefault(o.help, []).append((name, "" if o.default in (None, ()) else shown))
        clauses = []
        for text, defaults in said.items():
            shown = {d for _, d in defaults if d}
            if len(shown) == 1 and all(d for _, d in defaults):
                text += f" (default: {shown.pop()})"
            elif shown:
                text += f" (default: {', '.join(f'{name} {d}' for name, d in defaults if d)})"
            clauses.append(text if len(said) == 1 else f"{', '.join(name for name, _ in defaults)}: {text}")
        out = "; ".join(clauses)
        return (out[:1].upper() + out[1:] if len(said) == 1 else out) + "."  # a strategy's name stays as it is

    @property
    def metavar(self) -> str:
        o = self.option
        item = "|".join(o.choices) if o.choices else {int: "INTEGER", float: "FLOAT", str: "TEXT"}[o.type]
        return f"{item}[,...]" if o.many else (f"[{item}]" if o.choices else item)


def strategy_flags(taken: Mapping[str, str] = {}) -> tuple[Flag, ...]:  # noqa: B006 - read only
    """The flags of every registered strategy's options that a flag can spell, in registry order. ``taken``: the
    command's own flags (spelling -> its parameter), which no strategy option may reuse."""
    flags: dict[str, list[tuple[str, Option]]] = {}
    for name, cls in REGISTRY.items():
        for o in cls.options:
            if o.on_command_line:
                flags.setdefault(o.spelling, []).append((name, o))
    out = []
    for spelling, takers in flags.items():
        first = takers[0][1]
        if spelling in taken:
            raise ValueError(f"strategy '{takers[0][0]}' declares {spelling}, which is optimize's own option")
        # one flag means one thing to parse: the strategies that share it must declare the same name and kind
        for name, o in takers[1:]:
            if (o.name, o.type, o.many) != (first.name, first.type, first.many):
                raise ValueError(f"strategy '{name}' declares {spelling} as another option than "
                                 f"'{takers[0][0]}' does: give it another flag")
        out.append(Flag(spelling, tuple(takers)))
    return tuple(out)


def strategy_options(given: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``strategy_flags`` as the strategy's options: each given flag's value, parsed as its declaration says (a
    comma-separated list: a one-line ConfigError when it is not one). ``make_strategy`` checks the rest."""
    by_name = {f.option.name: f for f in strategy_flags()}
    out = []
    for name, value in given.items():
        o, spelling = by_name[name].option, by_name[name].spelling
        if o.many and o.type is int:
            value = int_list(value, spelling)
        elif o.many:
            value = tuple(part.strip() for part in value.split(",") if part.strip())
            if not value:
                raise ConfigError(f"{spelling} must be comma-separated values, e.g. {','.join(o.choices[:2])}")
        out.append((name, value))
    return tuple(out)


def with_strategy_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` (which takes ``strategy`` and ``strategy_flags``) as typer sees it: ``strategy_flags`` replaced by
    a flag per declared strategy option, read from the registry whenever typer builds the command."""
    return _WithStrategyFlags(command)


class _WithStrategyFlags:
    # A callable object rather than a function: typer reads ``inspect.signature``, which takes ``__signature__``
    # as it is, so a property here gives the registry's flags as they are when the command is built.

    def __init__(self, command: Callable[..., Any]) -> None:
        functools.update_wrapper(self, command)
        self._command = command

    @property
    def __signature__(self) -> inspect.Signature:  # noqa: PLW3201 - inspect's own protocol
        hints = typing.get_type_hints(self._command, include_extras=True)
        own = [p.replace(annotation=hints[p.name]) for p in inspect.signature(self._command).parameters.values()
               if p.name != "strategy_flags"]
        taken = {"--" + p.name.replace("_", "-"): p.name for p in own}
        params = [self._strategy_help(p) if p.name == "strategy" else p for p in own]
        for flag in strategy_flags(taken):
            o = flag.option
            low = {x.low for _, x in flag.takers}
            kind = str if o.many else o.type  # a list arrives as its text
            info = typer.Option(flag.spelling, help=flag.help, metavar=flag.metavar, rich_help_panel=flag.panel,
                                show_default=False,
                                min=low.pop() if not o.many and o.type is not str and len(low) == 1 else None)
            params.append(inspect.Parameter(_parameter(o.name), inspect.Parameter.KEYWORD_ONLY, default=None,
                                            annotation=Annotated[kind | None, info]))
        return inspect.Signature(params)

    @staticmethod
    def _strategy_help(p: inspect.Parameter) -> inspect.Parameter:
        """``--strategy`` with the registered strategies in its help, so that the list cannot go stale."""
        kind, info = typing.get_args(p.annotation)[:2]
        info = copy.copy(info)
        info.help = f"Search strategy: {', '.join(REGISTRY)} (`skipsearch methods` says which searches what)."
        names = tuple(REGISTRY)  # listed, and offered by shell completion; an unknown name is the registry's error
        info.metavar = "[" + "|".join(names) + "]"
        info.autocompletion = lambda incomplete: [n for n in names if n.startswith(incomplete)]
        return p.replace(annotation=Annotated[kind, info])

    def __call__(self, **kwargs: Any) -> Any:
        names = {_parameter(f.option.name): f.option.name for f in strategy_flags()}
        given = {names[k]: kwargs.pop(k) for k in list(kwargs) if k in names}
        return self._command(**kwargs, strategy_flags={k: v for k, v in given.items() if v is not None})


def _parameter(option: str) -> str:
    """The Python name typer gives a strategy option's flag: apart from every name of the command's own."""
    return f"strategy_option_{option}"


__all__ = ["Flag", "strategy_flags", "strategy_options", "with_strategy_flags"]
