"""The shared suite: every strategy in REGISTRY, against a deterministic fake objective (no model).

A new strategy is tested here as soon as it has its registry line. Strategies of the layer-skip
method (skip sets in a SearchSpace) run the layer-skip part of the suite as well; grid strategies
(fractal, ngram) the grid part. Searches are cached per (strategy, depth, seed, budget) so that
several assertions share one run.
"""

from __future__ import annotations

import functools
import inspect
import statistics
from dataclasses import replace

import optuna
import pytest

from skipsearch import methods
from skipsearch.config import Candidate, ConfigError, DraftConfig, ExitRule
from skipsearch.measure import Measurement
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import REGISTRY, Strategy, make_strategy
from skipsearch.search.study import open_study, records, run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)
ALL = sorted(REGISTRY)
NAMES = sorted(n for n, cls in REGISTRY.items() if cls.methods[0] is LAYER_SKIP)  # they search skip sets
GRIDS = sorted(n for n in REGISTRY if make_strategy(n, SearchSpace(num_layers=30)).plan().max_trials is not None)


def good_layers(num_layers: int) -> range:
    # Layers 10..19 of a 40-layer model, scaled with depth: skipping their attention pays.
    return range(num_layers // 4, num_layers // 2)


def fake_speedup(config: DraftConfig, num_layers: int) -> float:
    good = good_layers(num_layers)
    return (1.0 + 0.05 * sum(i in good for i in config.skip_attn) - 0.2 * len(config.skip_mlp)
            - 0.03 * abs(config.max_draft_tokens - 3) + 0.002 * config.exit.threshold)


def optimum(space: SearchSpace) -> float:
    return 1.0 + 0.05 * len(good_layers(space.num_layers)) + 0.002 * space.thresholds[1]


class FakeObjective:
    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.calls: list[Candidate] = []

    def evaluate(self, candidate: Candidate, *, kind: str) -> Measurement:
        self.calls.append(candidate)
        if candidate.method == LAYER_SKIP.name:
            return Measurement(kind=kind, speedup=fake_speedup(candidate.draft, self.num_layers))
        # other methods: a smooth function of the draft length and of every integer parameter
        ints = [v for _, v in candidate.params if isinstance(v, int) and not isinstance(v, bool)]
        k = candidate.draft.max_draft_tokens
        return Measurement(kind=kind, speedup=1.0 - 0.01 * abs(k - 4) - 0.001 * sum(ints))


def search_candidates(name: str, space: SearchSpace, *, seed: int, budget: int,
                      warm_start: tuple[DraftConfig, ...] = ()) -> tuple[Strategy, list[Candidate]]:
    strategy = make_strategy(name, space, seed=seed, warm_start=warm_start)
    study = open_study(strategy=strategy)  # in memory: a fresh study every time
    run_search(study, strategy, FakeObjective(space.num_layers), budget=budget)
    recs = records(study)
    assert [r.state for r in recs] == ["COMPLETE"] * budget
    return strategy, [r.candidate for r in recs]


def search(name: str, space: SearchSpace, *, seed: int, budget: int,
           warm_start: tuple[DraftConfig, ...] = ()) -> tuple[Strategy, list[DraftConfig]]:
    strategy, candidates = search_candidates(name, space, seed=seed, budget=budget, warm_start=warm_start)
    assert {c.method for c in candidates} == {LAYER_SKIP.name}
    return strategy, [c.draft for c in candidates]


cached_search = functools.cache(lambda name, num_layers, seed, budget: search(
    name, SearchSpace(num_layers=num_layers), seed=seed, budget=budget))


# -- every strategy --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_candidates_are_valid_profiles_of_the_strategys_method(name):
    strategy, candidates = search_candidates(name, SearchSpace(num_layers=30), seed=0, budget=6)
    method = strategy.method
    assert methods.get(method.name) is method  # the strategy searches a registered method
    for c in candidates:
        assert c.method == method.name
        method.parse(c.params, draft=c.draft, num_layers=30)  # the method's own validation accepts it
        assert not c.is_autoregressive


@pytest.mark.parametrize("name", ALL)
def test_same_seed_gives_the_same_candidates(name):
    _, first = search_candidates(name, SearchSpace(num_layers=30), seed=0, budget=8)
    _, again = search_candidates(name, SearchSpace(num_layers=30), seed=0, budget=8)
    assert again == first


@pytest.mark.parametrize("name", GRIDS)
def test_a_grid_is_visited_once_each_and_a_budget_takes_a_subset(name):
    space = SearchSpace(num_layers=30)
    strategy = make_strategy(name, space, seed=0)
    size = strategy.plan().max_trials
    _, whole = search_candidates(name, space, seed=0, budget=size)
    assert len(set(whole)) == size  # every point once: nothing is evaluated twice
    _, part = search_candidates(name, space, seed=1, budget=3)
    assert len(set(part)) == 3 and set(part) <= set(whole)
    _, other = search_candidates(name, space, seed=2, budget=3)
    assert other != part  # the order is seeded


@pytest.mark.parametrize("name", ALL)
def test_a_strategy_that_cannot_warm_start_refuses_one_in_one_line(name):
    from skipsearch.search.optimize import SearchSettings, build_strategy

    warm = (DraftConfig(skip_attn=(3,), max_draft_tokens=2),)
    settings = SearchSettings(strategy=name)
    if REGISTRY[name].warm_starts:
        build_strategy(SearchSpace(num_layers=30), settings, warm_start=warm)
    else:
        with pytest.raises(ConfigError, match=f"strategy '{name}' cannot start from a profile's skip set"):
            build_strategy(SearchSpace(num_layers=30), settings, warm_start=warm)


# -- the shared strategy suite ---------------------------------------------------------------------


@pytest.mark.parametrize("num_layers", [4, 30, 40])
@pytest.mark.parametrize("name", NAMES)
def test_proposals_are_valid_for_any_depth(name, num_layers):
    space = SearchSpace(num_layers=num_layers)
    _, configs = cached_search(name, num_layers, 0, 15)
    assert len(configs) == 15
    for config in configs:
        assert space.contains(config), config
        config.check_layers(num_layers)
        skipped = set(config.skip_attn) | set(config.skip_mlp)
        assert skipped and not skipped & {0, num_layers - 1}
        assert config.skip_ratio(num_layers) <= space.max_skip_ratio
        assert config.max_draft_tokens in space.max_draft_tokens


@pytest.mark.parametrize("name", NAMES)
def test_restricted_space_is_respected(name):
    space = SearchSpace(num_layers=10, sublayers="attn", adaptive_exit=False, protect_ends=False,
                        thresholds=(0.3, 0.3), max_draft_tokens=(2, 5), max_skip_ratio=0.2)
    _, configs = search(name, space, seed=0, budget=12)
    for config in configs:
        assert space.contains(config), config
        assert not config.skip_mlp and 1 <= len(config.skip_attn) <= 4
        assert config.exit.adaptive is False and config.exit.threshold == 0.3
        assert config.max_draft_tokens in (2, 5)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_gives_the_same_sequence(name):
    _, first = cached_search(name, 30, 0, 15)
    _, again = search(name, SearchSpace(num_layers=30), seed=0, budget=15)  # a fresh run, not the cache
    assert again == first


@pytest.mark.parametrize("name", NAMES)
def test_another_seed_gives_another_sequence(name):
    strategy, first = cached_search(name, 30, 0, 15)
    _, other = cached_search(name, 30, 1, 15)
    seeds = len(strategy.plan().seeds)
    assert other[:seeds] == first[:seeds]  # the seed points do not depend on the seed...
    assert other[seeds:] != first[seeds:]  # ...what the strategy proposes after them does


@pytest.mark.parametrize("name", NAMES)
def test_search_improves_on_its_seed_points(name):
    space = SearchSpace(num_layers=30)
    gains = []
    for seed in (0, 1, 2):
        strategy, configs = cached_search(name, 30, seed, 30)
        seeds = len(strategy.plan().seeds)
        best_seed = max(fake_speedup(c, 30) for c in configs[:seeds])
        best = max(fake_speedup(c, 30) for c in configs)
        assert best <= optimum(space) + 1e-9
        gains.append(best - best_seed)
    # On the median seed, at least one more good layer skipped than the best seed point: an
    # eighth of the way from the seed points (1.0) to the optimum (1.4) in 30 trials.
    assert statistics.median(gains) >= 0.04, gains


@pytest.mark.parametrize("name", NAMES)
def test_seed_points_come_first_warm_start_before_probes(name):
    space = SearchSpace(num_layers=30)
    warm = (DraftConfig(skip_attn=(8, 9, 11), max_draft_tokens=3, exit=ExitRule(threshold=0.4, adaptive=False)),
            DraftConfig(skip_attn=(12,), skip_mlp=(20,), max_draft_tokens=1, exit=ExitRule(threshold=0.7)))
    probes = space.probe_configs()
    strategy, configs = search(name, space, seed=0, budget=len(warm) + len(probes) + 1, warm_start=warm)
    assert [s.config for s in strategy.plan().seeds] == [*warm, *probes]
    assert configs[: len(warm) + len(probes)] == [*warm, *probes]


@pytest.mark.parametrize("name", NAMES)
def test_warm_start_outside_the_space_is_repaired(name):
    space = SearchSpace(num_layers=8, max_draft_tokens=(2, 4))
    outside = DraftConfig(skip_attn=(0, 3, 7, 9), max_draft_tokens=3, exit=ExitRule(threshold=0.95))
    _, configs = search(name, space, seed=0, budget=1, warm_start=(outside,))
    assert configs[0] == space.repair(outside)
    assert configs[0].skip_attn == (3,) and configs[0].max_draft_tokens == 2 and configs[0].exit.threshold == 0.9


@pytest.mark.parametrize("name", ALL)
def test_registry_entry_builds_a_seeded_strategy_with_a_sampler(name):
    strategy = make_strategy(name, SearchSpace(num_layers=6), seed=3)
    assert isinstance(strategy, Strategy) and strategy.seed == 3
    assert isinstance(strategy.sampler(), optuna.samplers.BaseSampler)


def test_every_method_s_search_entry_is_registered_and_every_strategy_searches_a_method():
    entries = {m.name: m.strategy for m in methods.REGISTRY.values() if m.strategy is not None}
    assert {name: e for name, e in entries.items() if e not in REGISTRY} == {}
    assert {name: [m.name for m in cls.methods] for name, cls in REGISTRY.items()
            if any(methods.REGISTRY.get(m.name) is not m for m in cls.methods)} == {}


# -- what a strategy declares: its methods and its options ------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_the_declared_options_are_the_constructors_settings_with_its_defaults(name):
    cls = REGISTRY[name]
    base = {"self", "space", "method", "seed", "warm_start"}
    params = {p.name: p for p in inspect.signature(cls.__init__).parameters.values() if p.name not in base}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert [o.name for o in cls.options] == list(params)  # every setting declared, in the constructor's order
    for o in cls.options:
        assert o.default == params[o.name].default and o.help, o
        if o.method is not None:  # an option that picks a method picks one the strategy declares
            assert any(o.method is m for m in cls.methods), o


@pytest.mark.parametrize("name", ALL)
def test_a_strategy_is_made_for_one_method_and_keeps_it(name):
    cls = REGISTRY[name]
    strategy = make_strategy(name, SearchSpace(num_layers=30), seed=0)
    assert strategy.method is cls.methods[0]
    with pytest.raises(AttributeError):
        strategy.method = cls.methods[-1]
    _, candidates = search_candidates(name, SearchSpace(num_layers=30), seed=0, budget=4)
    assert {c.method for c in candidates} == {cls.methods[0].name}


@pytest.mark.parametrize("name", ["tpe", "bayes", "clasp"])
def test_an_option_that_names_a_method_makes_the_strategy_propose_for_it(name):
    from skipsearch.methods.precision import METHOD as PRECISION

    strategy = make_strategy(name, SearchSpace(num_layers=6), seed=0, schemes=("int8",))
    assert strategy.method is PRECISION and REGISTRY[name].methods[0] is LAYER_SKIP
    study = open_study(strategy=strategy)
    run_search(study, strategy, FakeObjective(6), budget=4)
    assert {r.candidate.method for r in records(study)} == {PRECISION.name}
    assert strategy.method is PRECISION


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("tpe", {"n_values": (3,)}, "strategy 'tpe' does not take --n"),
        ("tpe", {"loi": 3}, "strategy 'tpe' does not take --clasp-loi"),
        ("ngram", {"nope_option": 1}, "strategy 'ngram' does not take --nope-option"),
        ("bayes", {"xi": -0.5}, "strategy 'bayes': --xi must be a number >= 0, got -0.5"),
        ("bayes", {"n_uniform": 2.5}, "strategy 'bayes': --n-uniform must be an integer >= 1, got 2.5"),
        ("bayes", {"n_parents": True}, "strategy 'bayes': --n-parents must be an integer >= 1, got True"),
        ("precision", {"k_values": (2, 0)}, "strategy 'precision': --k-values must be comma-separated integers >= 1"),
        ("precision", {"k_values": ()}, "strategy 'precision': --k-values must be comma-separated integers >= 1"),
        ("hybrid", {"vocab_sizes": (-1,)}, "strategy 'hybrid': --vocab-sizes must be comma-separated integers >= 0"),
        ("hybrid", {"schemes": "fp16"}, "strategy 'hybrid': --schemes must be comma-separated strings, got 'fp16'"),
        ("fractal", {"quantization": 8}, "strategy 'fractal': --quantization must be a string, got 8"),
    ],
)
def test_options_are_checked_against_the_declaration_in_one_line(name, options, message):
    with pytest.raises(ConfigError) as caught:
        make_strategy(name, SearchSpace(num_layers=8), seed=0, **options)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_declared_values_reach_the_strategy():
    bayes = make_strategy("bayes", SearchSpace(num_layers=8), xi=0.5, n_uniform=3, gp_restarts=1)
    assert (bayes.xi, bayes.n_uniform, bayes.gp_restarts) == (0.5, 3, 1)
    precision = make_strategy("precision", SearchSpace(num_layers=8), k_values=(4, 2), vocab_sizes=[0])
    assert precision.k_values == (2, 4) and precision.vocab_sizes == (0,)


def test_unknown_strategy_is_a_config_error():
    assert {"bayes", "clasp", "fractal", "ngram", "tpe"} <= set(REGISTRY)
    with pytest.raises(ConfigError, match=rf"^unknown strategy 'nope': use {', '.join(sorted(REGISTRY))}$"):
        make_strategy("nope", SearchSpace(num_layers=6), seed=0)


# -- the search space -------------------------------------------------------------------------------


def test_skippable_layers_protect_the_ends_unless_told_not_to():
    assert SearchSpace(num_layers=6).skippable_layers() == (1, 2, 3, 4)
    assert SearchSpace(num_layers=6, protect_ends=False).skippable_layers() == (0, 1, 2, 3, 4, 5)


def test_config_from_bits_enforces_protect_ends_and_sublayers():
    space = SearchSpace(num_layers=5, sublayers="attn")
    ones = [True] * 5
    config = space.config_from_bits(ones, ones, 2, 0.4, False)
    assert config.skip_attn == (1, 2, 3) and config.skip_mlp == ()
    assert config.max_draft_tokens == 2 and config.exit == ExitRule(threshold=0.4, adaptive=False)
    both = SearchSpace(num_layers=5, protect_ends=False).config_from_bits(ones, [False, True] + [False] * 3,
                                                                          1, 0.0, True)
    assert both.skip_attn == (0, 1, 2, 3, 4) and both.skip_mlp == (1,)
    with pytest.raises(ConfigError, match="one bit per layer"):
        space.config_from_bits([True] * 4, ones, 2, 0.4, False)


def test_feasible_is_the_skip_ratio_bound():
    space = SearchSpace(num_layers=10, max_skip_ratio=0.25)  # at most 5 of 20 sublayers
    assert space.feasible(DraftConfig(skip_attn=(1, 2, 3), skip_mlp=(4, 5)))
    assert not space.feasible(DraftConfig(skip_attn=(1, 2, 3), skip_mlp=(4, 5, 6)))


def test_repair_drops_from_the_highest_layer_down():
    config = DraftConfig(skip_attn=(2, 5, 8), skip_mlp=(3, 8, 9))  # 9 is protected: 5 skips count
    assert SearchSpace(num_layers=10, max_skip_ratio=0.25).repair(config) == replace(config, skip_mlp=(3, 8))
    four = SearchSpace(num_layers=10, max_skip_ratio=0.2)
    assert four.repair(config) == replace(config, skip_mlp=(3,))  # the MLP of layer 8 goes before its attention
    three = SearchSpace(num_layers=10, max_skip_ratio=0.15)
    repaired = three.repair(config)
    assert repaired == replace(config, skip_attn=(2, 5), skip_mlp=(3,))
    assert three.contains(repaired) and three.repair(repaired) == repaired


def test_repair_fits_k_threshold_and_a_fixed_exit_mode():
    space = SearchSpace(num_layers=8, max_draft_tokens=(2, 4, 8), thresholds=(0.2, 0.6), adaptive_exit=False)
    repaired = space.repair(DraftConfig(skip_attn=(3,), max_draft_tokens=3, exit=ExitRule(threshold=0.9)))
    assert repaired.max_draft_tokens == 2  # a tie goes to the shorter draft
    assert repaired.exit.threshold == 0.6 and repaired.exit.adaptive is False
    assert space.repair(DraftConfig(skip_attn=(3,), max_draft_tokens=7)).max_draft_tokens == 8
    assert not space.contains(DraftConfig(skip_attn=(3,), max_draft_tokens=3))
    assert not space.contains(DraftConfig(skip_attn=(0,), max_draft_tokens=2, exit=ExitRule(0.3, adaptive=False)))
    assert space.contains(DraftConfig(skip_attn=(3,), max_draft_tokens=2, exit=ExitRule(0.3, adaptive=False)))


def test_threshold_grid_and_snapping():
    space = SearchSpace(num_layers=8, thresholds=(0.1, 0.72))
    assert space.threshold_grid() == (0.1, 0.7, 0.05)
    assert space.snap_threshold(0.33) == 0.35 and space.snap_threshold(0.99) == 0.7
    assert space.snap_threshold(0.0) == 0.1
    off_grid = DraftConfig(skip_attn=(3,), max_draft_tokens=2, exit=ExitRule(threshold=0.33))
    assert not space.contains(off_grid)
    assert space.repair(off_grid).exit.threshold == 0.35 and space.contains(space.repair(off_grid))


@pytest.mark.parametrize("num_layers", [3, 4, 12, 30, 40, 80])
def test_probe_configs_are_derived_from_depth(num_layers):
    space = SearchSpace(num_layers=num_layers)
    probes = space.probe_configs()
    assert 1 <= len(probes) <= 8 and len(set(probes)) == len(probes)
    for config in probes:
        assert space.contains(config) and (config.skip_attn or config.skip_mlp)
        assert config.max_draft_tokens <= 3  # short drafts: on a CPU a draft step is nearly a full one
    layers = {i for c in probes for i in (*c.skip_attn, *c.skip_mlp)}
    if num_layers >= 12:  # the upper half is covered, however deep the model
        assert max(layers) >= num_layers - 3 and min(layers) < num_layers * 3 // 4


@pytest.mark.parametrize("sublayers", ["attn", "mlp"])
def test_probe_configs_use_only_the_allowed_sublayer(sublayers):
    probes = SearchSpace(num_layers=24, sublayers=sublayers).probe_configs()
    assert len(probes) >= 3
    assert all(not (c.skip_mlp if sublayers == "attn" else c.skip_attn) for c in probes)


@pytest.mark.parametrize("settings, message", [
    ({"num_layers": 0}, "num_layers must be an integer >= 1"),
    ({"num_layers": True}, "num_layers must be an integer >= 1"),
    ({"max_draft_tokens": ()}, "max_draft_tokens choices"),
    ({"max_draft_tokens": (0, 2)}, "max_draft_tokens choices"),
    ({"max_draft_tokens": (1.5,)}, "max_draft_tokens choices"),
    ({"thresholds": (0.6, 0.2)}, "thresholds must be"),
    ({"thresholds": (0.0, 1.2)}, "thresholds must be"),
    ({"thresholds": (0.5,)}, "thresholds must be"),
    ({"thresholds": ("a", "b")}, "thresholds must be"),
    ({"max_draft_tokens": 4}, "max_draft_tokens choices"),
    ({"max_skip_ratio": "half"}, "max_skip_ratio must be in"),
    ({"protect_ends": None}, "protect_ends must be"),
    ({"adaptive_exit": "yes"}, "adaptive_exit must be"),
    ({"max_skip_ratio": 0.0}, "max_skip_ratio must be in"),
    ({"max_skip_ratio": 1.5}, "max_skip_ratio must be in"),
    ({"sublayers": "ffn"}, "sublayers must be one of"),
    ({"threshold_step": 0.0}, "threshold_step must be"),
    ({"num_layers": 2}, "no layer to skip"),
    ({"num_layers": 4, "max_skip_ratio": 0.1}, "allows no skipped sublayer"),
])
def test_bad_space_settings_are_config_errors(settings, message):
    with pytest.raises(ConfigError, match=message) as info:
        SearchSpace(**{"num_layers": 8, **settings})
    assert "\n" not in str(info.value)
