"""Hostile inputs, round 3 (issue 67): every prompt source is bounded before it is tokenized or decoded.

A one-megabyte prompt once hung ``bench`` for minutes: nothing checked it against the model's context, so its 222,223
tokens went through HF greedy's prefill, whose attention over that many positions never finished. Now a prompt that
cannot fit the model's context with ``--max-new-tokens`` more is refused in one line, naming its file, row and
length, before the model loads, and untokenized where its length in characters already rules it out
(``data.token_chars``); so is a set of too many rows or too many bytes. A prompt just under the limit still decodes
as HF greedy does.

On a tiny random Llama with a byte-level BPE tokenizer trained here (context 128), so that nothing downloads and
every case takes about a second; the issue's own command, on the default model, is marked ``model``.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import pytest
from conftest import TINY_WORDS, tiny_llama, tiny_tokenizer
from typer.testing import CliRunner

from skipsearch import data
from skipsearch.cli import app
from skipsearch.data import DataError, Prompt, encode_prompt, encode_within, load_prompts, token_chars

runner = CliRunner()
EXAMPLE = "profiles/smollm2-135m/example.yaml"
CONTEXT = 128
MEGABYTE = ("the quick brown fox jumps over the lazy dog. " * 22_223)[:1_000_000]
TEXT = " ".join(TINY_WORDS)


def _bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT] * 4, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    """A checkpoint: a tiny random Llama of 128 positions and a byte-level BPE tokenizer (one token: at most a few
    characters)."""
    path = tmp_path_factory.mktemp("bpe") / "tiny-bpe"
    tok = _bpe_tokenizer()
    tiny_llama(vocab_size=len(tok), max_position_embeddings=CONTEXT, bos_token_id=0, eos_token_id=1
               ).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Every way a command loads a model fails the test: a refusal must come first."""
    from skipsearch import api
    from skipsearch.model import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    monkeypatch.setattr(api, "open_model", lambda **k: pytest.fail("the model loaded before the check"))


def _checkpoint(path: Path):
    from skipsearch.checkpoints import find_checkpoint

    return find_checkpoint(str(path))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_refused(result, fragment: str) -> None:
    """Exit 2, one ``error:`` line holding ``fragment`` that ends stderr, no traceback."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert fragment in errors[0], errors[0]
    assert "Traceback" not in result.output


def _calib_id(source: str) -> str:
    """An id that puts a row of ``source`` in the calib split, which optimize, costs and plan read."""
    return next(str(i) for i in range(64) if data._half(Prompt(str(i), "", False, "", source)) == "calib")


def _csv(path: Path, texts: list[str], ids: list[str] | None = None) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt"] if ids is None else ["id", "prompt"])
        w.writerows([[t] for t in texts] if ids is None else zip(ids, texts, strict=True))
    return path


def _megabyte_files(folder: Path) -> dict[str, Path]:
    return {"csv": _csv(folder / "pr-1mb.csv", [MEGABYTE], [_calib_id("pr-1mb.csv")]),
            "jsonl": _write(folder / "pr-1mb.jsonl", json.dumps({"prompt": MEGABYTE}) + "\n")}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- the issue's case: a one-megabyte prompt, one line and exit 2 in seconds, before the model loads ---------------
def _commands(bpe: Path, files: dict[str, Path], out: Path) -> dict[str, list[str]]:
    return {
        "bench": ["bench", "--model", str(bpe), "--dataset", str(files["csv"]), "--split", "all", "--n-prompts", "1",
                  "--max-new-tokens", "2", "--sweep-prompts", "0", "--json-out", str(out / "bench.json"),
                  "--report", str(out / "bench.md")],
        "optimize": ["optimize", "--model", str(bpe), "--dataset", str(files["csv"]), "--n-prompts", "1",
                     "--max-new-tokens", "2", "--budget", "1", "--out", str(out / "best.yaml")],
        "decode": ["decode", "--model", str(bpe), "--prompts-file", str(files["jsonl"]), "--max-new-tokens", "2",
                   "--json"],
        "costs": ["costs", "--model", str(bpe), "--dataset", str(files["csv"]), "--max-new-tokens", "4",
                  "--out", str(out / "costs.yaml")],
        "plan": ["plan", "hierarchical", "--medium", EXAMPLE, "--small", EXAMPLE, "--model", str(bpe), "--dataset",
                 str(files["csv"]), "--max-new-tokens", "2", "--out", str(out / "hier.yaml")],
    }


@pytest.mark.parametrize("command", ["bench", "optimize", "decode", "costs", "plan"])
def test_a_megabyte_prompt_is_one_line_in_seconds_before_the_model_loads(tmp_path, bpe, no_model, command):
    files = _megabyte_files(tmp_path)
    argv = _commands(bpe, files, tmp_path)[command]
    before = _snapshot(tmp_path)
    start = time.perf_counter()
    result = runner.invoke(app, argv)
    seconds = time.perf_counter() - start
    row = f"{files['jsonl']}:1" if command == "decode" else f"pr-1mb.csv:{_calib_id('pr-1mb.csv')}"
    new = 4 // 2 if command == "costs" else 2  # costs continues its prompt for half of --max-new-tokens
    assert_refused(result, f"{row}: 1000000 characters cannot fit the model's context length of {CONTEXT} tokens "
                           f"with {new} new tokens")
    assert seconds < 20, seconds
    assert _snapshot(tmp_path) == before  # the input as it was, and no output begun


@pytest.mark.model
def test_the_issues_bench_command_is_one_line_before_the_model_loads(tmp_path, no_model):
    """The command of issue 67, on the default model (context 8192): refused by the prompt's length alone."""
    path = _csv(tmp_path / "pr-1mb.csv", [MEGABYTE])
    start = time.perf_counter()
    result = runner.invoke(app, ["bench", "--profiles", EXAMPLE, "--dataset", str(path), "--split", "all",
                                 "--n-prompts", "1", "--max-new-tokens", "2", "--sweep-prompts", "0"])
    assert_refused(result, "pr-1mb.csv:0: 1000000 characters cannot fit the model's context length of 8192 tokens")
    assert time.perf_counter() - start < 20


# -- every source: --prompt, a prompts file, and a data set as JSONL, JSON, CSV, Parquet or hf: -------------------
def _parquet(path: Path, texts: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": texts}), path)
    return path


SOURCES = {
    "jsonl": lambda d, t: _write(d / "set.jsonl", "".join(json.dumps({"prompt": x}) + "\n" for x in t)),
    "json": lambda d, t: _write(d / "set.json", json.dumps([{"prompt": x} for x in t])),
    "csv": lambda d, t: _csv(d / "set.csv", t),
    "parquet": lambda d, t: _parquet(d / "set.parquet", t),
}


@pytest.mark.parametrize("fmt", list(SOURCES))
def test_a_row_too_long_for_the_context_is_refused_naming_its_file_and_row(tmp_path, bpe, no_model, fmt):
    path = SOURCES[fmt](tmp_path, [TEXT, "x" * 50_000])
    result = runner.invoke(app, ["bench", "--model", str(bpe), "--dataset", str(path), "--split", "all",
                                 "--max-new-tokens", "2", "--sweep-prompts", "0"])
    assert_refused(result, f"{path.name}:1: 50000 characters cannot fit the model's context length of 128 tokens")


def test_an_hf_dataset_row_is_bounded_alike(monkeypatch, bpe):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [{"text": TEXT}, {"text": "y" * 50_000}])
    from skipsearch.api import check_prompts_fit

    with pytest.raises(DataError, match="hf:some/set:1: 50000 characters cannot fit"):
        check_prompts_fit(str(bpe), load_prompts("hf:some/set"), max_new_tokens=2)


def test_a_prompt_option_too_long_is_refused_before_the_model_loads(bpe, no_model):
    result = runner.invoke(app, ["decode", "--model", str(bpe), "--prompt", "z" * 5000, "--max-new-tokens", "2"])
    assert_refused(result, "--prompt: 5000 characters cannot fit the model's context length of 128 tokens")


def test_a_set_of_too_many_rows_or_bytes_is_refused(tmp_path, bpe, no_model, monkeypatch):
    monkeypatch.setattr(data, "MAX_ROWS", 3)
    for make in SOURCES.values():
        path = make(tmp_path, ["a", "b", "c", "d"])
        with pytest.raises(DataError, match="more than (the )?3"):
            load_prompts(str(path))
    rows = _write(tmp_path / "p.jsonl", "".join(json.dumps({"prompt": w}) + "\n" for w in "abcd"))
    assert_refused(runner.invoke(app, ["decode", "--model", str(bpe), "--prompts-file", str(rows)]),
                   f"{rows}:4: more than 3 rows")
    monkeypatch.setattr(data, "MAX_PROMPTS_BYTES", 64)  # the real bound is 256 MiB: too big to write here
    big = _csv(tmp_path / "big.csv", ["a" * 100])
    with pytest.raises(DataError, match="cannot read dataset file .*big.csv: larger than"):
        load_prompts(str(big))


# -- the bound is exact where it matters: what fits decodes, as HF greedy does ------------------------------------
def _prompt_of(tokenizer, n: int) -> str:
    """A text of exactly ``n`` tokens."""
    words = (TEXT.split() * 64)
    for end in range(1, len(words)):
        text = " ".join(words[:end])
        if len(encode_prompt(tokenizer, text)) == n:
            return text
    raise AssertionError(f"no text of {n} tokens")


def test_a_prompt_just_under_the_limit_decodes_as_hf_greedy_and_one_token_more_is_refused(tmp_path, bpe,
                                                                                            monkeypatch):
    from skipsearch import api
    from skipsearch.config import DraftConfig
    from skipsearch.engine.decoding import hf_generate
    from skipsearch.model.loader import load_model

    sm = load_model(str(bpe))
    text = _prompt_of(sm.tokenizer, CONTEXT - 8)
    path = _write(tmp_path / "p.jsonl", json.dumps({"prompt": text}) + "\n")
    ok = runner.invoke(app, ["decode", "--model", str(bpe), "--prompts-file", str(path), "--max-new-tokens", "8",
                             "--json"])
    assert ok.exit_code == 0, ok.output
    row = json.loads(ok.stdout)
    assert len(row["prompt_token_ids"]) == CONTEXT - 8 and len(row["token_ids"]) == 8
    reference = hf_generate(sm, row["prompt_token_ids"], max_new_tokens=8)
    assert tuple(row["token_ids"]) == reference
    # a draft that skips layers, verified by the full model, at the very edge of the context
    (drafted,) = api.decode_prompts(sm, [Prompt("1", text, False, "", "p")], max_new_tokens=8,
                                    config=DraftConfig(skip_attn=(1, 2), skip_mlp=(2,), max_draft_tokens=3))
    assert drafted.result.token_ids == reference
    monkeypatch.setattr(api, "open_model", lambda **k: pytest.fail("the model loaded before the check"))
    over = runner.invoke(app, ["decode", "--model", str(bpe), "--prompts-file", str(path), "--max-new-tokens", "9"])
    assert_refused(over, f"{path}:1: {CONTEXT - 8} prompt tokens + 9 new tokens exceed the model's context length "
                         f"of {CONTEXT} tokens; shorten it or lower --max-new-tokens to 8 or less")


MIXED = ["plain words, some punctuation!", "emoji 🦊🐕 and CJK 狐狸跳过了懒狗", " " * 500, "\n\t" * 300, "#" * 1000,
         "é" * 400, "".join(chr(c) for c in range(32, 2000)), TEXT]


def test_the_character_cap_never_refuses_what_fits(bpe):
    """A token stands for at most ``token_chars`` characters, so a text of more than room x that many characters
    needs more tokens than the room holds: the cap refuses nothing the exact check would pass."""
    from skipsearch.model.loader import read_tokenizer

    tok = read_tokenizer(_checkpoint(bpe))
    per = token_chars(tok)
    assert per is not None and per < 16
    for text in MIXED:
        assert len(text) <= per * len(encode_prompt(tok, text)), text


@pytest.mark.model
def test_the_default_models_character_cap_holds():
    from skipsearch.checkpoints import find_checkpoint
    from skipsearch.model.loader import read_tokenizer

    tok = read_tokenizer(find_checkpoint("smollm2-135m"))
    per = token_chars(tok)
    assert per is not None
    for text in [*MIXED, MEGABYTE[:20_000]]:
        for chat in (False, True):
            assert len(text) <= per * len(encode_prompt(tok, text, chat=chat)), text


def test_no_character_cap_where_one_token_may_stand_for_any_length():
    """A word-level vocabulary reads a megabyte-long unknown word as one token: no cap, and it fits."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer()
    assert token_chars(tok) is None
    assert encode_within(tok, Prompt("0", "x" * 1_000_000, False, "", "s"), context=CONTEXT, max_new_tokens=2) == [0]
    for pre in (pre_tokenizers.Whitespace(), pre_tokenizers.WhitespaceSplit()):  # spaces dropped: unbounded
        backend = Tokenizer(models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>"))
        backend.pre_tokenizer = pre
        assert token_chars(PreTrainedTokenizerFast(tokenizer_object=backend)) is None
    fused = Tokenizer(models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>", fuse_unk=True))
    assert token_chars(PreTrainedTokenizerFast(tokenizer_object=fused)) is None
    assert token_chars(object()) is None  # no backend to read: tokenized whole, checked exactly


def test_max_new_tokens_that_leave_no_room_are_refused_untokenized():
    with pytest.raises(DataError, match="128 new tokens leave no room .* lower --max-new-tokens to 127 or less"):
        encode_within(object(), Prompt("0", "hi", False, "", "s"), context=CONTEXT, max_new_tokens=CONTEXT)


def test_the_bench_library_refuses_a_prompt_past_the_context_before_timing(bpe, monkeypatch):
    from skipsearch import bench as bn
    from skipsearch.engine import harness
    from skipsearch.model.loader import load_model

    sm = load_model(str(bpe))
    monkeypatch.setattr(harness, "run_rounds", lambda *a, **k: pytest.fail("timed before the check"))
    with pytest.raises(DataError, match="t:long: 50000 characters cannot fit"):
        bn.bench(sm, [Prompt("ok", TEXT, False, "", "t"), Prompt("long", "w" * 50_000, False, "", "t")],
                 max_new_tokens=2, sweep=False)


# -- a slow step is never silent ------------------------------------------------------------------------------------
def test_each_stage_says_so_on_stderr_where_no_bar_is_drawn():
    import re

    from rich.console import Console
    from rich.progress import TextColumn

    from skipsearch.cli.edge import LazyProgress

    out = io.StringIO()  # not a terminal: rich draws the bar once, at the end
    with LazyProgress(TextColumn("{task.description}"), console=Console(file=out), every=0.0) as bar:
        bar.stage("compile", 0)
        bar.stage("bench", 3)
        bar.update(bar.task, completed=1)
    lines = out.getvalue().splitlines()
    assert lines[:4] == ["compile: 0", "compile: done in 0 s", "bench: 0/3", "bench: 1/3"]
    assert re.fullmatch(r"bench: done in \d+ s", lines[4])  # each stage's time, where it ends (a log shows it)


def test_tokenizing_much_text_says_so(bpe, monkeypatch):
    import contextlib

    from skipsearch.model.loader import read_tokenizer

    said = []
    monkeypatch.setattr(data, "_SLOW_CHARS", 10)
    monkeypatch.setattr(data, "long_step", lambda log, msg, *args: said.append(msg % args) or contextlib.nullcontext())
    data.longest_within(read_tokenizer(_checkpoint(bpe)), [Prompt("0", TEXT, False, "", "s")], context=CONTEXT,
                        max_new_tokens=2)
    assert said == [f"tokenizing 1 prompt(s) ({len(TEXT)} characters) ..."]
