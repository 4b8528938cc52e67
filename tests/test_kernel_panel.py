"""The ``panel`` kernel (skipsearch/kernels/panel.py): inductor's graphs, with every forward over more than one row
run through a copy of the model whose linears are the fp32 panel product. It decodes exactly what HF greedy decodes
(plain steps, verifies of a block and a rest, a compiled precision draft, batches), compiles nothing while decoding,
and a machine that cannot build the product is refused in one line before any model loads."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
import transformers
from torch import nn

from skipsearch import methods
from skipsearch.config import NO_EXIT, ConfigError, DraftConfig
from skipsearch.engine.decoding import generate, hf_generate
from skipsearch.kernels import Kernel, check_kernel, parse_kernel
from skipsearch.kernels.inductor import static_cache_supported
from tests.conftest import graphs_made, make_tiny_model

PROMPTS = ([5, 9, 2], [7, 1, 1, 8, 3, 12, 40], [3] * 11 + [17, 4])


@pytest.fixture(scope="module")
def panel():
    if not static_cache_supported():
        pytest.skip(f"the compiled kernels need transformers 5's StaticCache layers, not {transformers.__version__}")
    try:
        check_kernel(Kernel("panel"), "cpu")
    except ConfigError as exc:  # no compiler here: the refusal is tested below
        pytest.skip(str(exc))
    sm = make_tiny_model(vocab_size=64, num_layers=4, seed=3)
    sm.use_kernel("panel-c4", capacity=64)
    return sm


def _precision(K: int, scheme: str = "int8"):
    m = methods.get("precision")
    cfg = DraftConfig(max_draft_tokens=K, exit=NO_EXIT)
    return m.candidate(cfg, m.parse({"scheme": scheme}, draft=cfg, num_layers=4))


def test_the_name_parses_with_its_own_default_block():
    assert parse_kernel("panel") == Kernel("panel", 8)
    assert parse_kernel("panel-c4").label == "panel-c4"
    with pytest.raises(ConfigError, match="kernel block must be one of"):
        parse_kernel("panel-c3")


def test_steps_and_blocks_run_the_panel_copy_and_the_model_itself_is_untouched(panel):
    from skipsearch.kernels.lowbit.modules import F32PanelLinear

    runner = panel._runner
    rows = runner._rows_module._orig_mod
    assert runner._step_module._orig_mod is rows  # one copy: no frozen weights, so every graph can be kept
    linears = [m for m in rows.modules() if isinstance(m, (nn.Linear, F32PanelLinear))]
    assert linears and all(isinstance(m, F32PanelLinear) for m in linears)  # the LM head too
    assert not any(isinstance(m, F32PanelLinear) for m in panel.hf.modules())  # the model itself is untouched
    # every other tensor is the model's own, not a copy
    assert rows.get_input_embeddings().weight is panel.hf.get_input_embeddings().weight
    assert rows.model.layers[0].input_layernorm.weight is panel.hf.model.layers[0].input_layernorm.weight


def test_plain_steps_verifies_and_a_compiled_precision_draft_are_hf_greedy(panel):

    drafter = methods.build_drafter(_precision(3), panel)
    generate(panel, PROMPTS[0], drafter=drafter, max_new_tokens=8)  # warm: the draft's graph compiles once
    before = graphs_made()
    for prompt in PROMPTS:
        ref = hf_generate(panel, prompt, max_new_tokens=24)
        assert generate(panel, prompt, max_new_tokens=24).token_ids == ref
        skip = DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=6, exit=NO_EXIT)
        assert generate(panel, prompt, config=skip, max_new_tokens=24).token_ids == ref  # 7 tokens: a block, a rest
        res = generate(panel, prompt, drafter=methods.build_drafter(_precision(3), panel), max_new_tokens=24)
        assert res.token_ids == ref and res.stats.drafted_tokens > 0
    assert graphs_made() == before  # nothing recompiled


def test_a_block_agrees_with_eager_forwards(panel):
    cache = panel.decode_cache(20)
    panel.forward(torch.tensor([4, 8, 15, 16]), start=0, cache=cache)
    fast = panel.forward(torch.tensor([23, 42, 7, 9, 11]), start=4, cache=cache)  # a block of 4, then one token
    panel.crop(cache, 4)
    with panel.eager():
        slow = panel.forward(torch.tensor([23, 42, 7, 9, 11]), start=4, cache=cache)
    assert torch.equal(fast.argmax(-1), slow.argmax(-1))
    assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)


def test_a_block_runs_as_many_rows_as_it_has_tokens_on_one_kept_call(panel):
    """A forward of 2 or 3 tokens on `panel-c4` runs 2 or 3 rows, not a block padded to 4: the block's call is
    compiled once for every width from 2 to 4 and kept in one file, each width's call is run with its own ids,
    nothing compiles for a width not run before, and each agrees with eager forwards."""
    runner = panel._runner
    cache = panel.decode_cache(30)
    panel.forward(torch.tensor([4, 8, 15, 16, 23]), start=0, cache=cache)
    before = graphs_made()
    for n in (3, 2, 4):
        ids = torch.tensor([42, 7, 9, 11][:n])
        fast = panel.forward(ids, start=5, cache=cache)
        panel.crop(cache, 5)
        with panel.eager():
            slow = panel.forward(ids, start=5, cache=cache)
        panel.crop(cache, 5)
        assert torch.equal(fast.argmax(-1), slow.argmax(-1))
        assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)
    assert graphs_made() == before  # the width-4 graph, built with the kernel, serves 2 and 3
    blocks = {key[1]: call for key, call in runner._calls.items()
              if key[0] is runner._rows_module and key[2] is runner.cache and key[3]}  # no mask: not a batch's
    assert {(1, 2), (1, 3), (1, 4)} <= set(blocks) and None not in blocks.values()
    assert all(blocks[(1, n)]._signature[0][0] == (1, n) for n in (2, 3, 4))  # each ran its own width
    assert len({call.path for call in blocks.values()}) == 1


def test_a_model_that_cannot_be_traced_for_a_range_of_widths_pads_its_blocks_as_before(monkeypatch):
    """Where the block's call cannot be precompiled for every width (dynamo refuses the model's code for a range of
    row counts), the kernel goes back to blocks of its own width, padded, through torch.compile: one block graph,
    not one per width, and the same tokens as HF greedy."""
    from torch._dynamo.utils import counters

    from skipsearch.kernels import precompiled

    real = precompiled.Call.of.__func__

    def refusing(cls, *args, rows=None, **kwargs):
        return None if rows is not None else real(cls, *args, rows=rows, **kwargs)

    monkeypatch.setattr(precompiled.Call, "of", classmethod(refusing))
    sm = make_tiny_model(vocab_size=64, num_layers=4, seed=3)
    sm.use_kernel("panel-c4", capacity=64)
    runner = sm._runner
    assert runner._widths is None  # the block's first call (its build) was refused
    before = counters["stats"]["unique_graphs"]
    skip = DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=2, exit=NO_EXIT)  # verifies of 3 tokens
    for prompt in PROMPTS:
        assert generate(sm, prompt, config=skip, max_new_tokens=16).token_ids == hf_generate(sm, prompt,
                                                                                              max_new_tokens=16)
    assert counters["stats"]["unique_graphs"] == before  # the padded block's graph, built with the kernel


def _ran(module, run) -> bool:
    """Whether ``run()`` called ``module``'s forward."""
    seen = []
    handle = module.register_forward_hook(lambda *args: seen.append(True))
    try:
        run()
    finally:
        handle.remove()
    return bool(seen)


def test_a_prompt_runs_eagerly_on_the_kernels_copy_and_agrees_with_the_model(panel, monkeypatch):
    from skipsearch.model import skippable

    copy = panel._runner.prompt_model
    assert copy is panel._runner._rows_module._orig_mod  # the panel copy: its products and its attention
    prompt = torch.tensor([4, 8, 15, 16, 23, 42, 7])
    cache = panel.decode_cache(20)
    before = graphs_made()
    assert _ran(copy.model.embed_tokens, lambda: panel.forward(prompt, start=0, cache=cache))
    assert graphs_made() == before  # eagerly: nothing compiled
    fast = panel.forward(torch.tensor([9]), start=7, cache=cache)  # the next step reads the prompt's keys
    with panel.eager():  # the model itself, on the same cache
        panel.crop(cache, 0)
        ran_model = _ran(panel.hf.model.embed_tokens, lambda: panel.forward(prompt, start=0, cache=cache))
        slow = panel.forward(torch.tensor([9]), start=7, cache=cache)
    assert ran_model and torch.equal(fast.argmax(-1), slow.argmax(-1))
    assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)
    # a prompt longer than PROMPT_ROWS runs on the model itself
    monkeypatch.setattr(skippable, "PROMPT_ROWS", 6)
    cache = panel.decode_cache(20)
    assert not _ran(copy.model.embed_tokens, lambda: panel.forward(prompt, start=0, cache=cache))


def test_forward_hidden_on_the_kernels_cache_reads_the_models_own_layers(panel):
    # its hooks are on the model's own modules, which neither the kernel's graphs nor its copy run: it runs eagerly
    cache = panel.decode_cache(20)
    panel.forward(torch.tensor([4, 8, 15, 16]), start=0, cache=cache)
    logits, hidden = panel.forward_hidden(torch.tensor([23, 42, 7]), start=4, cache=cache)
    assert hidden.shape == (panel.num_layers + 1, 3, panel.hf.config.hidden_size)
    panel.crop(cache, 4)
    with panel.eager():
        again = panel.forward(torch.tensor([23, 42, 7]), start=4, cache=cache)
    assert torch.equal(logits, again)


def test_a_compiled_draft_step_runs_on_packed_attention_and_agrees_with_the_eager_draft(panel, monkeypatch):
    import contextlib

    from skipsearch.kernels.panel import ATTENTION, packed_attention
    from skipsearch.methods.precision.copy import quantized_copy

    q, every = quantized_copy(panel, "int8"), range(panel.num_layers)
    runner, entered = panel._runner, []
    real = runner._draft_context

    @contextlib.contextmanager
    def recorded():
        with real():
            entered.append({layer.self_attn.config._attn_implementation for layer in panel.layers})
            yield

    monkeypatch.setattr(runner, "_draft_context", recorded)
    cache = panel.decode_cache(20)
    panel.forward(torch.tensor([4, 8, 15, 16, 23]), start=0, cache=cache)
    with panel.substituted(**q.stand_ins(every, every)):
        with packed_attention(panel):  # each stand-in has a config of its own: every one is switched, then put back
            inside = {layer.self_attn.config._attn_implementation for layer in panel.layers}
        after = {layer.self_attn.config._attn_implementation for layer in panel.layers}
        with panel.compiled_draft():
            fast = panel.forward(torch.tensor([42]), start=5, cache=cache, last_only=True)
        panel.crop(cache, 5)
        slow = panel.forward(torch.tensor([42]), start=5, cache=cache, last_only=True)  # a partial model: eager
    assert inside == {ATTENTION} and after == {"sdpa"} and panel.hf.config._attn_implementation == "sdpa"
    assert entered == [{ATTENTION}]  # the draft step ran its graph on packed attention
    assert torch.equal(fast.argmax(-1), slow.argmax(-1))
    # within 4e-7 here; a draft step that ran another graph (the full model's: its logits 4e-3 off) fails this
    assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)


def test_steps_blocks_and_drafts_attend_through_the_gqa_attention_op(panel):
    from torch.profiler import profile

    from skipsearch.methods.precision.copy import quantized_copy

    q, every = quantized_copy(panel, "int8"), range(panel.num_layers)
    cache = panel.decode_cache(20)
    panel.forward(torch.tensor([4, 8, 15, 16, 23]), start=0, cache=cache)
    ran = {}
    for name, ids in (("step", [42]), ("block", [42, 7, 9, 11]), ("draft", [42])):  # a block of panel-c4
        with contextlib.ExitStack() as stack:
            if name == "draft":
                stack.enter_context(panel.substituted(**q.stand_ins(every, every)))
                stack.enter_context(panel.compiled_draft())
            panel.forward(torch.tensor(ids), start=5, cache=cache)  # compiles what is new
            panel.crop(cache, 5)
            with profile() as prof:
                panel.forward(torch.tensor(ids), start=5, cache=cache)
            panel.crop(cache, 5)
        ran[name] = {event.name for event in prof.events()}
    assert all("skipsearch::gqa_attention" in names for names in ran.values())
    assert not any("scaled_dot_product" in n for names in ran.values() for n in names)
    from skipsearch.kernels.lowbit import int8_activations  # the int8 products the CPU takes (tests/test_dq.py)

    int8_op = "skipsearch::int8_dq_linear" if int8_activations() else "skipsearch::int8_wo_linear"
    assert "skipsearch::f32_panel_linear" in ran["block"] and int8_op in ran["draft"]


def test_a_warmed_drafter_has_compiled_its_graph_before_it_decodes(panel):

    m = methods.get("precision")
    cfg = DraftConfig(max_draft_tokens=3, exit=NO_EXIT)
    # a stand-in set no other test here drafts with (layer 0's attention at full precision): a graph of its own
    drafter = methods.build_drafter(m.candidate(cfg, m.parse({"scheme": "int8", "full_attn": [0]}, draft=cfg,
                                                               num_layers=4)), panel)
    before = graphs_made()
    drafter.warm(panel)
    warmed = graphs_made()
    res = generate(panel, PROMPTS[1], drafter=drafter, max_new_tokens=12)
    assert warmed == before + 1  # the draft's graph, compiled by warm()
    assert graphs_made() == warmed and res.stats.drafted_tokens > 0  # none while decoding
    assert res.token_ids == hf_generate(panel, PROMPTS[1], max_new_tokens=12)


def test_decode_in_batches_compiles_a_batch_of_ones_draft_before_the_first_batch(panel, monkeypatch):
    """``decode --batch-size 2`` over three prompts ends with a batch of one, which decodes as one sequence does,
    through its compiled draft where the schedule drafts at B = 1: that draft compiles with the batch graphs, before
    the first batch, not inside the last batch's time."""
    from types import SimpleNamespace

    from skipsearch import api
    from skipsearch.api import decode as api_decode
    from skipsearch.data import Prompt
    from skipsearch.engine.batched import generate_batch
    from skipsearch.files.schedule import BatchRange, Schedule
    from skipsearch.profile import ModelRef, Profile

    m = methods.get("precision")
    cfg = DraftConfig(max_draft_tokens=2, exit=NO_EXIT)
    # stand-ins no other test here drafts with (layer 1's attention at full precision): a graph of their own
    candidate = m.candidate(cfg, m.parse({"scheme": "int8", "full_attn": [1]}, draft=cfg, num_layers=4))
    prof = Profile(model=ModelRef("tiny", 4), method="precision", draft=cfg, method_params=candidate.params,
                   schedule=Schedule((BatchRange(1, 1, 2), BatchRange(2, 8, 0)), (0, 2)))
    monkeypatch.setattr(api_decode, "encode_prompt", lambda tokenizer, prompt: [int(t) for t in prompt.text.split()])
    monkeypatch.setattr(panel, "tokenizer", SimpleNamespace(eos_token_id=None, decode=lambda ids, **kw: ""))
    prompts = [Prompt(str(i), " ".join(map(str, ids)), False, "", "--prompt") for i, ids in enumerate(PROMPTS)]
    batches = api.decode_batches(panel, prompts, profile=prof, batch_size=2, max_new_tokens=8)
    ready = graphs_made()
    done = list(batches)
    assert graphs_made() == ready  # nothing compiled inside a batch's time
    assert [len(b.prompts) for b in done] == [2, 1]
    last = done[1].result
    assert last.stats.k == 2 and last.stats.drafted_tokens > 0  # the batch of one drafted, compiled
    assert last.token_ids[0] == generate_batch(panel, [PROMPTS[2]], max_new_tokens=8).token_ids[0]


def _draft_calls(panel, cache):
    from skipsearch.methods.precision.copy import quantized_copy

    every = range(panel.num_layers)

    def draft(scheme: str):
        q = quantized_copy(panel, scheme)
        with panel.substituted(**q.stand_ins(every, every)), panel.draft_head(q.head), panel.compiled_draft():
            return panel.forward(torch.tensor([42]), start=5, cache=cache, last_only=True)

    return draft, {"int8": lambda: draft("int8"), "int4": lambda: draft("int4"),
                   "step": lambda: panel.forward(torch.tensor([42]), start=5, cache=cache),
                   "block": lambda: panel.forward(torch.tensor([42, 7, 9, 11]), start=5, cache=cache)}


def _eager_int8_draft(panel, cache):
    from skipsearch.methods.precision.copy import quantized_copy

    every = range(panel.num_layers)
    panel.crop(cache, 5)
    with panel.eager():
        q = quantized_copy(panel, "int8")
        with panel.substituted(**q.stand_ins(every, every)), panel.draft_head(q.head):
            return panel.forward(torch.tensor([42]), start=5, cache=cache, last_only=True)


def test_each_precompiled_call_runs_its_own_graph(panel, monkeypatch):
    """The kernel runs its calls precompiled (kernels/precompiled.py), one call per module, shape, cache and
    stand-ins: two drafts of different stand-ins, a step and a block, interleaved, give what each gave the first
    time. The same stand-ins on another attention are a call of their own, and agree with eager."""
    import contextlib

    from skipsearch.kernels import precompiled

    runner = panel._runner
    cache = panel.decode_cache(30)
    panel.forward(torch.tensor([4, 8, 15, 16, 23]), start=0, cache=cache)
    draft, calls = _draft_calls(panel, cache)
    first = {name: call() for name, call in calls.items()}
    for name in ("step", "int4", "block", "int8", "step", "int8", "int4", "block"):
        assert torch.equal(calls[name](), first[name]), name
    assert runner._calls and None not in runner._calls.values()  # every one ran precompiled
    # what each file keeps to check on its first run: guards on the inputs and the cache, none on the model or what it
    # holds (its file's name tells models apart: test_graph_cache)
    from torch._dynamo.aot_compile import AOTCompileUnpickler
    from torch._dynamo.package import load_guards_state

    for path in {call.path for call in runner._calls.values()}:
        state = load_guards_state(AOTCompileUnpickler({}, io.BytesIO(path.read_bytes())).load()["guards_state"])
        names = {guard.name for guard in state.output_graph.guards}
        assert any(n.startswith("L['cache']") for n in names) and not any(n.startswith("L['model']") for n in names)
    before = precompiled.COUNTS["built"] + precompiled.COUNTS["loaded"]
    monkeypatch.setattr(runner, "_draft_context", contextlib.nullcontext)  # the same stand-ins on HF's attention
    hf_attention = draft("int8")
    assert precompiled.COUNTS["built"] + precompiled.COUNTS["loaded"] == before + 1  # its own call
    assert torch.allclose(hf_attention, _eager_int8_draft(panel, cache), atol=1e-4, rtol=1e-4)


def test_a_call_seen_before_skips_dynamos_guards_and_still_runs_its_own_graph(panel, monkeypatch):
    """Where a call runs through torch.compile (a kernel that does not precompile, a call dynamo cannot capture
    whole): after its graph has run once without compiling, the same call (module, shapes, cache, the model's
    stand-ins and attention) skips dynamo's guard checks; every call still runs its own graph: two drafts of
    different stand-ins, a step and a block, interleaved, give what each gave with every guard checked. A draft
    never run before (other stand-ins, or the same ones on another attention) is checked in full and compiles."""
    import contextlib

    from torch._dynamo.utils import counters

    skipped = []
    real = torch.compiler.set_stance

    def recorded(*args, **kwargs):
        skipped.append(kwargs.get("skip_guard_eval_unsafe", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.compiler, "set_stance", recorded)
    runner = panel._runner
    monkeypatch.setattr(runner, "_models", None)  # nothing precompiled: every call through torch.compile
    cache = panel.decode_cache(30)
    panel.forward(torch.tensor([4, 8, 15, 16, 23]), start=0, cache=cache)
    draft, calls = _draft_calls(panel, cache)
    checked = {name: call() for name, call in calls.items()}  # compiles what is new, every guard checked
    for call in calls.values():
        call()  # runs each graph again: from here on each of these calls skips the guards
    skipped.clear()
    for name in ("step", "int4", "block", "int8", "step", "int8", "int4", "block"):
        assert torch.equal(calls[name](), checked[name]), name
    assert skipped and all(skipped)

    before = counters["stats"]["unique_graphs"]
    skipped.clear()
    monkeypatch.setattr(runner, "_draft_context", contextlib.nullcontext)  # the same stand-ins on HF's attention
    hf_attention = draft("int8")
    assert counters["stats"]["unique_graphs"] == before + 1 and skipped == []  # checked in full: its own graph
    assert torch.allclose(hf_attention, _eager_int8_draft(panel, cache), atol=1e-4, rtol=1e-4)


def test_the_kernels_own_calls_replay_their_graph_without_dynamos_bytecode(panel, monkeypatch):
    """After two recorded runs, the kernel's calls (its copy's steps, blocks and batches, and each compiled draft's
    step, keyed by its stand-ins) call their graph directly (``precompiled._Replay``): with dynamo's bytecode made
    to fail, plain decoding, a layer-skip draft's verifies, two precision drafts of other schemes (each on its own
    stand-ins) and batches still decode what HF greedy and eager batches do."""
    from skipsearch.engine.batched import decode_rows, generate_batch

    skip = DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=6, exit=NO_EXIT)
    batch = list(PROMPTS)
    cache = panel.decode_cache(30)
    panel.forward(torch.tensor([4, 8, 15, 16, 23]), start=0, cache=cache)
    for _ in range(3):  # each call three times: checked, then recorded twice
        panel.forward(torch.tensor([42]), start=5, cache=cache)
        for n in (2, 3, 4):  # a block of each width: one graph, passed its width (a number) too
            panel.forward(torch.tensor([42, 7, 9, 11][:n]), start=5, cache=cache)
        generate_batch(panel, batch, max_new_tokens=12)
    drafters = {scheme: methods.build_drafter(_precision(3, scheme), panel) for scheme in ("int8", "int4")}
    for drafter in drafters.values():
        generate(panel, PROMPTS[0], drafter=drafter, max_new_tokens=12)  # a draft step a token: > 3 runs each
    runner = panel._runner
    own = {key: call for key, call in runner._calls.items() if key[0] is not runner._module}
    drafts = [call for key, call in runner._calls.items() if key[0] is runner._module]
    assert own and sum(call._replay._run is not None for call in drafts) >= 2  # this test's two, at least
    assert not any(call._replay._off for call in drafts)
    replaying = {tuple(key[1]) for key, call in own.items() if call._replay._run is not None}
    assert replaying >= {(1, 1), (1, 2), (1, 3), (1, 4), (len(batch), 1)}, replaying  # a batch's block: its build
    assert not any(call._replay._off for call in own.values())

    def bytecode(*args, **kwargs):
        raise AssertionError("dynamo's bytecode ran")

    for call in runner._calls.values():
        monkeypatch.setattr(call, "_fn", bytecode)
    for prompt in PROMPTS:
        ref = hf_generate(panel, prompt, max_new_tokens=24)
        assert generate(panel, prompt, max_new_tokens=24).token_ids == ref
        assert generate(panel, prompt, config=skip, max_new_tokens=24).token_ids == ref  # 7 tokens: a block, a rest
        for drafter in drafters.values():  # interleaved: each draft's replay reads its own stand-ins
            res = generate(panel, prompt, drafter=drafter, max_new_tokens=24)
            assert res.token_ids == ref and res.stats.drafted_tokens > 0
    twin = make_tiny_model(vocab_size=64, num_layers=4, seed=3)  # the same weights, eager
    assert generate_batch(panel, batch, max_new_tokens=12).token_ids == decode_rows(twin, batch,
                                                                                     max_new_tokens=12).token_ids


def test_batches_decode_what_eager_batches_do(panel):
    from skipsearch.engine.batched import decode_rows, generate_batch

    twin = make_tiny_model(vocab_size=64, num_layers=4, seed=3)  # the same weights, eager
    batch = list(PROMPTS)
    ref = decode_rows(twin, batch, max_new_tokens=12).token_ids
    assert generate_batch(panel, batch, max_new_tokens=12).token_ids == ref


def test_a_machine_that_cannot_build_the_product_is_refused_in_one_line(monkeypatch):
    from skipsearch.kernels import inductor
    from skipsearch.kernels.lowbit import build

    monkeypatch.setattr(inductor, "cxx_compiler", lambda: "g++")
    monkeypatch.setattr(inductor, "static_cache_supported", lambda: True)
    monkeypatch.setattr(build, "_STATE", {"error": "the int8/int4 weight-only CPU kernels cannot be built here: "
                                                   "no C++ compiler"})
    with pytest.raises(ConfigError, match="kernel panel-c8 runs skipsearch's own C.. products, which cannot be built "
                                          "here: no C.. compiler; use --kernel eager") as e:
        check_kernel(parse_kernel("panel"), "cpu")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="CPUs only"):
        check_kernel(parse_kernel("panel"), "cuda")
