"""The Python API: which drafter a profile method gets, and that decode_prompts uses it."""

from __future__ import annotations

import pytest

from skipsearch import api
from skipsearch.api import decode as api_decode
from skipsearch.config import ConfigError, DraftConfig
from skipsearch.data import Prompt
from skipsearch.engine.decoding import LayerSkipDrafter, generate
from skipsearch.profile import ModelRef, Profile


def _profile(method: str, draft: DraftConfig, layers: int = 4) -> Profile:
    return Profile(model=ModelRef("tiny", layers), method=method, draft=draft)


def test_every_name_of_the_api_resolves_from_the_module_it_names_and_only_when_used():
    import subprocess
    import sys

    assert sorted(api.__all__) == sorted(api._HOME)  # the list users read, and where each name is imported from
    for name in api.__all__:
        assert getattr(api, name) is getattr(__import__(api._HOME[name], fromlist=[name]), name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        api.no_such_name  # noqa: B018
    # and its modules, as attributes of the package before anything imported them
    code = "from skipsearch import api; print(api.costs.__name__, api.planning.plan_given.__module__)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout == "skipsearch.api.costs skipsearch.api.planning\n"
    # the decode API alone imports neither the search's study storage nor SQLAlchemy
    code = ("import sys; from skipsearch import api; api.decode_prompts; print(sorted(m for m in "
            "('sqlalchemy', 'skipsearch.api.search', 'skipsearch.search.study') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_no_profile_means_plain_decoding(tiny_sm):
    assert api.drafter_factory(None, tiny_sm)() is None


def test_layer_skip_profiles_get_a_fresh_drafter_each_time(tiny_sm):
    make = api.drafter_factory(_profile("layer-skip", DraftConfig(skip_mlp=(1,), max_draft_tokens=3)), tiny_sm)
    a, b = make(), make()
    assert isinstance(a, LayerSkipDrafter) and a is not b  # adaptive exit state must not leak across prompts
    assert a.config.skip_mlp == (1,) and a.config.max_draft_tokens == 3


def test_an_autoregressive_profile_drafts_nothing(tiny_sm):
    assert api.drafter_factory(_profile("layer-skip", DraftConfig(max_draft_tokens=0)), tiny_sm)() is None


def test_an_unsupported_method_is_a_clear_error(tiny_sm):
    with pytest.raises(ConfigError, match="unknown method 'no-such-method' \\(known: clasp-dynamic, fractal"):
        api.drafter_factory(_profile("no-such-method", DraftConfig()), tiny_sm)


class _FakeTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_decode_prompts_drafts_with_the_profile_and_stays_lossless(tiny_sm, monkeypatch):
    ids = (3, 17, 5, 9, 22)
    monkeypatch.setattr(api_decode, "encode_prompt", lambda tokenizer, prompt: ids)
    monkeypatch.setattr(tiny_sm, "tokenizer", _FakeTokenizer())
    prompts = [Prompt("1", "x", False, "", "t")]
    prof = _profile("layer-skip", DraftConfig(skip_attn=(2,), max_draft_tokens=2))
    [plain] = api.decode_prompts(tiny_sm, prompts, max_new_tokens=12)
    [spec] = api.decode_prompts(tiny_sm, prompts, max_new_tokens=12, drafters=api.drafter_factory(prof, tiny_sm))
    assert spec.result.token_ids == plain.result.token_ids == generate(tiny_sm, ids, max_new_tokens=12).token_ids
    assert spec.text == plain.text
    assert spec.result.stats.drafted_tokens > 0 and plain.result.stats.drafted_tokens == 0
    # K from the profile caps every draft: no cycle emits more than K + 1 tokens
    assert spec.result.stats.tau <= 3
