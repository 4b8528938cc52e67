"""``skipsearch optimize --strategy fractal``: time every (n, w) on a grid and ship the best as a profile.

Why a grid and not a ``Strategy``: strategies propose layer-skip ``DraftConfig``s inside a
``SearchSpace`` and are scored by the surrogate, which replays layer-skip drafts. A fractal
profile is two small integers whose effect no surrogate here models, and the paper's own
search is this grid (its Figure 2), so every point is timed.

Stages:
1. prompts: the calibration split of the dataset, as ``optimize`` uses;
2. grid: each (n, w) decodes every prompt, interleaved prompt by prompt with the autoregressive
   baseline in this process (the order alternates so drift favours neither side); greedy output
   must equal the baseline's, token for token;
3. ship: the fastest point if it beats plain decoding; otherwise ``max_draft_tokens: 0`` (plain
   decoding), with the best point's parameters and figures kept to explain why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from skipsearch.config import NO_EXIT, ConfigError, DraftConfig
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.fractal import METHOD, FractalDrafter, FractalParams, compressed_model, model_bytes
from skipsearch.measure import Measurement
from skipsearch.models import SkippableModel
from skipsearch.objective import time_drafter
from skipsearch.profile import Environment, Measured, ModelRef, Profile, SearchInfo


@dataclass(frozen=True)
class FractalSearchSettings:
    n_values: tuple[int, ...] = (3, 5, 7)
    w_values: tuple[int, ...] = (3, 5, 7)
    dataset: str = "mtbench"
    n_prompts: int = 8
    max_new_tokens: int = 64
    repeats: int = 1  # timed runs per prompt and side (median)
    quantization: str = "auto"
    seed: int = 0  # picks the prompts

    def __post_init__(self) -> None:
        if not self.n_values or not self.w_values:
            raise ConfigError("the fractal grid needs at least one n and one w")
        for n in self.n_values:
            for w in self.w_values:
                FractalParams(n=n, w=w, quantization=self.quantization)  # every point is valid, or fail now
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")


@dataclass(frozen=True)
class GridPoint:
    params: FractalParams
    measurement: Measurement  # timed, against the autoregressive baseline
    accepted_per_verify: float  # accepted draft tokens per verification (the paper's "N + δ")


@dataclass(frozen=True)
class FractalSearchResult:
    profile: Profile
    grid: tuple[GridPoint, ...]  # in grid order
    verdict: str


def search_fractal(
    sm: SkippableModel, settings: FractalSearchSettings, *,
    on_point: Callable[[GridPoint], None] | None = None, on_stage: Callable[[str], None] | None = None,
) -> FractalSearchResult:
    s = settings
    say = on_stage or (lambda _: None)
    grid_params = [FractalParams(n=n, w=w, quantization=s.quantization) for n in s.n_values for w in s.w_values]
    for params in grid_params:
        params.positions(sm.num_layers)  # n larger than the model fails before any timing
    prompts = load_prompts(s.dataset, split="calib", n=s.n_prompts, seed=s.seed)
    encoded = [encode_prompt(sm.tokenizer, p) for p in prompts]
    cm = compressed_model(sm, s.quantization)
    say(f"compressed copy ({cm.scheme}): {cm.nbytes / 2**20:.1f} MiB on top of the model's "
        f"{model_bytes(sm) / 2**20:.1f} MiB")
    say(f"timing {len(grid_params)} (n, w) points on {len(prompts)} prompts from {s.dataset} (calib split)")
    grid = []
    for params in grid_params:
        m, per_verify = time_drafter(sm, encoded, lambda _prompt, p=params: FractalDrafter(sm, p),
                                     max_new_tokens=s.max_new_tokens, repeats=s.repeats)
        point = GridPoint(params, m, per_verify)
        grid.append(point)
        if on_point:
            on_point(point)
    best = max(grid, key=lambda g: g.measurement.speedup)
    m = best.measurement
    pays = m.speedup > 1.0
    label = f"n={best.params.n} w={best.params.w}"
    if pays:
        verdict = f"ships fractal {label}: {m.speedup:.3f}x measured against autoregressive decoding"
    else:
        verdict = (f"no (n, w) beat plain decoding on this hardware: ships max_draft_tokens 0; best was {label} "
                   f"at {m.speedup:.3f}x with tau {m.tau:.2f}")
    extra = (
        ("scheme", cm.scheme), ("compressed_mib", round(cm.nbytes / 2**20, 2)),
        ("model_mib", round(model_bytes(sm) / 2**20, 2)),
        ("accepted_per_verify", round(best.accepted_per_verify, 3)),
        # the whole grid, so that a profile shows what it was chosen from
        ("grid", [[g.params.n, g.params.w, round(g.measurement.speedup, 4), round(g.measurement.tau or 0, 3),
                   round(g.accepted_per_verify, 3)] for g in grid]),
        ("grid_columns", ["n", "w", "speedup", "tau", "accepted_per_verify"]),
    )
    measured = Measured(
        speedup=m.speedup, tokens_per_s=m.tokens_per_s, baseline_tokens_per_s=m.baseline_tokens_per_s, tau=m.tau,
        acceptance_rate=m.acceptance_rate, baseline="skipsearch autoregressive, same process, interleaved",
        device=str(sm.device), dataset=f"{s.dataset} (calib split)", n_prompts=len(prompts),
        max_new_tokens=s.max_new_tokens, seed=s.seed, source="optimize",
        notes=verdict + "; greedy and sampling (rejection rule on the draft's q) are both lossless", extra=extra,
    )
    profile = Profile(
        model=ModelRef(name=sm.name, num_layers=sm.num_layers, dtype=sm.dtype_name, fingerprint=sm.fingerprint),
        method=METHOD,
        draft=DraftConfig(max_draft_tokens=best.params.max_draft_tokens if pays else 0, exit=NO_EXIT),
        measured=measured,
        environment=Environment.current(str(sm.device)),
        search=SearchInfo(strategy="fractal", budget=len(grid), trials=len(grid), objective="timed", seed=s.seed),
        method_params=best.params.to_method_params(sm.num_layers, sm.device),
    )
    return FractalSearchResult(profile, tuple(grid), verdict)


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """``"3,5,7"`` -> (3, 5, 7); anything else is a one-line ConfigError naming the option."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values:
        raise ConfigError(f"{option} must be comma-separated integers, e.g. 3,5,7; got {text!r}")
    return values
