"""The skippable adapter on a tiny random Llama: module swaps, per-layer KV, crop, positions."""

from __future__ import annotations

import copy

import pytest
import torch

from skipsearch.checkpoints import ModelError
from skipsearch.config import ConfigError, DraftConfig
from skipsearch.model.loader import load_model
from skipsearch.model.skippable import SkippableModel

PROMPT = [5, 17, 3, 42, 8]  # 5 tokens: the cache holds positions 0..4 after prefill
P = len(PROMPT)


def _modules(sm: SkippableModel) -> list[tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]]:
    return [(layer, layer.self_attn, layer.mlp) for layer in sm.layers]


def _assert_restored(sm: SkippableModel, before) -> None:
    after = _modules(sm)
    assert len(after) == len(before) == sm.num_layers
    for i, ((layer, attn, mlp), (layer0, attn0, mlp0)) in enumerate(zip(after, before, strict=True)):
        assert layer is layer0, f"layer {i} not restored"
        assert attn is attn0, f"layer {i} attention not restored"
        assert mlp is mlp0, f"layer {i} MLP not restored"
    assert sm.hf.model.layers is sm.layers


def _prefill(sm: SkippableModel, ids=PROMPT):
    cache = sm.new_cache()
    logits = sm.forward(torch.tensor(ids), start=0, cache=cache)
    return cache, logits


def _draft_steps(sm: SkippableModel, cache, config: DraftConfig, tokens, start: int) -> list[torch.Tensor]:
    out = []
    with sm.drafting(config):
        for j, tok in enumerate(tokens):
            out.append(sm.forward(torch.tensor([tok]), start=start + j, cache=cache, last_only=True)[-1])
    return out


# -- the draft context -----------------------------------------------------------------------------
def test_drafting_swaps_the_configured_sublayers_and_restores_them(tiny_sm):
    sm = tiny_sm
    before = _modules(sm)
    config = DraftConfig(skip_attn=(0, 1), skip_mlp=(1, 3))  # layer 1: both -> whole layer swapped
    with sm.drafting(config):
        assert sm.layers[0].self_attn is not before[0][1] and sm.layers[0].mlp is before[0][2]
        assert sm.layers[1] is not before[1][0]  # whole layer replaced
        assert not hasattr(sm.layers[1], "self_attn")
        assert sm.layers[2] is before[2][0] and sm.layers[2].self_attn is before[2][1]
        assert sm.layers[2].mlp is before[2][2]
        assert sm.layers[3].self_attn is before[3][1] and sm.layers[3].mlp is not before[3][2]
    _assert_restored(sm, before)


def test_drafting_restores_every_module_when_the_body_raises(tiny_sm):
    sm = tiny_sm
    before = _modules(sm)
    keys = set(sm.hf.state_dict())
    ids = torch.tensor(PROMPT)
    reference = sm.forward(ids, start=0, cache=sm.new_cache())
    config = DraftConfig(skip_attn=(0, 1, 2, 3), skip_mlp=(1, 2))
    with pytest.raises(KeyError, match="boom"):
        with sm.drafting(config):
            sm.forward(ids, start=0, cache=sm.new_cache())
            raise KeyError("boom")
    _assert_restored(sm, before)
    assert set(sm.hf.state_dict()) == keys
    assert torch.equal(sm.forward(ids, start=0, cache=sm.new_cache()), reference)
    with sm.drafting(config):  # the context is usable again: no stale "drafting" flag
        pass
    _assert_restored(sm, before)


def test_drafting_does_not_nest(tiny_sm):
    sm = tiny_sm
    before = _modules(sm)
    with sm.drafting(DraftConfig(skip_attn=(1,))):
        with pytest.raises(RuntimeError, match="nest"):
            with sm.drafting(DraftConfig(skip_mlp=(2,))):
                pass
        # the failed inner call must not have undone the outer swap
        assert sm.layers[1].self_attn is not before[1][1]
    _assert_restored(sm, before)


@pytest.mark.parametrize(
    "config",
    [DraftConfig(skip_attn=(4,)), DraftConfig(skip_mlp=(0, 99)), DraftConfig(skip_attn=(1,), skip_mlp=(4,))],
    ids=["attn-4", "mlp-99", "mlp-4"],
)
def test_out_of_range_layer_raises_config_error_and_swaps_nothing(tiny_sm, config):
    before = _modules(tiny_sm)
    with pytest.raises(ConfigError, match="0..3") as info:
        with tiny_sm.drafting(config):
            pytest.fail("the body must not run")
    assert "\n" not in str(info.value)
    _assert_restored(tiny_sm, before)
    with tiny_sm.drafting(DraftConfig(skip_attn=(3,))):  # not left in a drafting state
        pass


# -- per-layer KV while drafting -------------------------------------------------------------------
@pytest.mark.parametrize("layer", [0, 1, 2, 3])
def test_skipped_attention_appends_no_kv_in_that_layer(tiny_sm, layer):
    sm = tiny_sm
    cache, _ = _prefill(sm)
    assert sm.cache_lengths(cache) == (P,) * 4
    logits = _draft_steps(sm, cache, DraftConfig(skip_attn=(layer,)), [7, 9, 11], start=P)
    expected = tuple(P if i == layer else P + 3 for i in range(4))
    assert sm.cache_lengths(cache) == expected
    assert all(torch.isfinite(x).all() for x in logits)


def test_skipping_several_attentions_including_layer_0(tiny_sm):
    sm = tiny_sm
    cache, _ = _prefill(sm)
    _draft_steps(sm, cache, DraftConfig(skip_attn=(0, 2)), [7, 9], start=P)
    assert sm.cache_lengths(cache) == (P, P + 2, P, P + 2)


@pytest.mark.parametrize("layer", [0, 3])
def test_skipped_mlp_still_appends_kv(tiny_sm, layer):
    sm = tiny_sm
    cache, _ = _prefill(sm)
    _draft_steps(sm, cache, DraftConfig(skip_mlp=(layer,)), [7, 9], start=P)
    assert sm.cache_lengths(cache) == (P + 2,) * 4


def test_skipping_attention_and_mlp_replaces_the_whole_layer(tiny_sm):
    sm = tiny_sm
    cache, _ = _prefill(sm)
    original = sm.layers[2]
    config = DraftConfig(skip_attn=(2,), skip_mlp=(2, 3))
    with sm.drafting(config):
        assert sm.layers[2] is not original
        hidden = torch.randn(1, 3, 32)
        assert sm.layers[2](hidden) is hidden  # identity: adds nothing, not even the norms
    _draft_steps(sm, cache, config, [7, 9], start=P)
    assert sm.cache_lengths(cache) == (P + 2, P + 2, P, P + 2)


def _zeroed(sm: SkippableModel, *, attn=(), mlp=()) -> SkippableModel:
    """A deep copy whose given sublayers output exactly zero (o_proj / down_proj zeroed)."""
    model = copy.deepcopy(sm.hf)
    with torch.no_grad():
        for i in attn:
            model.model.layers[i].self_attn.o_proj.weight.zero_()
        for i in mlp:
            model.model.layers[i].mlp.down_proj.weight.zero_()
    return SkippableModel(model, None, name="zeroed")


@pytest.mark.parametrize(
    "config",
    [
        DraftConfig(skip_attn=(0,)),
        DraftConfig(skip_attn=(0, 2), skip_mlp=(1,)),
        DraftConfig(skip_mlp=(0, 3)),
    ],
    ids=["attn0", "attn02-mlp1", "mlp03"],
)
def test_draft_steps_equal_a_model_whose_skipped_sublayers_output_zero(tiny_sm, config):
    # The skipped model must behave exactly like the full model with those sublayers zeroed,
    # over several draft steps, even when layer 0's cache stays short: positions come from
    # ``start``, not from any layer's cache length.
    tokens = [7, 9, 11, 13]
    cache, _ = _prefill(tiny_sm)
    got = _draft_steps(tiny_sm, cache, config, tokens, start=P)
    zeroed = _zeroed(tiny_sm, attn=config.skip_attn, mlp=config.skip_mlp)
    ref_cache, _ = _prefill(tiny_sm)  # full-model KV for the prompt, as the decoder has after prefill
    want = [zeroed.forward(torch.tensor([t]), start=P + j, cache=ref_cache, last_only=True)[-1]
            for j, t in enumerate(tokens)]
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=f"draft step {j}")
    # and the draft really differs from the full model (the swap did something)
    full_cache, _ = _prefill(tiny_sm)
    full = tiny_sm.forward(torch.tensor([tokens[0]]), start=P, cache=full_cache)[-1]
    assert not torch.allclose(full, got[0], atol=1e-4)


# -- crop and positions ----------------------------------------------------------------------------
def test_crop_cuts_layers_of_different_lengths_back_to_n(tiny_sm):
    sm = tiny_sm
    cache, _ = _prefill(sm)
    keys_before = [layer.keys.clone() for layer in cache.layers]
    _draft_steps(sm, cache, DraftConfig(skip_attn=(0, 2)), [7, 9, 11], start=P)
    assert sm.cache_lengths(cache) == (P, P + 3, P, P + 3)
    sm.crop(cache, P + 1)  # only the longer layers are cut; a crop never grows a layer
    assert sm.cache_lengths(cache) == (P, P + 1, P, P + 1)
    sm.crop(cache, P)
    assert sm.cache_lengths(cache) == (P,) * 4
    for layer, keys in zip(cache.layers, keys_before, strict=True):
        assert torch.equal(layer.keys, keys)  # the committed prefix is untouched
        assert layer.values.shape == layer.keys.shape
    sm.crop(cache, 2)
    assert sm.cache_lengths(cache) == (2,) * 4
    assert sm.cache_lengths(sm.new_cache()) == (0,) * 4
    sm.crop(sm.new_cache(), 3)  # an empty cache is fine


def test_no_skips_drafting_gives_identical_logits(tiny_sm):
    sm = tiny_sm
    ids = torch.tensor([*PROMPT, 1, 2, 3])
    full = sm.forward(ids, start=0, cache=sm.new_cache())
    with sm.drafting(DraftConfig()):
        drafted = sm.forward(ids, start=0, cache=sm.new_cache())
    assert torch.equal(full, drafted)
    cache, _ = _prefill(sm)
    step_full = sm.forward(torch.tensor([1]), start=P, cache=cache)
    sm.crop(cache, P)
    (step_draft,) = _draft_steps(sm, cache, DraftConfig(), [1], start=P)
    assert torch.equal(step_full[-1], step_draft)


def test_forward_after_crop_matches_a_fresh_full_forward(tiny_sm):
    sm = tiny_sm
    seq = [*PROMPT, 21, 22, 23, 24, 25, 26, 27]
    full = sm.forward(torch.tensor(seq), start=0, cache=sm.new_cache())  # [12, V]
    n = 8
    cache = sm.new_cache()
    sm.forward(torch.tensor(seq[:n]), start=0, cache=cache)
    # draft-only KV of uneven lengths (layer 0 short) and a rejected verify block, then crop
    _draft_steps(sm, cache, DraftConfig(skip_attn=(0, 3), skip_mlp=(1,)), [60, 61, 62], start=n)
    sm.crop(cache, n)
    sm.forward(torch.tensor([50, 51, 52]), start=n, cache=cache)
    sm.crop(cache, n)
    assert sm.cache_lengths(cache) == (n,) * 4
    got = sm.forward(torch.tensor(seq[n:]), start=n, cache=cache)
    torch.testing.assert_close(got, full[n:], atol=1e-5, rtol=1e-5)
    # one token at a time, with last_only
    sm.crop(cache, n)
    for i in range(n, len(seq)):
        step = sm.forward(torch.tensor([seq[i]]), start=i, cache=cache, last_only=True)
        assert step.shape == (1, full.shape[-1])
        torch.testing.assert_close(step[0], full[i], atol=1e-5, rtol=1e-5)


def test_positions_come_from_start(tiny_sm):
    # The same token at a different position gives different logits: `start` is honoured
    # even when it disagrees with the cache length.
    sm = tiny_sm
    cache, _ = _prefill(sm)
    a = sm.forward(torch.tensor([9]), start=P, cache=cache)
    sm.crop(cache, P)
    b = sm.forward(torch.tensor([9]), start=P + 7, cache=cache)
    assert not torch.allclose(a, b, atol=1e-4)


def test_hidden_states_returns_embeddings_plus_one_per_layer(tiny_sm):
    hs = tiny_sm.hidden_states(torch.tensor(PROMPT))
    assert len(hs) == tiny_sm.num_layers + 1
    assert all(h.shape == (P, 32) for h in hs)


# -- facts and loading -----------------------------------------------------------------------------
def test_eos_token_ids_without_tokenizer_or_generation_eos(tiny_sm):
    assert tiny_sm.tokenizer is None and tiny_sm.hf.generation_config.eos_token_id is None
    assert tiny_sm.eos_token_ids == ()
    assert tiny_sm.num_layers == 4 and tiny_sm.dtype == torch.float32 and tiny_sm.dtype_name == "float32"
    assert len(tiny_sm.fingerprint) == 16


def test_unsupported_architecture_raises_model_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=8, n_layer=1, n_head=2, n_positions=16))
    with pytest.raises(ModelError, match="gpt2") as info:
        SkippableModel(model, None, name="gpt2-tiny")
    assert "\n" not in str(info.value)


def test_unknown_model_raises_one_line_model_error():
    with pytest.raises(ModelError, match="no-such-model") as info:
        load_model("no-such-model")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", ["float64", "fp16", ""])
def test_unknown_dtype_raises_model_error(dtype):
    with pytest.raises(ModelError, match="dtype") as info:
        load_model("smollm2-135m", dtype=dtype)
    assert "\n" not in str(info.value)


def test_unknown_device_raises_model_error():
    with pytest.raises(ModelError, match="device") as info:
        load_model("smollm2-135m", device="tpu")
    assert "\n" not in str(info.value)


def test_local_directory_without_a_model_raises_model_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as info:
        load_model(str(tmp_path))
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)
