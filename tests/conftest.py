"""Shared fixtures: a tiny random Llama (fast, for exact cache and decoding checks) and the real
default model (slow, marked ``model``), plus the offline prompt sets encoded for a model."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from skipsearch.__main__ import collect_less  # the package's own init imports no torch

# The collector as the CLI's main sets it, before torch's objects are made: at Python's default it spent 22-26 s
# of each worker's 15 minutes (Zen 5) passing over objects that live as long as the worker.
collect_less()

import torch  # noqa: E402

from skipsearch.data import encode_prompt, load_prompts  # noqa: E402
from skipsearch.model.skippable import SkippableModel  # noqa: E402


def make_tiny_model(
    *, vocab_size: int = 64, num_layers: int = 4, seed: int = 0, head_scale: float = 5.0, name: str = "tiny"
) -> SkippableModel:
    """A randomly initialised fp32 Llama wrapped as a SkippableModel (no tokenizer, no EOS).

    Random init gives near-flat next-token distributions; ``head_scale`` multiplies the LM head
    so that argmax is well defined (greedy tests) and sampling is peaked but not degenerate.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    model.generation_config.eos_token_id = None
    return SkippableModel(model, tokenizer=None, name=name)


TINY_WORDS = "def fib ( n ) : return if else + - * 1 2 3 the a of and to in is it you what how why".split()


def tiny_llama(seed: int = 0, **overrides):
    """A tiny random ``LlamaForCausalLM`` that decodes its full max_new_tokens (no EOS)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    settings = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False,
                    bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(LlamaConfig(**{**settings, **overrides})).float().eval()
    model.generation_config.eos_token_id = None  # decode the full max_new_tokens: random weights
    return model


def tiny_tokenizer():
    """A word-level tokenizer over TINY_WORDS (anything else is <unk>), with a plain chat template."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(TINY_WORDS)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    out.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return out


def save_tiny_checkpoint(path, model=None, **kwargs):
    """A tiny random Llama and its tokenizer as a checkpoint directory: ``--model PATH`` loads it, in a
    second, wherever a command's behaviour (storage, interruption, files), not the model, is tested."""
    from pathlib import Path

    (model if model is not None else tiny_llama()).save_pretrained(path, **kwargs)
    tiny_tokenizer().save_pretrained(path)
    return Path(path)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-checkpoint") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_sm() -> SkippableModel:
    return make_tiny_model()


@pytest.fixture(scope="session")
def real_sm() -> SkippableModel:
    """The real default model (SmolLM2-135M, 30 layers), loaded once per session."""
    from skipsearch.model.loader import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def encode_offline() -> Callable[..., list[tuple[str, list[int]]]]:
    """``encode_offline(sm, spec="mtbench,humaneval", n=8, seed=0)`` -> [(prompt id, token ids)].

    Uses the built-in offline prompt sets; chat prompts get the model's chat template.
    """

    def encode(sm: SkippableModel, spec: str = "mtbench,humaneval", *, n: int = 8, seed: int = 0):
        return [(f"{p.source}:{p.id}", encode_prompt(sm.tokenizer, p)) for p in load_prompts(spec, n=n, seed=seed)]

    return encode


# Tests run torch with one intra-op thread. On a 2-core machine that is also running anything
# else, a second OpenMP thread spin-waits for a core: measured here, a 5-token forward of the real
# model went from 0.08 s to 1.8 s and a tiny-model generate from 5 ms to 450 ms. One thread is
# never much slower when the machine is idle, and tests assert behaviour, not speed.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    # Any test that loads the real model is a `model` test, marked or not, so `-m "not model"`
    # always leaves it out.
    for item in items:
        if "real_sm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


def assert_one_line_error(result, fragment: str) -> None:
    """A CLI result (typer's CliRunner) that failed as users must see it: exit 2, one stderr line
    ``error: ...`` containing ``fragment``, and no traceback."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


def assert_greedy_equivalent(sm: SkippableModel, prompt_ids, tokens, reference=None, *, allow_ties: bool = True):
    """Greedy output ``tokens`` against ``reference`` (HF greedy's, decoded here when None) by
    skipsearch.engine.equivalence: identical, or, where ``allow_ties`` and the dtype has a tie tolerance (16-bit
    floats), equal up to numerical ties. Returns the verdict. In fp32 this is token-for-token identity."""
    from skipsearch.engine.decoding import hf_generate
    from skipsearch.engine.equivalence import IDENTICAL, check

    tokens = tuple(tokens)
    if reference is None:
        reference = hf_generate(sm, prompt_ids, max_new_tokens=len(tokens))
    verdict = check(sm, prompt_ids, tokens, reference)
    assert verdict.ok and (allow_ties or verdict.kind == IDENTICAL), verdict.describe()
    return verdict


def compiled_product_calls(module, x: torch.Tensor, *, freezing: bool = True) -> tuple[torch.Tensor, list[str]]:
    """``module(x)`` compiled (with frozen weights, or with the weights as the graph's inputs, as the kernels whose
    graphs are kept compile), and skipsearch's product calls in its graph after AOT autograd's passes (counted by a
    post-grad pass that is never cached, so the count comes from a compile)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Counting(CustomGraphPass):
        def __init__(self) -> None:
            self.calls: list[str] = []

        def __call__(self, graph: torch.fx.Graph) -> None:
            self.calls += [str(n.target) for n in graph.nodes if str(n.target).startswith("skipsearch.")]

        def uuid(self) -> None:
            return None

    torch._dynamo.reset()
    counting = Counting()
    with inductor_config.patch({"freezing": freezing, "post_grad_custom_post_pass": counting}), torch.no_grad():
        out = torch.compile(module, dynamic=False)(x)
    return out, counting.calls


@pytest.fixture
def lowbit_built() -> None:
    """Skip where skipsearch's C++ products cannot be built (the refusal itself is tested in test_lowbit.py)."""
    from skipsearch.config import ConfigError
    from skipsearch.kernels.lowbit import check_lowbit

    try:
        check_lowbit()
    except ConfigError as exc:
        pytest.skip(str(exc))


def copy_lowbit_build(cache) -> None:
    """Copy skipsearch's C++ extension, as this process's cache holds it (``check_lowbit`` built or found it), into
    another cache folder ``cache``, as a machine that had built it keeps it: a process on that folder loads it where
    it would build it again first (43 s on a 2-core Zen 3)."""
    import shutil
    from pathlib import Path

    from skipsearch.kernels.lowbit.build import build_dir

    shutil.copytree(build_dir(), Path(cache) / "lowbit" / build_dir().name)


def graphs_made() -> int:
    """Graphs this process has compiled or loaded so far: dynamo's (torch.compile, and each precompiled call built:
    its capture is dynamo's) and the precompiled calls loaded (``kernels/precompiled.py``, which dynamo never sees).
    Unchanged across a decode = nothing compiled or loaded inside it."""
    from torch._dynamo.utils import counters

    from skipsearch.kernels import precompiled

    return counters["stats"]["unique_graphs"] + precompiled.COUNTS["loaded"]


def lowbit_or_skip() -> None:
    """Skip the test where the low-bit kernels cannot be built here (the refusal itself: tests/test_lowbit.py)."""
    from skipsearch.config import ConfigError
    from skipsearch.kernels.lowbit import check_lowbit

    try:
        check_lowbit()
    except ConfigError as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def isa(request):
    """Run the test on one compiled vector path of the low-bit kernels (skipped where this build has none), then
    restore the default."""
    from skipsearch.kernels.lowbit import isas, use_isa

    lowbit_or_skip()
    if request.param not in isas():
        pytest.skip(f"this build has no {request.param} path (it has {', '.join(isas())})")
    before = use_isa(request.param)
    yield request.param
    use_isa(before)
