"""The Python API that mirrors the CLI: every command parses its options, calls one function here, and prints
what it returns (a frozen dataclass); progress and notes come back through callbacks.

- ``decode``: decode prompts (``skipsearch decode``), one at a time or in batches (``decode --batch-size``);
  ``loading``: open a model from a name or a profile;
- ``search``: ``optimize_study`` (``skipsearch optimize``) and ``rerank_study`` (``optimize --budget 0 --costs``);
- ``engine_search``: ``optimize_engine`` (``optimize --engine llama.cpp``): a serving engine's own settings, timed
  on its own server;
- ``benchmark``: ``bench_profiles`` (``skipsearch bench``);
- ``planning``: one function per mode of ``skipsearch plan``: ``plan_given``, ``plan_profiles``,
  ``replan_profile_file``, ``plan_study``;
- ``checks``: what the commands check before a model loads, and the notes on other hardware.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skipsearch.api.benchmark import BenchOptions, BenchRun, bench_profiles
    from skipsearch.api.checks import (
        check_model_arg,
        check_prompts_fit,
        hardware_note,
        profile_hardware_note,
        profile_paths,
    )
    from skipsearch.api.decode import (
        Decoded,
        DecodedBatch,
        check_batch_profile,
        context_length,
        decode_batches,
        decode_prompts,
        drafter_factory,
        encode_checked,
    )
    from skipsearch.api.engine_search import EngineSearched, EngineSearchSettings, optimize_engine
    from skipsearch.api.loading import open_model
    from skipsearch.api.planning import PlanOutcome, plan_given, plan_profiles, plan_study, replan_profile_file
    from skipsearch.api.search import Reranked, SearchRun, SearchSettings, optimize_study, rerank_study
    from skipsearch.data import prompt_label

# Each name's module, imported at the name's first use: a command imports what it calls (``decode`` does not
# import the search, its study storage and SQLAlchemy), and ``from skipsearch import api`` stays cheap.
_HOMES = {
    "skipsearch.api.benchmark": ("BenchOptions", "BenchRun", "bench_profiles"),
    "skipsearch.api.checks": ("check_model_arg", "check_prompts_fit", "hardware_note", "profile_hardware_note",
                              "profile_paths"),
    "skipsearch.api.decode": ("Decoded", "DecodedBatch", "check_batch_profile", "context_length", "decode_batches",
                              "decode_prompts", "drafter_factory", "encode_checked"),
    "skipsearch.api.engine_search": ("EngineSearched", "EngineSearchSettings", "optimize_engine"),
    "skipsearch.api.loading": ("open_model",),
    "skipsearch.api.planning": ("PlanOutcome", "plan_given", "plan_profiles", "plan_study", "replan_profile_file"),
    "skipsearch.api.search": ("Reranked", "SearchRun", "SearchSettings", "optimize_study", "rerank_study"),
    "skipsearch.data": ("prompt_label",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["BenchOptions", "BenchRun", "Decoded", "DecodedBatch", "EngineSearchSettings", "EngineSearched",
           "PlanOutcome", "Reranked", "SearchRun",
           "SearchSettings", "bench_profiles", "check_model_arg", "check_batch_profile", "check_prompts_fit",
           "context_length", "decode_batches", "decode_prompts", "drafter_factory", "encode_checked", "hardware_note",
           "open_model", "optimize_engine", "optimize_study", "plan_given", "plan_profiles", "plan_study",
           "profile_hardware_note", "profile_paths", "prompt_label", "replan_profile_file", "rerank_study"]


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:  # a module of the package (``api.costs``), imported as a name is
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads find it here, and a test's monkeypatch of it holds
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
