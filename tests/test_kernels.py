"""Kernels (skipsearch/kernels/, SkippableModel.use_kernel): a compiled verify and compiled drafts decode
exactly what HF greedy decodes, compile once and never again while decoding, and a kernel the machine cannot
run is refused in one line before any model loads. Every registered kernel parses its own names and no other's.

One compiled tiny model is shared by the module (inductor compiles for tens of seconds even at this size). The
inductor kernel is built here without max-autotune, which decides only which products a graph calls;
tests/test_export.py builds it with its own settings."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from skipsearch import kernels, methods
from skipsearch.config import NO_EXIT, ConfigError, DraftConfig
from skipsearch.engine.decoding import generate, hf_generate
from skipsearch.kernels import EAGER, Kernel, check_kernel, parse_kernel
from skipsearch.kernels.inductor import static_cache_supported
from tests.conftest import graphs_made, make_tiny_model

PROMPTS = ([5, 9, 2], [7, 1, 1, 8, 3, 12, 40], [3] * 11 + [17, 4])  # three lengths: one graph serves all


@pytest.fixture(scope="module")
def compiled():
    if not static_cache_supported():  # transformers 4.x: the kernel is refused (test_an_old_transformers_...)
        pytest.skip(f"the compiled kernel needs transformers 5's StaticCache layers, not {transformers.__version__}")
    from skipsearch.kernels import inductor

    sm = make_tiny_model(vocab_size=64, num_layers=4, seed=3)
    # without max-autotune, which times C++ product candidates for every new shape (about half of this module's time
    # on 2 cores) and only picks which products the graphs call: what these tests assert does not depend on it. A
    # runner keeps the settings it was built with, later graphs included. The kernel's own settings are built and
    # checked by test_export's inductor-c4 profile inside generate, and the HF compiled peer's by its own test here
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(inductor._SETTINGS, "max_autotune", False)
        sm.use_kernel("inductor", capacity=64)
    assert sm._runner._settings["max_autotune"] is False
    return sm


def _precision(K: int, scheme: str = "fp16"):
    m = methods.get("precision")
    cfg = DraftConfig(max_draft_tokens=K, exit=NO_EXIT)
    return m.candidate(cfg, m.parse({"scheme": scheme}, draft=cfg, num_layers=4))


def test_kernel_names_parse_and_bad_ones_are_one_line():
    assert parse_kernel("eager") == EAGER and parse_kernel(None) == EAGER
    assert parse_kernel("inductor") == Kernel("inductor", 4)
    assert parse_kernel("inductor-c8").label == "inductor-c8"
    for bad, fragment in (("cuda-graphs", "unknown kernel"), ("inductor-c3", "block must be one of"),
                          ("eager-c4", "takes no block"), ("x" * 500, "unknown kernel")):
        with pytest.raises(ConfigError, match=fragment) as info:
            parse_kernel(bad)
        assert "\n" not in str(info.value) and len(str(info.value)) < 200


# -- the shared suite: every registered kernel -------------------------------------------------------------------
def _names_of(spec: kernels.KernelSpec) -> list[str]:
    return [spec.name, *(f"{spec.name}-c{b}" for b in spec.blocks)]


@pytest.mark.parametrize("name", kernels.names())
def test_every_kernel_parses_its_own_names_and_refuses_the_others(name):
    spec = kernels.REGISTRY[name]
    for text in _names_of(spec):
        kernel = spec.parse(text)
        assert kernel is not None and kernel.spec is spec and kernel.compiled == spec.compiled
        assert parse_kernel(text) == kernel and parse_kernel(kernel.label) == kernel  # the label reads back
        assert kernel.label == (text if text != name or not spec.blocks else f"{name}-c{spec.default_block}")
    assert spec.parse(name).chunk == spec.default_block
    others = [text for other in kernels.REGISTRY.values() if other is not spec for text in _names_of(other)]
    assert others and all(spec.parse(text) is None for text in others)
    cannot = next(b for b in range(1, 1000) if b not in spec.blocks)
    for bad in (f"{name}-c{cannot}", f"{name}-c"):  # a block it cannot take, a block left out
        with pytest.raises(ConfigError) as info:
            parse_kernel(bad)
        assert "\n" not in str(info.value) and len(str(info.value)) < 200
    assert name in str(pytest.raises(ConfigError, parse_kernel, "nonesuch").value)  # the message lists it


@pytest.mark.parametrize("name", kernels.names())
def test_every_kernel_checks_a_device_in_one_line_or_not_at_all(name):
    kernel = parse_kernel(name)
    for device in ("cpu", "cuda", "cuda:1", "auto", "mps"):
        try:
            check_kernel(kernel, device, instead="--kernel eager")
        except ConfigError as e:
            assert "\n" not in str(e) and "--kernel eager" in str(e)  # says how to ask for eager instead
    if not kernel.compiled:
        assert kernel.spec.build(None, kernel, 64) is None  # nothing built: the adapter's own eager forwards


def test_the_kernel_package_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, skipsearch.kernels as k; k.parse_kernel('inductor-c8'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_kernel_the_device_cannot_run_is_refused(monkeypatch):
    check_kernel(EAGER, "cuda")  # eager runs anywhere
    with pytest.raises(ConfigError, match="CPUs only"):
        check_kernel(Kernel("inductor"), "cuda:0")
    with pytest.raises(ConfigError, match="CPUs only"):
        check_kernel(Kernel("inductor"), "auto")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ConfigError, match="no C.. compiler"):
        check_kernel(Kernel("inductor"), "cpu")


def test_an_old_transformers_refuses_the_kernel_in_one_line(monkeypatch):
    from skipsearch.kernels import inductor

    monkeypatch.setattr(inductor, "static_cache_supported", lambda: False)
    with pytest.raises(ConfigError, match="needs a transformers whose StaticCache layers keep their own length") as e:
        check_kernel(Kernel("inductor"), "cpu")
    assert "\n" not in str(e.value) and "use --kernel eager" in str(e.value)


def test_compiled_verify_and_plain_steps_are_hf_greedy(compiled):
    assert compiled.kernel.label == "inductor-c4"
    for prompt in PROMPTS:
        ref = hf_generate(compiled, prompt, max_new_tokens=24)
        assert generate(compiled, prompt, max_new_tokens=24).token_ids == ref
        skip = DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=6, exit=NO_EXIT)
        # an eager draft, a 7-token verify
        assert generate(compiled, prompt, config=skip, max_new_tokens=24).token_ids == ref


def test_a_compiled_precision_draft_is_hf_greedy(compiled):
    for prompt in PROMPTS:
        ref = hf_generate(compiled, prompt, max_new_tokens=24)
        for K in (3, 5):
            drafter = methods.build_drafter(_precision(K), compiled)
            res = generate(compiled, prompt, drafter=drafter, max_new_tokens=24)
            assert res.token_ids == ref
            assert res.stats.drafted_tokens > 0


def test_nothing_recompiles_while_decoding_prompts_of_mixed_lengths(compiled):

    drafter = methods.build_drafter(_precision(3), compiled)
    generate(compiled, PROMPTS[0], drafter=drafter, max_new_tokens=8)  # warm: the draft's graph compiles once
    before = graphs_made()
    for prompt in (*PROMPTS, [9] * 20, [1, 2]):
        for d in (None, methods.build_drafter(_precision(3), compiled)):
            generate(compiled, prompt, drafter=d, max_new_tokens=17)
    assert graphs_made() == before
    assert compiled.kernel_report.graphs >= 2  # the verify block, and the draft (counted since the kernel was built)


def test_the_compiled_cache_refuses_a_sequence_it_cannot_hold(compiled):
    with pytest.raises(ConfigError, match="do not fit kernel inductor-c4"):
        generate(compiled, [1] * 40, max_new_tokens=40)


def test_eager_forwards_on_the_compiled_cache_match_the_compiled_ones(compiled):
    cache = compiled.decode_cache(20)
    compiled.forward(torch.tensor([4, 8, 15, 16]), start=0, cache=cache)
    fast = compiled.forward(torch.tensor([23, 42, 7]), start=4, cache=cache)  # compiled blocks
    assert compiled.cache_lengths(cache) == (7,) * 4
    compiled.crop(cache, 4)
    with compiled.eager():
        slow = compiled.forward(torch.tensor([23, 42, 7]), start=4, cache=cache)
    assert torch.equal(fast.argmax(-1), slow.argmax(-1))
    assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)


def test_one_token_and_a_block_plus_one_run_the_one_token_graph_unpadded(compiled):

    runner = compiled._runner
    seen: list[int] = []
    real = runner._logits

    def spy(ids, positions):
        seen.append(ids.shape[1])
        return real(ids, positions)

    cache = compiled.decode_cache(20)
    compiled.forward(torch.tensor([4, 8, 15, 16]), start=0, cache=cache)  # the prompt: eager
    before = graphs_made()
    runner._logits = spy
    try:
        one = compiled.forward(torch.tensor([23]), start=4, cache=cache)  # a plain step
        five = compiled.forward(torch.tensor([42, 7, 9, 11, 13]), start=5, cache=cache)  # a block, then one token
    finally:
        del runner._logits
    assert seen == [1, 4, 1]  # no padded block for a lone token
    assert graphs_made() == before  # both graphs were compiled when the kernel was built
    assert compiled.cache_lengths(cache) == (10,) * 4
    compiled.crop(cache, 4)
    with compiled.eager():
        slow = compiled.forward(torch.tensor([23, 42, 7, 9, 11, 13]), start=4, cache=cache)
    fast = torch.cat([one, five])
    assert torch.equal(fast.argmax(-1), slow.argmax(-1))
    assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)


# -- batches on the compiled kernel: one graph per batch size and block width --------------------------------------
ROWS = (*PROMPTS, [1, 2, 3, 1, 2, 3, 1, 2])  # four lengths; the last repeats itself (the lookup accepts there)


def _lookup(K: int):
    m = methods.get("ngram")
    cfg = DraftConfig(max_draft_tokens=K, exit=NO_EXIT)
    return m.candidate(cfg, m.parse({"min_n": 1, "max_n": 3}, draft=cfg, num_layers=4))


def test_batches_run_compiled_graphs_per_batch_size_and_decode_what_eager_batches_do(compiled):
    """B = 2 and 3 on the compiled kernel: each row decodes what the eager batched engine decodes (the same weights),
    with plain steps, lookup drafts of k 1, 3 and 6 (a 7-token verify: a block and a rest) and a precision draft (its
    steps eager on the batch's cache). Each batch size compiles its two graphs once, on its first batch; then no
    prompt length, draft length or acceptance compiles anything, and the full model's forwards run compiled."""

    from skipsearch.engine.batched import decode_rows, generate_batch

    twin = make_tiny_model(vocab_size=64, num_layers=4, seed=3)  # the same weights, eager
    runner = compiled._runner
    for B in (2, 3):  # compile each batch size's graphs first
        compiled.batch_cache(B, 40)
    before = graphs_made()
    calls: list[tuple[int, int]] = []
    real = runner.forward_rows

    def spy(ids, positions, cache):
        calls.append(tuple(ids.shape))
        return real(ids, positions, cache)

    runner.forward_rows = spy
    try:
        for B, start in ((2, 0), (2, 2), (3, 1), (3, 0)):
            batch = ROWS[start:start + B]
            ref = decode_rows(twin, batch, max_new_tokens=16).token_ids
            assert generate_batch(compiled, batch, max_new_tokens=16).token_ids == ref, (B, start)
            for k in (1, 3, 6):
                res = generate_batch(compiled, batch, drafter=methods.batch_drafter(_lookup(k), compiled), k=k,
                                     max_new_tokens=16)
                assert res.token_ids == ref, (B, start, k)
            res = generate_batch(compiled, batch, drafter=methods.batch_drafter(_precision(3), compiled), k=3,
                                 max_new_tokens=16)
            assert res.token_ids == ref and res.stats.drafted_tokens > 0, (B, start, "precision")
    finally:
        del runner.forward_rows
    assert graphs_made() == before  # nothing recompiled
    assert {b for b, _ in calls} == {2, 3} and {t for _, t in calls} >= {1, 4, 7}  # plain steps and verifies ran


def test_the_compiled_batch_cache_refuses_a_batch_it_cannot_hold_in_one_line(compiled):
    from skipsearch.engine.batched import generate_batch

    with pytest.raises(ConfigError, match="do not fit kernel inductor-c4's batched cache") as info:
        generate_batch(compiled, [[1] * 40, [2] * 30], max_new_tokens=40)
    assert "\n" not in str(info.value)


def test_a_new_batch_sizes_compiled_graphs_count_in_the_memory_check(compiled, monkeypatch):
    """A batch size not yet compiled is charged what the kernel's last compile took (its graphs freeze their own
    weights); one already compiled, a batch of one (the one-sequence graphs) and the eager kernel are not."""
    from skipsearch.engine import batched
    from skipsearch.engine.batched import BatchRefused, batch_bytes, check_fits

    runner = compiled._runner
    compiled.batch_cache(2, 40)
    assert isinstance(runner.graph_bytes, int) and runner.graph_bytes >= 0  # measured around the last compile
    monkeypatch.setattr(runner, "graph_bytes", 300 * 2**20)
    assert compiled.graph_bytes(2) == 0 and compiled.graph_bytes(1) == 0 and compiled.graph_bytes(5) == 300 * 2**20
    assert make_tiny_model(vocab_size=64, num_layers=4, seed=3).graph_bytes(5) == 0  # eager: no graphs
    kv = batch_bytes(compiled, batch_size=5, prompt_tokens=12, max_new_tokens=16, k=3)
    monkeypatch.setattr(batched, "available_memory", lambda device: kv + 300 * 2**20 - 1)
    with pytest.raises(BatchRefused, match="compiled graphs \\(300 MiB") as info:
        check_fits(compiled, batch_size=5, prompt_tokens=12, max_new_tokens=16, k=3)
    assert "\n" not in str(info.value) and "a batch size of" in str(info.value)
    check_fits(compiled, batch_size=2, prompt_tokens=12, max_new_tokens=16, k=3)  # its graphs are there already
    monkeypatch.setattr(batched, "available_memory", lambda device: kv + 300 * 2**20)
    check_fits(compiled, batch_size=5, prompt_tokens=12, max_new_tokens=16, k=3)  # exactly enough


def test_the_batched_cost_grid_times_each_batch_size_as_decode_runs_it_on_the_kernel(compiled):
    """On the compiled kernel the grid names it, a batch of one runs the one-sequence graphs and a larger batch its
    batch size's graphs (compiled before the timing), and the timing compiles nothing."""

    from skipsearch.engine.measuring import measure_batched

    runner = compiled._runner
    compiled.batch_cache(2, 40)
    before = graphs_made()
    seen: list[tuple[str, tuple[int, ...]]] = []
    one, rows = runner.forward, runner.forward_rows

    def spy_one(ids, start):
        seen.append(("one", tuple(ids.shape)))
        return one(ids, start)

    def spy_rows(ids, positions, cache):
        seen.append(("rows", tuple(ids.shape)))
        return rows(ids, positions, cache)

    runner.forward, runner.forward_rows = spy_one, spy_rows
    try:
        grid = measure_batched(compiled, list(range(3, 19)), (1, 2), repeats=1, tokens=(1, 2, 5))
    finally:
        del runner.forward, runner.forward_rows
    # 4 and 5 tokens: the edges of the kernel's 4-token blocks, timed as the one-sequence curve times them
    assert grid.kernel == "inductor-c4" and grid.batch_sizes == (1, 2) and grid.tokens == (1, 2, 4, 5)
    assert all(v > 0 for r in grid.rows for v in r.verify_seconds)
    assert {("one", (t,)) for t in (1, 2, 4, 5)} <= set(seen)
    assert {("rows", (2, t)) for t in (1, 2, 4, 5)} <= set(seen)
    assert graphs_made() == before


def test_a_cost_file_names_its_kernel_and_prices_drafts_against_the_compiled_step(compiled, tmp_path):
    from skipsearch import methods as registry
    from skipsearch.engine.measuring import measure_cost_profile
    from skipsearch.files.cost_profile import load_costs, save_costs

    context = tuple(range(3, 23))
    cp = measure_cost_profile(compiled, context, repeats=3, verify_sizes=(1, 2, 4, 5))
    schemes = tuple(m.kept() for m in registry.measure_scheme_costs(compiled, context, ("fp16",), repeats=3))
    cp = dataclasses.replace(cp, costs=dataclasses.replace(cp.costs, schemes=schemes))
    back = load_costs(save_costs(cp, tmp_path / "c.yaml"))
    assert back.kernel.verify == "inductor-c4" and back.kernel.drafts == "compiled"
    assert back.kernel.compile_seconds is not None and back.kernel.compile_seconds > 0
    from skipsearch.kernels.lowbit import check_lowbit, int8_activations  # what the int8/int4 drafts multiply by

    try:
        check_lowbit()
        want = "int8 activations" if int8_activations() else "fp32 activations"
    except ConfigError:
        want = None
    assert back.kernel.draft_activations == want
    c = back.costs
    assert c.eager_step_seconds is not None and c.eager_step_seconds > 0  # the parts' step, beside the unit
    assert c.scheme("fp16").whole_seconds is not None  # the compiled whole-model draft, timed as decode runs it
    # the parts split the eager step (whatever the load did to the timings, the file checks this on load)
    assert abs(compiled.num_layers * (c.attn_seconds + c.mlp_seconds) + c.fixed_seconds - c.eager_step_seconds) \
        <= c.eager_step_seconds
    # a full-model draft (nothing skipped, run eagerly) costs the eager step over the compiled unit
    assert back.cost_model().draft_ratio(DraftConfig()) == pytest.approx(
        (c.fixed_seconds + compiled.num_layers * (c.attn_seconds + c.mlp_seconds)) / c.step_seconds)
    assert "kernel: verify inductor-c4, drafts compiled" in back.describe()


def test_the_verify_curve_is_timed_at_each_blocks_edges(compiled, monkeypatch):
    """v(k) on a kernel of 4-token blocks is a staircase, flat inside a block: timed only at 3 and 6, a line
    between them would price v(4) too high and v(5) too low, so each block's edges are timed too."""
    from skipsearch.engine import surrogate

    seen = []
    timer = surrogate.time_interleaved

    def spy(calls, **kwargs):
        seen.extend(calls)
        return timer(calls, **kwargs)

    monkeypatch.setattr(surrogate, "time_interleaved", spy)
    surrogate.measure_costs(compiled, tuple(range(3, 23)), verify_sizes=(2, 3, 6, 9), repeats=1)
    assert sorted(int(n[1:]) for n in seen if n.startswith("v")) == [1, 2, 3, 4, 5, 6, 8, 9]
    assert surrogate.timed_verify_sizes((1, 2, 3, 4, 6, 9, 13), 8) == [1, 2, 3, 4, 6, 8, 9, 13]
    assert surrogate.timed_verify_sizes((1, 2, 3, 4, 6, 9, 13), 1) == [1, 2, 3, 4, 6, 9, 13]  # eager: no blocks
    assert surrogate.timed_verify_sizes((2, 6), 16) == [1, 2, 6]  # no edge below the largest size


def test_an_eager_cost_file_of_version_1_still_reads_as_the_eager_kernel(tmp_path):
    from skipsearch.files.cost_profile import load_costs

    path = tmp_path / "old.yaml"
    path.write_text("schema_version: 1\nmodel: {name: m, num_layers: 2}\ndevice: cpu\ndtype: float32\n"
                    "costs: {step_seconds: 0.01, attn_seconds: 0.001, mlp_seconds: 0.002, fixed_seconds: 0.004, "
                    "verify_ratio: [1.0, 1.2]}\n")
    cp = load_costs(path)
    assert cp.kernel.verify == "eager" and cp.costs.parts_seconds == cp.costs.step_seconds
    bad = path.read_text().replace("schema_version: 1", "schema_version: 2\nkernel: {verify: turbo}")
    path.write_text(bad)
    with pytest.raises(Exception, match="kernel.verify: unknown kernel 'turbo'"):
        load_costs(path)


def test_bench_runs_our_rows_on_the_kernel_beside_hf_compiled_greedy(compiled, monkeypatch):
    from skipsearch import bench as bn
    from skipsearch.data import Prompt
    from skipsearch.kernels import inductor

    # the peer compiles under the kernel's settings: as the fixture, without max-autotune (which picks products only)
    monkeypatch.setitem(inductor._SETTINGS, "max_autotune", False)

    class Chars:  # one id per character: enough of a tokenizer for encode_prompt
        eos_token_id, chat_template = None, None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [1] + [2 + ord(c) % 60 for c in text]}

    compiled.tokenizer = Chars()
    prof = _precision_profile()
    prompts = [Prompt("a", "abcabc", False, "x", "t"), Prompt("b", "hello there", False, "y", "t")]
    report = bn.bench(compiled, prompts, profiles=[("p/prec.yaml", prof)], peers=["hf-compiled"], max_new_tokens=12,
                      sweep=False, kernel=Kernel("inductor"))
    names = [r.method for r in report.rows]
    assert names == ["hf-greedy", "skipsearch-ar", "hf-compiled", "precision:prec"]
    assert all(r.identical == r.prompts == 2 for r in report.rows)
    assert report.settings.kernel == "inductor-c4"


def test_hf_compiled_greedy_compiles_its_one_token_step_once_and_runs_prompts_eagerly():
    """The peer compiles as transformers' generate does: one graph, the one-token step, built before any timed call;
    prompts of any length run eagerly, so no decode compiles anything; every output is HF greedy's."""
    from skipsearch.bench import hf_compiled_method
    from skipsearch.engine.decoding import hf_generate

    if not static_cache_supported():
        pytest.skip(f"HF compiled greedy's StaticCache needs transformers 5, not {transformers.__version__}")
    sm = make_tiny_model(vocab_size=64, num_layers=2, seed=5)
    before = graphs_made()
    peer = hf_compiled_method(sm, capacity=64)
    assert graphs_made() == before + 1  # the step, and nothing for the warm-up's prompt
    for prompt in ([3, 4, 5], [7] * 11, [9, 8, 7, 6, 5, 4, 3]):
        assert peer.decode(prompt, 10).token_ids == hf_generate(sm, prompt, max_new_tokens=10)
    assert graphs_made() == before + 1
    assert "one-token step compiled" in peer.setting


def _precision_profile():
    from skipsearch.profile import profile_from_dict

    return profile_from_dict({"schema_version": 4, "model": {"name": "tiny", "num_layers": 4}, "method": "precision",
                              "draft": {"max_draft_tokens": 3, "exit": {"threshold": 0.0, "adaptive": False}},
                              "method_params": {"scheme": "fp16"}, "kernel": "inductor-c4"})


@pytest.mark.parametrize("label", ["inductor-c4", "panel-c4"])
def test_a_kernel_built_again_in_the_same_process_runs_on_its_own_cache(label, monkeypatch):
    """The same kernel after an eager spell (as generate does when asked for skipsearch_kernel="eager" once):
    a second runner with a cache of the same shapes. Its graphs must read and write its own cache, not the first
    runner's (transformers marks a StaticCache's tensors as static addresses without a guard: this gave wrong
    logits on panel and an out-of-bounds abort on inductor). inductor without max-autotune, as the module's."""
    from skipsearch.kernels import inductor

    if label.startswith("inductor"):
        monkeypatch.setitem(inductor._SETTINGS, "max_autotune", False)
    if not static_cache_supported():
        pytest.skip(f"the compiled kernels need transformers 5's StaticCache layers, not {transformers.__version__}")
    try:
        check_kernel(parse_kernel(label), "cpu")
    except ConfigError as exc:
        pytest.skip(str(exc))
    sm = make_tiny_model(vocab_size=64, num_layers=4, seed=11)
    ids = torch.tensor([3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9, 32, 3, 8, 4, 6, 2, 6, 43])
    with torch.inference_mode():
        want = sm.hf(ids[None], use_cache=False).logits[0].float()
    for build in range(2):
        sm.use_kernel(label, capacity=32)
        cache = sm.decode_cache(len(ids))
        blocks = sm.forward(ids[:-1], start=0, cache=cache)
        step = sm.forward(ids[-1:], start=len(ids) - 1, cache=cache)
        assert torch.allclose(blocks, want[:-1], atol=1e-4, rtol=1e-4), build
        assert torch.allclose(step, want[-1:], atol=1e-4, rtol=1e-4), build
        assert generate(sm, PROMPTS[1], max_new_tokens=12).token_ids == hf_generate(sm, PROMPTS[1], max_new_tokens=12)
        sm.use_kernel(EAGER, capacity=0)
