"""The bounds a profile's numbers must keep, and those of the commands' numeric options: what the engine can run,
in one place, so that ``profile validate`` refuses what ``decode`` would refuse or silently misuse.

Every number here is either the engine's own limit or a stated constant with the reason beside it. The profile
reader (``skipsearch.profile``) checks every numeric field of a profile against ``PROFILE_BOUNDS``; the CLI declares
each numeric option with its bound from here (shown in ``--help``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from skipsearch.files.yamlio import short

# The dtypes a model is loaded in (skipsearch.model.placement.DTYPES, which needs torch; tests/test_profile.py
# checks the two agree). A profile's model.dtype names one of them.
DTYPES = ("float32", "float16", "bfloat16")

# The engine's limit on K: a draft of K tokens and the pending token are verified in one forward of K + 1 positions,
# which must fit the KV cache a model is placed with when the caller does not size it (placement.DEFAULT_MAX_TOKENS,
# 4096 positions; tests/test_profile.py checks the two agree). A longer draft can never run.
MAX_DRAFT_TOKENS = 4095

# The deepest public decoder LLMs have about 128 layers (Llama 3.1 405B: 126). A profile's model.num_layers above
# this bound names no real model: a typo, or a hostile file (a layer count of 10^12 sizes loops and messages).
MAX_LAYERS = 1024

# torch intra-op threads (--threads): far above any machine's cores; a value past it would only ask torch for an
# absurd thread pool.
MAX_THREADS = 1024

# plan's (m, n) table (--max-m, --max-n): its cost grows as max_m^3 * max_n^2 (each row convolves m rounds of up to
# n + 1 tokens), so the bounds keep the table to seconds; the largest block, max_m * (max_n + 1) = 1088 tokens, is a
# draft the engine runs (MAX_DRAFT_TOKENS).
MAX_PLAN_M = 64
MAX_PLAN_N = 16

# A batch size (``costs --batch-sizes``, a schedule's ranges): far above the sequences any server batches in one
# forward; a value past it is a typo, or a hostile file sizing loops.
MAX_BATCH_SIZE = 4096

INF = math.inf

# path -> (lowest, highest) allowed, inclusive; every numeric field of a profile is also finite. A path not here (a
# seed) may be any integer.
PROFILE_BOUNDS: dict[str, tuple[float, float]] = {
    "model.num_layers": (1, MAX_LAYERS),
    "draft.max_draft_tokens": (0, MAX_DRAFT_TOKENS),
    "measured.speedup": (0, INF),
    "measured.tokens_per_s": (0, INF),
    "measured.baseline_tokens_per_s": (0, INF),
    "measured.tau": (0, INF),
    "measured.acceptance_rate": (0, 1),
    "measured.predicted_speedup": (0, INF),
    "measured.wall_seconds": (0, INF),
    "measured.n_prompts": (0, INF),
    "measured.max_new_tokens": (0, INF),
    "environment.threads": (1, MAX_THREADS),
    "search.budget": (0, INF),
    "search.trials": (0, INF),
}


def _shown(value: float) -> str:
    return "inf" if value == INF else f"{value:g}"


def range_text(low: float, high: float) -> str:
    """``low..high`` as a message shows a range; ``>= low`` when it has no top."""
    return f">= {_shown(low)}" if high == INF else f"in {_shown(low)}..{_shown(high)}"


def out_of_bounds(path: str, value: Any) -> str | None:
    """What is wrong with ``value`` at ``path`` (a number of a profile), or None: not finite, or outside
    PROFILE_BOUNDS[path]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None  # its type is the section reader's to refuse
    if not math.isfinite(value):
        return f"{path} must be a finite number, got {value}"
    low, high = PROFILE_BOUNDS.get(path, (-INF, INF))
    if not low <= value <= high:
        return f"{path} must be {range_text(low, high)}, got {value}"
    return None


def check_section(values: dict, section: str) -> str | None:
    """The first problem among one section's coerced values (``{key: value}``), or None."""
    for key, value in values.items():
        problem = out_of_bounds(f"{section}.{key}", value)
        if problem:
            return problem
    return None


def check_dtype(dtype: str, path: str = "model.dtype") -> str | None:
    return None if dtype in DTYPES else f"{path} must be one of {', '.join(DTYPES)}, got {short(dtype)}"


__all__ = ["DTYPES", "MAX_BATCH_SIZE", "MAX_DRAFT_TOKENS", "MAX_LAYERS", "MAX_PLAN_M", "MAX_PLAN_N", "MAX_THREADS",
           "PROFILE_BOUNDS",
           "check_dtype", "check_section", "out_of_bounds", "range_text"]
