"""The options several commands share, declared once: one spelling, one default, one help text each, and the
choices of every option that has a fixed set of values (listed in ``--help``, offered by shell completion, checked
while the command line is parsed, by the library's own check so that a bad value reads as it always has).

A command takes a shared option as ``max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS``;
``tests/test_cli_consistency.py`` walks every command and fails where a shared option has another default or help.
Options whose meaning is each command's own (``--out``: a profile, a cost file or a directory) are listed in
``OWN`` with the reason.

An old spelling keeps working for one release, with one ``notice:`` line on stderr (``renamed``).
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.files.bounds import DTYPES, MAX_THREADS
from skipsearch.model.loader import DEFAULT_MODEL
from skipsearch.model.target import PRECISIONS

# -- the defaults (a default changed here was another command's before: the old value is still accepted) ---------
MAX_NEW_TOKENS = 128  # decode and bench had 128; optimize, costs and plan 64 (pass --max-new-tokens 64 for that)
N_PROMPTS = 8  # optimize had 8; bench 16, plan 4 (pass --n-prompts for those)
DATASET = "mtbench,humaneval"  # bench had both; optimize, costs and plan mtbench (costs reads its first prompt:
# mtbench's either way, as the sets are interleaved)
REPEATS = 1
SEED = 0
DEVICE = "auto"
DTYPE = "auto"
TARGET_PRECISION = "auto"
KERNEL = "auto"  # decode and bench read the profiles' kernel by default already; optimize and costs had eager
SPLIT = "heldout"

# Options each command means its own way: not held to one default or help (the consistency test reads this).
OWN = {
    "out": "what is written differs: a profile (optimize, plan), a cost file (costs), a directory (export)",
    "force": "each command says which of its files it replaces",
    "profile": "the profile a command reads; what it does with it (decode, re-plan, export) is the command's",
    "costs": "a cost file, used as each command says (re-rank, re-plan, export for)",
    "schemes": "costs: schemes to cost; optimize: a strategy's search space (the strategy's own flag)",
    "study": "optimize: where the study is written; plan: the study to read",
    "plot": "a PNG of each command's own results (bench: speedups; plan: the (m, n) surface; study show: the search)",
    "help": "click's own",
    "engine": "export: the engine a profile is written for; optimize: the engine whose own settings are timed",
}


def _choices(values: Sequence[str], check: Callable[[str], object] | None = None):
    """A parser that accepts ``values`` (or, with ``check``, whatever the library's own check passes: the kernels'
    block sizes), rejecting anything else with the library's own message where it has one."""

    def parse(text: str) -> str:
        word = str(text).strip()
        if check is not None:
            check(word)
        elif word not in values:
            raise typer.BadParameter(f"{word!r:.60} is not one of {', '.join(values)}")
        return word

    return parse


def _complete(values: Sequence[str]):
    return lambda incomplete: [v for v in values if v.startswith(incomplete)]


def choice(*values: str, help: str, check: Callable[[str], object] | None = None, **kwargs) -> typer.models.OptionInfo:
    """A ``typer.Option`` over a fixed set of values, listed in ``--help`` and offered by shell completion."""
    return typer.Option(parser=_choices(values, check), metavar="[" + "|".join(values) + "]", help=help,
                        autocompletion=_complete(values), **kwargs)


# -- kernels: eager, each compiled kernel with each block it takes, and auto ----------------------------------------
def kernel_values(*, costs: bool = False) -> tuple[str, ...]:
    from skipsearch.kernels import REGISTRY

    forms = [name for name, spec in REGISTRY.items() for name in
             (spec.name, *(f"{spec.name}-c{b}" for b in spec.blocks))]
    return (*forms, "auto", *(("fastest",) if costs else ()))


def _check_kernel(word: str) -> None:
    if word not in ("auto", "fastest"):
        from skipsearch.kernels import parse_kernel

        parse_kernel(word)  # the library's own one-line message


def _kernel_help() -> str:
    """--kernel's help, from the kernel registry: every kernel's name, block form and summary."""
    from skipsearch.kernels import REGISTRY

    kernels = "; ".join(f"{name}{'[-c<block>]' if spec.blocks else ''}: {spec.summary}"
                        for name, spec in REGISTRY.items())
    return (f"What runs the full model's forwards (skipsearch/kernels/): {kernels}; or auto: the kernel the "
            "profile(s) record, else eager. costs also takes fastest: it times every compiled kernel that runs here "
            "and keeps the fastest step that beats eager's in the same rounds and changes no greedy choice. "
            "`skipsearch cache` lists the compiled graphs kept on disk.")


KERNEL_HELP = _kernel_help()
# `--kernel fastest` is costs' own; the parser of the other commands refuses it (``reject_fastest``)
Kernel = Annotated[str, choice(*kernel_values(), help=KERNEL_HELP, check=_check_kernel)]
CostsKernel = Annotated[str, choice(*kernel_values(costs=True), help=KERNEL_HELP, check=_check_kernel)]


def reject_fastest(kernel: str) -> str:
    if kernel == "fastest":
        from skipsearch.config import ConfigError

        raise ConfigError("--kernel fastest times the compiled kernel against eager: skipsearch costs does that; "
                          "here give auto, eager, inductor[-c<block>] or panel[-c<block>]")
    return kernel


# -- the shared options ------------------------------------------------------------------------------------------
Model = Annotated[str | None, typer.Option(
    help=f"Model alias, local HF directory, GGUF file or hub id (default: the profile's where one is read, else "
         f"{DEFAULT_MODEL}; `skipsearch models` lists the aliases).")]
def _positive(ctx: typer.Context, param: typer.CallbackParam, value: int) -> int:
    """The bound of a count, said as the library says it (``--max-new-tokens must be >= 1, got 0``), inside typer's
    own ``Invalid value for '--max-new-tokens'``."""
    if value is not None and value < 1:
        raise typer.BadParameter(f"{param.opts[0]} must be >= 1, got {value}")
    return value


MaxNewTokens = Annotated[int, typer.Option(callback=_positive, help="Tokens decoded per prompt (>= 1).")]
NPrompts = Annotated[int, typer.Option(callback=_positive, help="Prompts drawn from --dataset (by --seed; >= 1).")]
Dataset = Annotated[str, typer.Option(
    help="Prompts: mtbench, humaneval (comma-separate to mix them), a .jsonl/.json/.csv/.parquet file, hf:...")]
Repeats = Annotated[int, typer.Option(
    callback=_positive, help="Timed runs per prompt (the median is kept; >= 1); optimize also times each cost its "
                             "surrogate uses in 9 x this many rounds. Raise it on a machine whose timings swing.")]
Seed = Annotated[int, typer.Option(help="Seed of every random choice: which prompts are drawn, the search's "
                                        "proposals, sampling (recorded in what is written).")]
Device = Annotated[str, typer.Option(help="auto (CUDA if available, a model too large for one GPU spread over "
                                          "several; else cpu), cpu, cuda, cuda:N.")]
DType = Annotated[str, choice("auto", *DTYPES, help="auto: float32 on a CPU; on a GPU the checkpoint's own (decode: "
                                                    "the profile's where it names one).")]
TargetPrecision = Annotated[str, choice(
    "auto", *PRECISIONS, help="The model drafts are verified against: native (the checkpoint's weights in --dtype) or "
                              "int8 (every linear as int8 weights, one scale per row, as torchao's "
                              "Int8WeightOnlyConfig; fp32 activations; CPU). auto: the profile's, else native.")]


def precision_of(value: str, auto: str | None = None) -> str | None:
    """--target-precision as the library takes it: the word ``auto`` becomes the argument ``auto`` (None: the
    profile's precision, else native; a command that reads no profile passes "native")."""
    return auto if value == "auto" else value


Threads = Annotated[int | None, typer.Option(min=1, max=MAX_THREADS, help="torch intra-op threads (default: torch's; "
                                                                         "timings and costs depend on them).")]
Json = Annotated[bool, typer.Option("--json", help="JSON on stdout, and nothing else there (messages and progress "
                                                   "go to stderr).")]
JsonOut = Annotated[Path | None, typer.Option("--json-out", help="Write the JSON report to this file.")]
BatchSizes = Annotated[str | None, typer.Option(
    help="Batch sizes B, e.g. 1,2,4,8,16 (each 1 to 1024). costs: the verify cost v(k, B) at each (measured: one eager "
         "forward of B x (k + 1) tokens; a roofline models them, by default at 1,2,4,8,16,32), which plan profile "
         "--profile P --costs C turns into a draft length per batch size. bench (one profile): per B, plain batched "
         "decoding, the profile's schedule, each fixed K and HF's batched generate, in aggregate tokens/s.")]
Report = Annotated[Path | None, typer.Option(help="Write the Markdown report to this file.")]
Split = Annotated[str, choice("heldout", "calib", "all", check=lambda word: _check_split(word),
                              help="heldout (prompts the search did not see), calib (the search's) or all.")]
Storage = Annotated[str | None, typer.Option(help="Optuna RDB URL shared by workers, e.g. postgresql://...")]
StudyName = Annotated[str | None, typer.Option(help="Study name inside --storage.")]


def _check_split(word: str) -> None:
    from skipsearch.data import DataError

    if word not in ("heldout", "calib", "all"):
        raise DataError(f"unknown split {word!r:.40}: use calib, heldout or all")


def objective_values() -> tuple[str, ...]:
    from skipsearch.config import OBJECTIVES

    return OBJECTIVES


def engine_values() -> tuple[str, ...]:
    from skipsearch.export import engines

    return tuple(engines())


def _check_engine(word: str) -> None:
    from skipsearch.export import get_engine

    get_engine(word)  # the library's own one-line message


Objective = Annotated[str, choice(*objective_values(), help="auto (two-stage where the method has a surrogate, else "
                                                            "timed), two-stage (surrogate, then time a shortlist), "
                                                            "surrogate, timed.",
                                  check=lambda word: _check_objective(word))]
LlamaServer = Annotated[str | None, typer.Option(
    help="The llama-server binary (bench --peers llama.cpp, optimize --engine llama.cpp; default: "
         "$SKIPSEARCH_LLAMA_SERVER, else PATH).")]
LlamaTarget = Annotated[str | None, typer.Option(
    help="llama.cpp's target GGUF (bench --peers llama.cpp: comma-separated for several, each after the other; "
    "optimize --engine llama.cpp: one): f32 (the model's weights, HF's numbers), exact (the same weights in the "
    "fewest bytes that give them back, as the panel kernel holds them: a GGUF's own Q4_0/Q4_1/Q8_0 blocks, BF16), q8_0 "
    "(the 8-bit model llama.cpp users run). Default: f32, or q8_0 for the int8 target.")]
VllmPython = Annotated[str | None, typer.Option(
    help="The Python of the venv vLLM is installed in (optimize --engine vllm; default: $SKIPSEARCH_VLLM_PYTHON; "
         "`bash scripts/setup_engines.sh vllm` makes .venv-vllm).")]
Engine = Annotated[str, choice(*engine_values(), help="The engine: hf (transformers' generate), vllm, sglang or "
                                                      "llama.cpp.", check=_check_engine)]


def _check_objective(word: str) -> None:
    from skipsearch.config import ConfigError

    if word not in objective_values():
        raise ConfigError(f"unknown objective '{word:.40}': use {', '.join(objective_values())}")


def in_panel(shared, panel: str):
    """The shared option ``shared`` (one of the ``Annotated`` declarations above) shown under the help panel
    ``panel`` of one command: the same spelling, default and help, grouped with the options it goes with."""
    kind, info = typing.get_args(shared)
    placed = copy.copy(info)
    placed.rich_help_panel = panel
    return Annotated[kind, placed]


# -- old spellings ------------------------------------------------------------------------------------------------
def renamed(old: str, new: str) -> None:
    """The one-line notice of an old spelling that still works for this release."""
    typer.echo(f"notice: {old} is now {new}; {old} still works in this release and goes in the next", err=True)


__all__ = ["DATASET", "DEVICE", "DTYPE", "KERNEL", "MAX_NEW_TOKENS", "N_PROMPTS", "OWN", "REPEATS", "SEED", "SPLIT",
           "TARGET_PRECISION", "CostsKernel", "DType", "Dataset", "Device", "Engine", "Json", "JsonOut", "Kernel",
           "MaxNewTokens", "Model", "NPrompts", "Objective", "Repeats", "Report", "Seed", "Split", "Storage",
           "StudyName", "TargetPrecision", "Threads", "choice", "in_panel", "kernel_values", "reject_fastest",
           "renamed"]
