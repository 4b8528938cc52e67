"""Bad input and interruptions at the CLI (issue 14): a one-line error and exit 2, before any heavy
work, nothing finished lost, no traceback. On a tiny random model with a byte-level fake tokenizer."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest
from conftest import assert_one_line_error, make_tiny_model
from typer.testing import CliRunner

from skipsearch import api
from skipsearch.api import decode as api_decode
from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.data import DataError, Prompt

runner = CliRunner()
EXAMPLE = "profiles/smollm2-135m/example.yaml"

# A byte-level vocabulary of 64 tokens in which two-byte characters are common: 32 ASCII characters,
# then 16 tokens that are the lead byte 0xC3 and 16 continuation bytes 0xA0..0xAF ("à".."ï" in pairs).
_BYTES = [bytes([b]) for b in b"abcdefghijklmnopqrstuvwxyz .,!?\n"] + [b"\xc3"] * 16 + [
    bytes([0xA0 + i]) for i in range(16)]


class ByteTokenizer:
    eos_token_id = None
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [_BYTES.index(bytes([b])) for b in text.encode()]}

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(_BYTES[i] for i in ids).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def text_sm():
    sm = make_tiny_model(seed=3)  # context: 256 positions
    sm.tokenizer = ByteTokenizer()
    return sm


@pytest.fixture
def tiny_cli(text_sm, monkeypatch):
    """`skipsearch decode` on the tiny model; counts the prompts decoded."""
    calls = []
    monkeypatch.setattr(api, "open_model", lambda **kwargs: (text_sm, None))
    real_generate = api_decode.generate

    def generate(*args, **kwargs):
        calls.append(args[1])
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(api_decode, "generate", generate)
    return calls


def _prompts_file(tmp_path, rows) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


# -- cause 2: every finished result is written at once -----------------------------------------------------
@pytest.mark.parametrize(("failure", "exit_code"), [(KeyboardInterrupt, 130), (ConfigError("broke"), 2)])
def test_decode_json_keeps_every_finished_result_when_interrupted(tmp_path, tiny_cli, monkeypatch, failure,
                                                                  exit_code):
    generate = api_decode.generate

    def fourth_fails(*args, **kwargs):
        if len(tiny_cli) == 3:
            raise failure
        return generate(*args, **kwargs)

    monkeypatch.setattr(api_decode, "generate", fourth_fails)
    path = _prompts_file(tmp_path, [{"prompt": w} for w in ("one", "two", "three", "four")])
    result = runner.invoke(app, ["decode", "--prompts-file", path, "--json", "--max-new-tokens", "6"])
    assert result.exit_code == exit_code, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in rows] == ["one", "two", "three"]
    assert "Traceback" not in result.output


def test_decode_prompts_yields_each_result_before_decoding_the_next(text_sm, monkeypatch):
    started = []
    generate = api_decode.generate
    monkeypatch.setattr(api_decode, "generate", lambda *a, **k: started.append(1) or generate(*a, **k))
    results = api.decode_prompts(text_sm, [Prompt(str(i), "abc", False, "", "t") for i in range(3)],
                                 max_new_tokens=4)
    assert started == []  # checked at the call, decoded on demand
    next(results)
    assert len(started) == 1


# -- cause 3: a prompt longer than the context -------------------------------------------------------------
def test_decode_refuses_a_prompt_past_the_context_before_decoding(tmp_path, tiny_cli):
    path = _prompts_file(tmp_path, [{"prompt": "short"}, {"prompt": "a" * 250}])
    result = runner.invoke(app, ["decode", "--prompts-file", path, "--max-new-tokens", "10"])
    assert_one_line_error(result, f"{path}:2: 250 prompt tokens + 10 new tokens exceed the model's context "
                                  f"length of 256 tokens; shorten it or lower --max-new-tokens to 6 or less")
    assert tiny_cli == [] and result.stdout == ""
    ok = runner.invoke(app, ["decode", "--prompts-file", path, "--max-new-tokens", "6", "--json"])
    assert ok.exit_code == 0, ok.output
    too_long = runner.invoke(app, ["decode", "--prompt", "b" * 300, "--max-new-tokens", "1"])
    assert_one_line_error(too_long, "--prompt: 300 prompt tokens + 1 new tokens exceed the model's context "
                                    "length of 256 tokens; shorten it")


def test_decode_prompts_checks_the_context_at_the_call(text_sm):
    with pytest.raises(DataError, match="context length of 256"):
        api.decode_prompts(text_sm, [Prompt("7", "a" * 256, False, "", "set")], max_new_tokens=1)
    with pytest.raises(DataError, match="set:7: the prompt is empty"):
        api.decode_prompts(text_sm, [Prompt("7", "", False, "", "set")])
    with pytest.raises(ConfigError, match="max_new_tokens must be >= 1"):
        api.decode_prompts(text_sm, [Prompt("7", "a", False, "", "set")], max_new_tokens=0)


# -- cause 6: the stream never shows half a character ------------------------------------------------------
def test_streamed_text_equals_the_json_text_for_split_characters(tiny_cli):
    args = ["decode", "--prompt", "hello", "--max-new-tokens", "60"]
    streamed = runner.invoke(app, args)
    as_json = runner.invoke(app, [*args, "--json"])
    assert streamed.exit_code == 0 and as_json.exit_code == 0, streamed.output + as_json.output
    text = json.loads(as_json.stdout)["text"]
    assert any("à" <= ch <= "ï" for ch in text)  # the output really has two-token characters
    assert streamed.stdout == text


def test_text_stream_holds_back_an_incomplete_character_and_flushes_it_at_the_end():
    pieces = []
    stream = api_decode._TextStream(ByteTokenizer(), pieces.append)
    lead, tail = _BYTES.index(b"\xc3"), _BYTES.index(b"\xa9")
    for ids in ([0], [lead], [tail], [lead]):  # "a", then "é" over two tokens, then a lone lead byte
        stream.push(ids)
    assert pieces == ["a", "é"]  # nothing ending in U+FFFD went out
    assert stream.finish() == "aé\ufffd" and "".join(pieces) == "aé\ufffd"  # ... until the end


@pytest.mark.model
def test_real_tokenizer_streams_emoji_and_cjk_whole(real_sm):
    text = "héllo 🦙🦙 café 日本語"
    ids = real_sm.tokenizer(text, add_special_tokens=False).input_ids
    assert "\ufffd" in real_sm.tokenizer.decode(ids[:4])  # the tokenizer does split a character here
    pieces = []
    stream = api_decode._TextStream(real_sm.tokenizer, pieces.append)
    for i in ids:
        stream.push([i])
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text and stream.finish() == text


# -- causes 8 and 10: prompts of the wrong type, empty prompts ---------------------------------------------
@pytest.mark.parametrize(("row", "fragment"), [
    ({"prompt": None}, ':2: "prompt" must be a string, got null'),
    ({"prompt": 5}, ':2: "prompt" must be a string, got 5'),
    ({"prompt": ["a"]}, ':2: "prompt" must be a string, got ["a"]'),
    ({"prompt": "x", "chat": "false"}, ':2: "chat" must be true or false, got "false"'),
    ({"prompt": "x", "chat": 1}, ':2: "chat" must be true or false, got 1'),
    ({"prompt": ""}, ':2: "prompt" is empty'),
    ({"text": "x"}, ':2: no "prompt" key'),
    ("[1, 2]", ":2: each line must be a JSON object"),
    ("{not json", ":2: not valid JSON"),
    ("[" * 100_000, ":2: not valid JSON (nested too deeply)"),
])
def test_prompts_file_values_are_never_coerced(tmp_path, tiny_cli, monkeypatch, row, fragment):
    monkeypatch.setattr(api, "open_model", lambda **kwargs: pytest.fail("the model must not load"))
    path = _prompts_file(tmp_path, [{"prompt": "fine", "chat": False}, row])
    assert_one_line_error(runner.invoke(app, ["decode", "--prompts-file", path]), path + fragment)


def test_prompts_file_not_utf8(tmp_path, tiny_cli):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    assert_one_line_error(runner.invoke(app, ["decode", "--prompts-file", str(path)]), "cannot read prompts file")


def test_prompts_file_null_chat_means_the_default(tmp_path, tiny_cli):
    path = _prompts_file(tmp_path, [{"prompt": "ab", "chat": None}])
    assert runner.invoke(app, ["decode", "--prompts-file", path, "--max-new-tokens", "2"]).exit_code == 0


def test_decode_empty_prompt_is_one_line(tiny_cli, monkeypatch):
    monkeypatch.setattr(api, "open_model", lambda **kwargs: pytest.fail("the model must not load"))
    assert_one_line_error(runner.invoke(app, ["decode", "--prompt", ""]), "--prompt is empty")


# -- cause 9: study show only reads ------------------------------------------------------------------------
def _sqlite_not_optuna(path) -> bytes:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("how", ["dir", "storage"])
def test_study_show_leaves_a_non_optuna_database_as_it_was(tmp_path, how):
    db = tmp_path / "study.db"
    before = _sqlite_not_optuna(db)
    args = [str(tmp_path)] if how == "dir" else ["--storage", f"sqlite:///{db}"]
    assert_one_line_error(runner.invoke(app, ["study", "show", *args]), "is not an Optuna study")
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.db"]  # no journal or WAL left either


def test_study_show_on_a_file_that_is_not_sqlite(tmp_path):
    (tmp_path / "study.db").write_bytes(b"hello, not a database" * 100)
    assert_one_line_error(runner.invoke(app, ["study", "show", str(tmp_path)]),
                          "is not an Optuna study (not a SQLite database")
    assert (tmp_path / "study.db").read_bytes() == b"hello, not a database" * 100


def test_study_show_does_not_write_to_a_real_study_either(tmp_path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = tmp_path / "s" / "study.db"
    db.parent.mkdir()
    optuna.create_study(storage=f"sqlite:///{db}", study_name="s")
    before = db.read_bytes()
    shown = runner.invoke(app, ["study", "show", str(db.parent)])
    assert shown.exit_code == 0, shown.output
    assert db.read_bytes() == before
    assert_one_line_error(runner.invoke(app, ["study", "show", str(db.parent), "--study-name", "other"]),
                          "no study 'other'")
    assert_one_line_error(runner.invoke(app, ["study", "show", str(db.parent), "--top", "-1"]), "--top must be >= 0")


@pytest.mark.parametrize(("storage", "fragment"), [
    ("postgresql+psycopg2://nobody@127.0.0.1:1/x", "cannot read 'postgresql+psycopg2://nobody@127.0.0.1:1/x'"),
    ("not a url", "is not a database URL"),
    ("sqlite:///{tmp}/absent.db", "no such database file"),
])
def test_study_show_unreachable_or_bad_storage_is_one_line_and_quick(tmp_path, storage, fragment):
    if storage.startswith("postgresql"):
        pytest.importorskip("psycopg2")
    start = time.perf_counter()
    result = runner.invoke(app, ["study", "show", "--storage", storage.format(tmp=tmp_path)])
    assert_one_line_error(result, fragment)
    # no waiting on a network timeout (minutes); the margin holds on a loaded machine
    assert time.perf_counter() - start < 30
    assert not (tmp_path / "absent.db").exists()  # looking did not create it


def test_study_show_on_trials_skipsearch_did_not_write(tmp_path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="x")
    trial = study.ask()
    trial.set_user_attr("config", "not a config")
    study.tell(trial, 1.0)
    assert_one_line_error(runner.invoke(app, ["study", "show", str(tmp_path)]), "has trials skipsearch did not write")


# -- cause 4: output paths are checked before the work -----------------------------------------------------
def test_plan_out_is_checked_before_measuring(tmp_path, monkeypatch):
    from skipsearch.model import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("must not measure"))
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    base = ["plan", "hierarchical", "--medium", EXAMPLE, "--small", EXAMPLE]
    assert_one_line_error(runner.invoke(app, [*base, "--out", str(notes)]), "is not a skipsearch profile")
    assert_one_line_error(runner.invoke(app, [*base, "--out", str(tmp_path)]), "is a directory")
    assert_one_line_error(runner.invoke(app, [*base, "--out", str(notes / "p.yaml")]), "is not a directory")
    assert_one_line_error(runner.invoke(app, [*base, "--report", str(notes / "r.md")]), "is not a directory")
    assert notes.read_text() == "keep me"


def test_bench_outputs_are_checked_before_the_model_loads(tmp_path, monkeypatch):
    import os

    from skipsearch.model import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    base = ["bench", "--peers", "hf-greedy", "--n-prompts", "1"]
    assert_one_line_error(runner.invoke(app, [*base, "--report", str(tmp_path)]), "is a directory")
    profile = tmp_path / "p.yaml"
    profile.write_bytes(open(EXAMPLE, "rb").read())
    os.chmod(profile, 0o444)
    assert_one_line_error(runner.invoke(app, [*base, str(profile), "--write-measured"]), "read-only")


def test_plan_analysis_report_in_a_read_only_folder(tmp_path):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    try:
        result = runner.invoke(app, ["plan", "hierarchical", "--alpha", "0.8", "--beta", "0.6", "--c", "0.5",
                                     "--cs", "0.5", "--report", str(locked / "r.md")])
    finally:
        os.chmod(locked, 0o755)
    assert_one_line_error(result, "is not writable")


# -- cause 5: a YAML alias bomb is refused at once by every command that reads profiles --------------------
@pytest.mark.parametrize("command", [["profile", "validate"], ["profile", "show"],
                                     ["decode", "--prompt", "hi", "--profile"]])
@pytest.mark.parametrize("where", ["schema_version", "measured"])
def test_a_1kb_alias_bomb_is_one_line_at_once(tmp_path, command, where):
    bomb = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))  # 9**9 "lol"s
    if where == "schema_version":
        text = bomb + "schema_version: *l8\n"
    else:  # an otherwise valid profile, whose measured block `profile show` would print
        text = bomb + open(EXAMPLE).read().replace("measured:\n", "measured:\n  boom: *l8\n", 1)
    assert len(text.encode()) < 2048
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    start = time.perf_counter()
    result = runner.invoke(app, [*command, str(path)])
    # refused, not expanded: 9**9 nodes would take minutes and gigabytes (a wide margin, for a loaded machine)
    assert time.perf_counter() - start < 30
    assert_one_line_error(result, "expands through its aliases")
