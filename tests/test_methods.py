"""The shared method suite: every method in skipsearch.methods.REGISTRY, through the registry only.

A new method is tested here as soon as it has its registry line: its ``example`` candidate must
round-trip through a profile, refuse a bad parameter in one line (exit 2 at the CLI), decode greedily
to exactly HF greedy, keep the target distribution when sampling, and report consistent stats.
The toy method at the end is defined in this module alone and goes the whole way: registered,
validated, decoded and benched, with no other module edited. And no method's name appears as a
literal outside its own module.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import yaml
from conftest import assert_one_line_error, make_tiny_model
from test_decoding import SAMPLE_PROMPT, SAMPLE_V, _chi2, _chi2_critical, _exact_target
from typer.testing import CliRunner

from skipsearch import api, bench, methods
from skipsearch.cli import app
from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig, SamplingParams
from skipsearch.engine.decoding import Draft, Drafter, generate, hf_generate
from skipsearch.methods import Method, ParamsError, check_keys, int_param
from skipsearch.profile import ModelRef, Profile, load_profile, profile_to_dict, save_profile

NAMES = methods.names()
PROMPTS = ([5, 9, 2, 33, 7], [1, 2, 3, 1, 2, 3, 1, 2], [40, 41, 42, 43, 40, 41])
SAMPLES = 1500


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_model(num_layers=6, name="tiny6")


@pytest.fixture(scope="module")
def tiny16():
    return make_tiny_model(vocab_size=SAMPLE_V, num_layers=4, head_scale=10.0, name="tiny16")


def _profile(candidate: Candidate, num_layers: int) -> Profile:
    return Profile(model=ModelRef(name="tiny", num_layers=num_layers), method=candidate.method,
                   draft=candidate.draft, method_params=tuple(candidate.plain_params().items()))


@pytest.mark.parametrize("name", NAMES)
def test_every_method_gives_an_example_candidate(name):
    method = methods.get(name)
    assert method.example is not None, f"method {name} must give an example candidate (Method.example)"
    candidate = method.example(6)
    assert candidate.method == name and not candidate.is_autoregressive
    method.parse(candidate.params, draft=candidate.draft, num_layers=6)


@pytest.mark.parametrize("name", NAMES)
def test_profile_round_trip(name, tmp_path):
    candidate = methods.get(name).example(6)
    prof = _profile(candidate, 6)
    loaded = load_profile(save_profile(prof, tmp_path / f"{name}.yaml"))
    assert loaded == prof and loaded.candidate == candidate


@pytest.mark.parametrize("name", NAMES)
def test_a_bad_parameter_is_one_line_and_exit_2(name, tmp_path):
    raw = profile_to_dict(_profile(methods.get(name).example(6), 6))
    raw.setdefault("method_params", {})["bogus_key"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(CliRunner().invoke(app, ["profile", "validate", str(path)]),
                          f"{name}: unknown key method_params.bogus_key")
    with pytest.raises(ParamsError):  # the library's one error type, whatever the method
        methods.get(name).parse(raw["method_params"], draft=DraftConfig(), num_layers=6)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_output_is_hf_greedy(name, tiny):
    candidate = methods.get(name).example(tiny.num_layers)
    drafted = 0
    for prompt in PROMPTS:
        result = generate(tiny, prompt, drafter=methods.build_drafter(candidate, tiny), max_new_tokens=20)
        assert result.token_ids == hf_generate(tiny, prompt, max_new_tokens=20)
        drafted += result.stats.drafted_tokens
    assert drafted > 0  # the method really drafted: the identity is not plain decoding's


@pytest.mark.parametrize("name", NAMES)
def test_sampling_keeps_the_target_distribution(name, tiny16):
    sampling = SamplingParams(temperature=1.0)
    candidate = methods.get(name).example(tiny16.num_layers)
    _, joint = _exact_target(tiny16, sampling)  # P(t2, t3) after the sampled t1
    counts = torch.zeros(SAMPLE_V, SAMPLE_V, dtype=torch.float64)
    drafted = 0
    for seed in range(SAMPLES):
        result = generate(tiny16, SAMPLE_PROMPT, drafter=methods.build_drafter(candidate, tiny16), sampling=sampling,
                          max_new_tokens=3, eos_token_ids=(), seed=seed)
        counts[result.token_ids[1], result.token_ids[2]] += 1
        drafted += result.stats.drafted_tokens
    assert drafted > SAMPLES // 10  # the draft took part (prompt lookup only where a token repeats)
    assert float(counts[joint == 0].sum()) == 0
    for label, obs, exp in (("joint", counts, joint), ("t2", counts.sum(1), joint.sum(1))):
        stat, df = _chi2(obs, exp, SAMPLES)
        assert stat < _chi2_critical(df), f"{name} {label}: chi2 {stat:.1f} (df {df})"


@pytest.mark.parametrize("name", NAMES)
def test_the_drafters_stats(name, tiny):
    candidate = methods.get(name).example(tiny.num_layers)
    s = generate(tiny, PROMPTS[1], drafter=methods.build_drafter(candidate, tiny), max_new_tokens=24).stats
    assert 0 < s.drafted_tokens and 0 <= s.accepted_tokens <= s.drafted_tokens
    assert s.acceptance_rate == s.accepted_tokens / s.drafted_tokens
    assert s.new_tokens == 24 and 1.0 <= s.tau <= 1 + candidate.draft.max_draft_tokens
    # every token after the prefill's came from a verify step, as accepted drafts or the model's own
    assert s.new_tokens - 1 == s.accepted_tokens + s.verify_steps
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in s.drafter_stats)


def test_autoregressive_candidates_build_no_drafter(tiny):
    for name in NAMES:
        candidate = dataclasses.replace(methods.get(name).example(6), draft=DraftConfig(max_draft_tokens=0))
        assert methods.build_drafter(candidate, tiny) is None


# -- a method defined here, registered, validated, decoded and benched with no other module edited ------


@dataclasses.dataclass(frozen=True)
class EchoParams:
    """Drafts the last ``span`` tokens of the sequence again: the toy method's one parameter."""

    method: ClassVar[str] = "toy-echo"
    span: int = 2

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> EchoParams:
        check_keys(cls.method, raw, cls)
        return cls(span=int_param(cls.method, raw, "span", 2, low=1, high=8))

    def to_pairs(self):
        return (("span", self.span),)


class EchoDrafter(Drafter):
    wants_tokens = True

    def __init__(self, span: int, k: int) -> None:
        self.span, self.k = span, k

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator, history):
        tokens = tuple(history[-self.span:])[: min(limit, self.k)]
        from skipsearch.engine.decoding import one_hot_probs

        return Draft(tokens, None if sampling.greedy or not tokens else one_hot_probs(tokens, sm))

    def observe(self, drafted: int, accepted: int) -> None:
        pass


TOY = Method(
    name=EchoParams.method, summary="a test's toy method", params=EchoParams,
    drafter=lambda c, sm: EchoDrafter(c.param("span"), c.draft.max_draft_tokens),
    example=lambda num_layers: Candidate(EchoParams.method, DraftConfig(max_draft_tokens=2, exit=NO_EXIT),
                                         (("span", 2),)),
)


@pytest.fixture
def toy():
    methods.register(TOY)
    yield TOY
    methods.unregister(TOY.name)


def test_a_toy_method_registers_validates_decodes_and_benches(toy, tiny, tmp_path, monkeypatch):
    path = save_profile(_profile(toy.example(6), 6), tmp_path / "toy.yaml")
    assert CliRunner().invoke(app, ["profile", "validate", str(path)]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("span: 2", "span: 9"))
    assert_one_line_error(CliRunner().invoke(app, ["profile", "validate", str(bad)]),
                          "toy-echo: method_params.span must be an integer in 1..8, got 9")
    # decode through the library calls `skipsearch decode` makes, on the tiny model (it has no checkpoint)
    monkeypatch.setattr(tiny, "tokenizer", _Words(), raising=False)
    prof = load_profile(path, num_layers=tiny.num_layers)
    decoded = list(api.decode_prompts(tiny, [_prompt("1 2 3 1 2 3")], drafters=api.drafter_factory(prof, tiny),
                                      max_new_tokens=12))
    assert decoded[0].result.token_ids == hf_generate(tiny, [1, 2, 3, 1, 2, 3], max_new_tokens=12)
    assert decoded[0].result.stats.drafted_tokens > 0
    # bench it beside our autoregressive loop and HF greedy: identical output, a speedup figure
    report = bench.bench(tiny, [_prompt("1 2 3 1 2 3 1 2")], profiles=[(str(path), load_profile(path))],
                         peers=["hf-greedy"], max_new_tokens=16, sweep=False)
    row = next(r for r in report.rows if r.method.startswith("toy-echo"))
    assert row.identical == row.prompts == 1 and row.speedup is not None


def test_an_unregistered_method_is_refused_in_one_line(tmp_path):
    raw = profile_to_dict(_profile(TOY.example(6), 6))
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(CliRunner().invoke(app, ["profile", "validate", str(path)]), "unknown method 'toy-echo'")
    with pytest.raises(ConfigError):
        methods.get("toy-echo")


class _Words:
    """A tokenizer of space-separated integers (the tiny model has none)."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text, **kwargs):
        return type("Enc", (), {"input_ids": [int(t) for t in text.split()]})()

    def encode(self, text, **kwargs):
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _prompt(text: str):
    from skipsearch.data import Prompt

    return Prompt("1", text, False, "toy", "test")


# -- no method name as a literal outside its own module ------------------------------------------------


def test_no_method_name_is_a_literal_outside_its_own_module():
    root = Path(__file__).resolve().parent.parent / "skipsearch"
    # a method's own place: its package skipsearch/methods/<name>/, or its one module skipsearch/methods/<name>.py
    own = {name: root / "methods" / methods.get(name).params.__module__.split(".")[2] for name in NAMES}

    def is_own(name: str, path: Path) -> bool:
        return path == own[name].with_suffix(".py") or own[name] in path.parents

    def engine_words(tree: ast.AST, path: Path) -> set[int]:
        """An exporter's values of a serving engine's own config keys (vLLM's ``{"method": "ngram"}``): that
        engine's words, which a skipsearch method's name may happen to spell."""
        if root / "export" not in path.parents:
            return set()
        return {id(value) for node in ast.walk(tree) if isinstance(node, ast.Dict)
                for key, value in zip(node.keys, node.values, strict=True) if isinstance(key, ast.Constant)}

    found = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        theirs = engine_words(tree, path)
        for node in ast.walk(tree):
            if id(node) in theirs:
                continue
            if isinstance(node, ast.Constant) and node.value in own and not is_own(node.value, path):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}")
    assert not found, "method names belong to their own module (use METHOD.name): " + ", ".join(found)
