"""The llama.cpp peer without a llama.cpp binary: each setting's llama-server arguments (against llama.cpp's flag
schema), the parsing of ``/completion`` answers written from the server's documented shape, the one line when no
binary is found, the best setting (a differing or failed one never wins), loopback and a free port; and the whole
grid against a stand-in server (a Python script that answers /health and /completion), GGUFs and a profile's export
included. One test runs a real llama-server, when one is found, and checks its greedy output against HF's."""

from __future__ import annotations

import dataclasses
import json
import socket
import stat
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import LLAMA_FLAGS, _bpe_checkpoint, _profile, check_llama

from skipsearch.bench import llamacpp as lp
from skipsearch.bench import llamacpp_ggufs as lg
from skipsearch.bench import llamacpp_report as report
from skipsearch.config import ConfigError
from skipsearch.model.skippable import SkippableModel
from skipsearch.servers.llamacpp import (
    HOST,
    Completion,
    LlamaCppError,
    free_port,
    log_line,
    parse_completion,
    request_body,
)

# llama.cpp as vendored in llama-cpp-python 0.3.36, common/arg.cpp: the ngram-mod flags (``--spec-default``'s)
# beside the ones exports use (test_export.LLAMA_FLAGS), and the spec types of common/speculative.cpp.
FLAGS = {**LLAMA_FLAGS, "--spec-ngram-mod-n-match": int, "--spec-ngram-mod-n-min": int, "--spec-ngram-mod-n-max": int}


def check_args(args) -> None:
    """Flag/value pairs llama.cpp's parser takes, each value of its kind (test_export's check, with ngram-mod)."""
    assert len(args) % 2 == 0
    for flag, value in zip(args[::2], args[1::2], strict=True):
        FLAGS[flag](value)
    if any(f.startswith("--spec-ngram-mod") for f in args[::2]):
        assert dict(zip(args[::2], args[1::2], strict=True))["--spec-type"] == "ngram-mod"
    else:
        check_llama(list(args))


# -- arguments ---------------------------------------------------------------------------------------------
def test_each_setting_builds_the_flags_llama_cpp_spells():
    assert lp.draft_args("/c/draft-q8_0.gguf", 4) == ["-md", "/c/draft-q8_0.gguf", "--spec-draft-n-max", "4",
                                                      "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    assert lp.ngram_args(3, 8) == ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8",
                                   "--spec-ngram-simple-min-hits", "1"]
    both = lp.spec_args(ngram=(3, 2), draft=("d.gguf", 2))
    assert both[:2] == ["--spec-type", "ngram-simple,draft-simple"]  # the n-gram first, as the export writes it
    assert both[2:] == [*lp.ngram_args(3, 2), *lp.draft_args("d.gguf", 2)]
    with pytest.raises(ConfigError):
        lp.spec_args()
    settings = lp.grid(drafts={"q8_0": "/c/draft-q8_0.gguf", "q4_0": "/c/draft-q4_0.gguf"}, n_max=(2, 4, 8))
    kinds = [s.kind for s in settings]
    assert kinds[0] == lp.PLAIN and settings[0].args == ()
    assert kinds.count(lp.DRAFT) == 6 and kinds.count(lp.NGRAM) == 3 and kinds.count(lp.BOTH) == 6
    assert kinds.count(lp.DEFAULT) == 1 and len({s.name for s in settings}) == len(settings)
    for s in settings[1:]:
        check_args(s.args)
    args = {s.name: s.args for s in settings}
    q4 = args["draft q4_0 n=8"]
    assert q4[q4.index("-md") + 1] == "/c/draft-q4_0.gguf" and q4[q4.index("--spec-draft-n-max") + 1] == "8"
    ng = args["ngram 3/4"]
    assert ng[1] == "ngram-simple" and ng[ng.index("--spec-ngram-simple-size-m") + 1] == "4"
    assert "draft-simple" in args["ngram 3/2 + draft q8_0 n=2"][1]
    assert args["spec-default (ngram-mod)"][:2] == ("--spec-type", "ngram-mod")
    assert settings[1].flags.startswith("--spec-type draft-simple -md draft-q8_0.gguf")  # paths shortened for rows
    only = lp.grid(drafts={"q8_0": "d.gguf"}, kinds=(lp.PLAIN, lp.NGRAM), n_max=(2,), ngram_n=(2, 4))
    assert [s.name for s in only] == ["plain", "ngram 2/2", "ngram 4/2"]
    picked = lp.grid(drafts={"q8_0": "d.gguf"}, n_max=(2, 4), names=("plain", "draft q8_0 n=4"))
    assert [s.name for s in picked] == ["plain", "draft q8_0 n=4"]
    with pytest.raises(ConfigError, match="no llama.cpp setting named 'draft q4_0 n=4'"):
        lp.grid(drafts={"q8_0": "d.gguf"}, n_max=(2, 4), names=("draft q4_0 n=4",))
    with pytest.raises(ConfigError, match="unknown llama.cpp setting kind"):
        lp.grid(kinds=("lookahead",))


def test_the_server_listens_on_loopback_at_a_free_port_with_one_slot():
    cmd = lp.server_command("/bin/llama-server", "/c/t.gguf", ["--spec-type", "ngram-simple"], port=8123, threads=2,
                            context=512)
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert cmd[0] == "/bin/llama-server" and flags["--host"] == HOST == "127.0.0.1"
    assert flags["--port"] == "8123" and flags["-t"] == "2" and flags["-c"] == "512" and flags["-np"] == "1"
    assert flags["-m"] == "/c/t.gguf" and cmd[-2:] == ["--spec-type", "ngram-simple"]
    port = free_port()
    with socket.socket() as s:  # free now, on the loopback interface
        s.bind((HOST, port))
    assert lp.context_size([[1] * 300, [1] * 10], 48, draft=8) == 512
    assert lp.context_size([[1] * 10], 48) == 256


def test_a_request_is_greedy_on_the_prompts_token_ids():
    body = request_body([5, 6, 7], 48)
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 48
    assert body["temperature"] == 0.0 and body["top_k"] == 1
    assert body["return_tokens"] is True and body["cache_prompt"] is False and body["stream"] is False


# -- parsing answers ---------------------------------------------------------------------------------------
# /completion answers as tools/server writes them (server_task_result_cmpl_final::to_json_non_oaicompat,
# server_slot_stats::to_json), written by hand: with drafting (draft_n present) and without (absent).
DRAFTED = {"index": 0, "content": " world", "tokens": [1917, 11, 1917], "id_slot": 0, "stop": True,
           "model": "gpt-3.5-turbo", "tokens_predicted": 3, "tokens_evaluated": 5,
           "generation_settings": {"n_predict": 3, "temperature": 0.0, "top_k": 1}, "prompt": "", "has_new_line": False,
           "truncated": False, "stop_type": "limit", "stopping_word": "", "tokens_cached": 0,
           "timings": {"cache_n": 0, "prompt_n": 5, "prompt_ms": 12.5, "prompt_per_token_ms": 2.5,
                       "prompt_per_second": 400.0, "predicted_n": 3, "predicted_ms": 30.0,
                       "predicted_per_token_ms": 10.0, "predicted_per_second": 100.0, "draft_n": 4,
                       "draft_n_accepted": 2}}
PLAIN = {**DRAFTED, "tokens": [7, 8], "stop_type": "eos",
         "timings": {k: v for k, v in DRAFTED["timings"].items() if not k.startswith("draft")} | {"predicted_n": 2}}


def test_answers_parse_into_tokens_and_the_servers_counters():
    c = parse_completion(DRAFTED)
    assert c == Completion(tokens=(1917, 11, 1917), predicted_n=3, predicted_ms=30.0, prompt_n=5, prompt_ms=12.5,
                           drafted=4, accepted=2, stop_type="limit")
    p = parse_completion(json.loads(json.dumps(PLAIN)))
    assert p.tokens == (7, 8) and p.drafted == p.accepted == 0 and p.stop_type == "eos"


@pytest.mark.parametrize("answer,fragment", [
    ([1, 2], "not a JSON object"),
    ({"error": {"code": 400, "message": "the prompt is too long", "type": "invalid_request_error"}}, "too long"),
    ({**DRAFTED, "tokens": None}, "no list of token ids"),
    ({**DRAFTED, "tokens": [1, "a"]}, "no list of token ids"),
    ({**DRAFTED, "tokens": []}, "without return_tokens"),
    ({k: v for k, v in DRAFTED.items() if k != "timings"}, "no 'timings'"),
    ({**DRAFTED, "timings": {**DRAFTED["timings"], "predicted_ms": "fast"}}, "timings.predicted_ms"),
    ({**DRAFTED, "timings": {**DRAFTED["timings"], "predicted_n": 2.5}}, "not a count"),
    ({**DRAFTED, "timings": {**DRAFTED["timings"], "draft_n": -1}}, "timings.draft_n"),
])
def test_a_malformed_answer_is_one_line(answer, fragment):
    with pytest.raises(LlamaCppError, match=fragment) as e:
        parse_completion(answer)
    assert "\n" not in str(e.value)


def test_the_log_line_names_the_error(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("main: loading model\nerror: invalid argument: --spec-type lookahead\nmain: exiting\n")
    assert log_line(log) == "error: invalid argument: --spec-type lookahead"
    log.write_text("main: loading model\nmain: exiting\n")
    assert log_line(log) == "main: exiting"
    assert log_line(tmp_path / "none.log") == "(no log)"


# -- the binary --------------------------------------------------------------------------------------------
def _executable(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_server_is_found_by_option_then_environment_then_path(tmp_path):
    mine, theirs = _executable(tmp_path / "mine"), _executable(tmp_path / "theirs")
    on_path = lambda name: "/usr/bin/llama-server" if name == "llama-server" else None  # noqa: E731
    assert lp.find_server(str(mine), env={lp.ENV: str(theirs)}, which=on_path) == (str(mine), None)
    assert lp.find_server(None, env={lp.ENV: str(theirs)}, which=on_path) == (str(theirs), None)
    assert lp.find_server(None, env={}, which=on_path) == ("/usr/bin/llama-server", None)
    found, line = lp.find_server(str(tmp_path / "missing"), env={}, which=on_path)  # asked for: no fallback
    assert found is None and "--llama-server" in line and "\n" not in line
    (tmp_path / "plain").write_text("")
    assert lp.find_server(None, env={lp.ENV: str(tmp_path / "plain")}, which=on_path)[0] is None  # not executable


def test_no_binary_is_one_line_and_runs_nothing(monkeypatch):
    monkeypatch.setenv(lp.ENV, "")
    monkeypatch.setenv("PATH", "")
    res = lp.llamacpp_rows(None, [[1, 2, 3]], max_new_tokens=8, threads=1)  # no model: nothing may touch it
    line = res.unavailable
    assert res.server is None and res.settings == () and res.best is None
    assert line.startswith("llama.cpp: no llama-server found") and lp.ENV in line and "--llama-server" in line
    assert "\n" not in line
    assert report.markdown_lines(res) == [line, ""] and report.summary_line(res) == line
    assert report.result_to_dict(res)["unavailable"] == line


# -- the best setting --------------------------------------------------------------------------------------
def _done(name: str, kind: str, ms: float, differs=(None, None), error=None) -> lp.SettingResult:
    c = Completion((1, 2), 2, ms, 3, 1.0, drafted=4, accepted=3)
    return lp.SettingResult(lp.Setting(name, kind, ()), (c, c), tuple(differs), error)


def test_the_fastest_identical_speculative_setting_is_chosen_and_a_differing_one_never_wins():
    rows = [_done("plain", lp.PLAIN, 1.0),  # fastest of all, but not speculative
            _done("draft q4_0 n=8", lp.DRAFT, 2.0, differs=(None, 5)),  # faster, but differs on prompt 1
            _done("ngram 3/8", lp.NGRAM, 3.0, error="ngram 3/8: llama-server exited"),  # failed
            _done("draft q8_0 n=4", lp.DRAFT, 5.0), _done("ngram 3/4", lp.NGRAM, 4.0),
            _done("export a", lp.EXPORT, 2.5)]  # a profile's export is its own row, not llama.cpp's own setting
    assert lp.choose_best(rows) == "ngram 3/4"
    assert lp.choose_best(rows[:3]) is None
    assert rows[1].first_mismatch(["mt:1", "he:2"]) == "prompt he:2, token 5" and not rows[1].ok
    assert rows[3].tokens_per_s == pytest.approx(1000 * 4 / 10.0)
    assert rows[3].tokens_per_s_with_prompt == pytest.approx(1000 * 4 / 12.0)
    assert rows[3].acceptance == pytest.approx(6 / 8)
    res = lp.LlamaCppResult(server="/bin/llama-server", settings=tuple(rows), best=lp.choose_best(rows),
                            target="target-f32.gguf", threads=2, context=256, max_new_tokens=2, prompts=2)
    text = "\n".join(report.markdown_lines(res, labels=["mt:1", "he:2"], baseline_tokens_per_s=100.0))
    assert "| ngram 3/4 (chosen) |" in text and "DIFFERS (prompt he:2, token 5)" in text
    assert "FAILED: ngram 3/8: llama-server exited" in text and "no (output differs)" in text
    summary = report.summary_line(res)  # the terminal's line: what differs, and what failed and why
    assert "best ngram 3/4" in summary and "differs: draft q4_0 n=8" in summary
    assert summary.endswith("; ngram 3/8 failed: llama-server exited")
    server_died = [_done(n, k, 1.0, error=f"{n}: llama-server exited (status 3): boom")
                   for n, k in (("plain", lp.PLAIN), ("export a", lp.EXPORT))]  # one reason, said once
    assert report.summary_line(dataclasses.replace(res, settings=tuple(server_died), best=None)) == \
        "llama.cpp (server timings): plain, export a failed: llama-server exited (status 3): boom"
    assert lp.first_difference([1, 2, 3], [1, 2, 3]) is None and lp.first_difference([1, 9], [1, 2]) == 1
    assert lp.first_difference([1, 2], [1, 2, 3]) == 2  # stopped early


# -- the whole grid, against a stand-in server -------------------------------------------------------------
# A stand-in llama-server: answers /health and /completion on --host/--port. Its output is a function of the
# prompt, except that settings with a draft model change token 1 (so they differ from the reference) while they
# report the fastest timings; $FAKE_FAIL names a spec type it refuses to start with ($FAKE_DEAD: every setting,
# plain too). It logs each request.
FAKE = textwrap.dedent('''\
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    argv = sys.argv[1:]
    flag = lambda name, default=None: argv[argv.index(name) + 1] if name in argv else default
    spec = flag("--spec-type", "")
    fail = os.environ.get("FAKE_FAIL")
    if os.environ.get("FAKE_DEAD") or fail and fail in spec:
        print("error: invalid argument: " + spec, file=sys.stderr)
        sys.exit(1)
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass
        def send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self.send({"status": "ok"})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with open(os.environ["FAKE_LOG"], "a") as f:
                f.write(json.dumps({"argv": argv, "body": body}) + "\\n")
            n = body["n_predict"]
            tokens = [(sum(body["prompt"]) + j) % 50 for j in range(n)]
            if os.environ.get("FAKE_ANSWERS"):  # {prompt ids as JSON: HF greedy's tokens}, as llama.cpp computes
                with open(os.environ["FAKE_ANSWERS"]) as f:
                    tokens = json.load(f)[json.dumps(body["prompt"])][:n]
                n = len(tokens)
            timings = {"prompt_n": len(body["prompt"]), "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": 4.0 * n}
            if "draft-simple" in spec:
                tokens[1] += 1
                timings["predicted_ms"] = 1.0 * n
            if spec:
                timings.update(draft_n=n, draft_n_accepted=n // 2, predicted_ms=timings["predicted_ms"] / 2)
            self.send({"tokens": tokens, "timings": timings, "stop_type": "limit"})
    HTTPServer((flag("--host"), int(flag("--port"))), Handler).serve_forever()
''')


def _reference(prompts, n):
    return [[(sum(p) + j) % 50 for j in range(n)] for p in prompts]


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    server = _executable(tmp_path / "llama-server", f"#!{sys.executable}\n{FAKE}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv("http_proxy", "http://192.0.2.1:9")  # loopback requests must not go through a proxy
    return server


def _requests(tmp_path):
    return [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]


def test_a_setting_runs_in_a_server_of_its_own_and_a_dead_one_is_a_one_line_error(fake_server, tmp_path,
                                                                                    monkeypatch):
    prompts = [[3, 4, 5], [9, 9]]
    setting = lp.Setting("ngram 3/4", lp.NGRAM, tuple(lp.spec_args(ngram=(3, 4))))
    r = lp.run_setting(str(fake_server), tmp_path / "t.gguf", setting, prompts, _reference(prompts, 6),
                       max_new_tokens=6, threads=1, context=256, log=tmp_path / "s.log", start_timeout=60)
    assert r.error is None and r.ok and r.identical == 2 and r.drafted == 12 and r.accepted == 6
    sent = _requests(tmp_path)
    assert [q["body"]["prompt"] for q in sent] == [[3, 4, 5], [3, 4, 5], [9, 9]]  # the warm-up, then each prompt
    assert sent[0]["body"]["n_predict"] == 6 and sent[1]["body"]["temperature"] == 0.0
    assert sent[1]["argv"][sent[1]["argv"].index("--host") + 1] == "127.0.0.1"
    monkeypatch.setenv("FAKE_FAIL", "ngram")
    r = lp.run_setting(str(fake_server), tmp_path / "t.gguf", setting, prompts, _reference(prompts, 6),
                       max_new_tokens=6, threads=1, context=256, log=tmp_path / "s.log", start_timeout=60)
    assert not r.ok and r.completions == () and "\n" not in r.error
    assert r.error.startswith("ngram 3/4: llama-server exited (status 1): error: invalid argument: ngram-simple")
    r = lp.run_setting(str(tmp_path / "absent"), tmp_path / "t.gguf", setting, prompts, _reference(prompts, 6),
                       max_new_tokens=6, threads=1, context=256, log=tmp_path / "s.log", start_timeout=60)
    assert r.error.startswith("ngram 3/4: cannot start")


@pytest.fixture(scope="module")
def bpe_sm(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("bpe") / "ckpt"
    model = _bpe_checkpoint(ckpt)
    return SkippableModel(model, None, name=str(ckpt)), ckpt


def test_the_ggufs_are_written_once_per_weights(bpe_sm, tmp_path):
    import gguf

    sm, ckpt = bpe_sm
    target, drafts = lg.write_ggufs(sm, ckpt, cache=tmp_path)
    assert target.parent == lg.gguf_cache(sm, cache=tmp_path) and sm.weights_fingerprint in target.parent.name
    assert set(drafts) == {"q8_0", "q4_0"}
    kinds = {name: {t.name: t.tensor_type.name for t in gguf.GGUFReader(p).tensors}
             for name, p in (("target", target), *drafts.items())}
    assert set(kinds["target"].values()) == {"F32"}  # the model at full precision, head included
    for name, ggml in (("q8_0", "Q8_0"), ("q4_0", "Q4_0")):
        assert kinds[name]["blk.0.attn_q.weight"] == kinds[name]["output.weight"] == ggml
    stamps = {p: p.stat().st_mtime_ns for p in (target, *drafts.values())}
    again = lg.write_ggufs(sm, ckpt, cache=tmp_path)
    assert again == (target, drafts) and {p: p.stat().st_mtime_ns for p in stamps} == stamps  # reused, not rewritten
    assert sorted(p.name for p in target.parent.iterdir()) == ["draft-q4_0.gguf", "draft-q8_0.gguf", "target-f32.gguf"]
    with pytest.raises(ConfigError, match="no GGUF self-draft 'q2_k'"):
        lg.write_ggufs(sm, ckpt, drafts=("q2_k",), cache=tmp_path)


def test_the_whole_grid_runs_and_a_faster_differing_setting_is_not_chosen(fake_server, bpe_sm, tmp_path):
    sm, ckpt = bpe_sm
    prompts = [[3, 4, 5, 3, 4], [9, 9, 8]]
    lookup = _profile(sm, "ngram", min_n=2, max_n=2)
    done = []
    res = lp.llamacpp_rows(sm, prompts, max_new_tokens=6, threads=1, server=str(fake_server),
                           reference=_reference(prompts, 6), checkpoint=ckpt, profiles=[("lookup", lookup)],
                           export_dirs=[tmp_path / "no-export"],
                           drafts=("q8_0",), n_max=(2, 4), cache=tmp_path / "cache", start_timeout=60,
                           on_setting=lambda name, i, n: done.append(name))
    names = [r.setting.name for r in res.settings]
    assert names[-1] == "export no-export" and "cannot read the llama.cpp export" in res.settings[-1].error
    names = names[:-1]
    assert done == names == ["plain", "draft q8_0 n=2", "draft q8_0 n=4", "ngram 3/2", "ngram 3/4",
                             "ngram 3/2 + draft q8_0 n=2", "ngram 3/4 + draft q8_0 n=4", "spec-default (ngram-mod)",
                             "export lookup"]
    by = {r.setting.name: r for r in res.settings}
    assert all(r.error is None for r in res.settings[:-1])
    assert by["draft q8_0 n=2"].differs_at == (1, 1) and by["plain"].ok and by["ngram 3/2"].ok
    assert by["draft q8_0 n=2"].tokens_per_s > by["ngram 3/2"].tokens_per_s  # faster, and differs:
    assert res.best in ("ngram 3/2", "ngram 3/4", "spec-default (ngram-mod)")  # never chosen
    export = by["export lookup"].setting
    assert export.args[:2] == ("--spec-type", "ngram-simple") and export.note == "exact"
    sent = _requests(tmp_path)
    models = {q["argv"][q["argv"].index("-m") + 1] for q in sent}
    assert models == {str(lg.gguf_cache(sm, cache=tmp_path / "cache") / "target-f32.gguf")}  # one target for all
    assert res.target == "target-f32.gguf" and res.prompts == 2 and res.context == 256
    doc = report.result_to_dict(res)
    assert json.loads(json.dumps(doc)) == doc and doc["best"] == res.best
    assert doc["settings"][1]["differs_at"] == [1, 1]


def test_a_server_that_cannot_decode_plainly_runs_no_other_setting(fake_server, bpe_sm, tmp_path, monkeypatch):
    """Plain decoding is the baseline every setting is measured against; a server that fails it (here it exits at
    start; one that hangs waits out start_timeout) would fail every setting as slowly, so the grid stops there."""
    sm, ckpt = bpe_sm
    monkeypatch.setenv("FAKE_DEAD", "1")
    res = lp.llamacpp_rows(sm, [[3, 4, 5]], max_new_tokens=4, threads=1, server=str(fake_server),
                           reference=_reference([[3, 4, 5]], 4), checkpoint=ckpt, drafts=("q8_0",), n_max=(2,),
                           cache=tmp_path / "cache", start_timeout=60)
    assert [r.setting.name for r in res.settings] == ["plain"] and res.best is None
    assert "llama-server exited (status 1): error: invalid argument" in res.settings[0].error
    assert report.summary_line(res).startswith("llama.cpp (server timings): plain failed: llama-server exited")


def test_only_the_kinds_asked_for_run(fake_server, bpe_sm, tmp_path):
    sm, ckpt = bpe_sm
    res = lp.llamacpp_rows(sm, [[3, 4, 5]], max_new_tokens=4, threads=1, server=str(fake_server),
                           reference=_reference([[3, 4, 5]], 4), checkpoint=ckpt, kinds=(lp.PLAIN,),
                           export_dirs=[tmp_path / "no-export"], cache=tmp_path / "cache", start_timeout=60)
    assert [r.setting.name for r in res.settings] == ["plain"] and res.settings[0].ok and res.best is None
    assert [p.name for p in lg.gguf_cache(sm, cache=tmp_path / "cache").iterdir()] == ["target-f32.gguf"]
    # no speculative setting ran, so the line says none was found equal only where some ran
    assert report.summary_line(res).endswith("plain " + report._f(res.settings[0].tokens_per_s, 1) + " tokens/s")


# -- a real llama-server, when there is one --------------------------------------------------------------
@pytest.mark.skipif(lp.find_server(None)[0] is None, reason="no llama-server (--llama-server, $SKIPSEARCH_LLAMA_SERVER "
                    "or PATH)")
def test_a_real_llama_server_decodes_plain_as_hf_greedy(real_sm, encode_offline, tmp_path_factory):
    from skipsearch.engine.decoding import hf_generate

    prompts = [ids for _, ids in encode_offline(real_sm, "mtbench,humaneval", n=2)]
    want = [hf_generate(real_sm, ids, max_new_tokens=8) for ids in prompts]
    res = lp.llamacpp_rows(real_sm, prompts, max_new_tokens=8, threads=torch.get_num_threads(), kinds=(lp.PLAIN,),
                           cache=tmp_path_factory.mktemp("gguf"))
    (plain,) = res.settings
    assert plain.error is None, plain.error
    assert [list(c.tokens) for c in plain.completions] == [list(w) for w in want]
    assert plain.ok and plain.tokens_per_s is not None


# -- inside `skipsearch bench --peers llama.cpp` ---------------------------------------------------------
@pytest.fixture
def bench_ckpt(tmp_path, monkeypatch):
    """A tiny BPE checkpoint to bench by directory (through the loader, as the CLI loads a model); the GGUF cache in
    tmp_path."""
    ckpt = tmp_path / "ckpt"
    _bpe_checkpoint(ckpt)
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    return ckpt


BENCH = ["--dataset", "humaneval", "--n-prompts", "2", "--max-new-tokens", "6", "--threads", "1", "--device", "cpu",
         "--dtype", "float32"]


def _bench(ckpt, tmp_path, *args):
    from typer.testing import CliRunner

    from skipsearch.cli import app

    md, js = tmp_path / "bench.md", tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "--model", str(ckpt), *BENCH, "--report", str(md), "--json-out", str(js),
                                      *args])
    return result, (md.read_text() if md.exists() else ""), (json.loads(js.read_text()) if js.exists() else None)


def test_bench_without_a_llama_server_says_so_in_one_line_and_succeeds(bench_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv(lp.ENV, "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server anywhere
    result, md, doc = _bench(bench_ckpt, tmp_path, "--peers", "hf-greedy,llama.cpp", "--sweep-prompts", "0")
    assert result.exit_code == 0, result.output
    line = lp.find_server(None)[1]
    assert line.startswith("llama.cpp: no llama-server found")
    assert line in result.stdout and f"## llama.cpp\n\n{line}\n" in md
    assert doc["llama.cpp"]["unavailable"] == line and doc["llama.cpp"]["settings"] == []
    assert [r["method"] for r in doc["rows"]] == ["hf-greedy", "skipsearch-ar"]  # the bench's own rows still ran


def test_bench_without_llama_cpp_has_no_section_and_its_flags_need_the_peer(bench_ckpt, tmp_path):
    from conftest import assert_one_line_error

    result, md, doc = _bench(bench_ckpt, tmp_path, "--peers", "hf-greedy", "--sweep-prompts", "0")
    assert result.exit_code == 0, result.output
    assert doc["llama.cpp"] is None and "## llama.cpp" not in md and "llama.cpp" not in result.stdout
    for written in ("bench.md", "bench.json"):  # so that the errors below are the ones the options make
        (tmp_path / written).unlink()
    assert_one_line_error(_bench(bench_ckpt, tmp_path, "--llama-settings", "plain")[0], "need --peers llama.cpp")
    assert_one_line_error(_bench(bench_ckpt, tmp_path, "--peers", "hf-greedy,llama.cpp", "--llama-settings",
                                 "plain,lookahead")[0], "unknown llama.cpp setting 'lookahead'")
    assert_one_line_error(_bench(bench_ckpt, tmp_path, "--peers", "hf-warp")[0], "llama.cpp")  # among the choices


def _answers(ckpt, tmp_path, max_new_tokens: int) -> Path:
    """HF greedy's output on every prompt the bench decodes (its bench and sweep prompts), keyed by the prompt's ids,
    for the stand-in server to answer with."""
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import hf_generate
    from skipsearch.model.loader import load_model

    sm = load_model(str(ckpt), device="cpu", dtype="float32")
    prompts = [*load_prompts("humaneval", split="heldout", n=2, seed=0),
               *load_prompts("humaneval", split="calib", n=1, seed=0)]
    ids = [encode_prompt(sm.tokenizer, p) for p in prompts]
    path = tmp_path / "answers.json"
    path.write_text(json.dumps({json.dumps(i): list(hf_generate(sm, i, max_new_tokens=max_new_tokens)) for i in ids}))
    return path


def test_bench_runs_llama_cpp_after_its_rows_and_keeps_the_sweep_rule(fake_server, bench_ckpt, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("FAKE_ANSWERS", str(_answers(bench_ckpt, tmp_path, 6)))
    result, md, doc = _bench(bench_ckpt, tmp_path, "--peers", "hf-greedy,llama.cpp", "--llama-server",
                             str(fake_server), "--sweep-prompts", "1")
    assert result.exit_code == 0, result.output
    llama = doc["llama.cpp"]
    # the sweep: the speculative settings of the default grid on the calib prompt; the draft ones differ there
    sweep = {s["name"]: s for s in llama["sweep"]["settings"]}
    assert set(sweep) == {"draft q8_0 n=4", "ngram 3/4", "ngram 3/4 + draft q8_0 n=4"}
    assert sweep["ngram 3/4"]["differs_at"] == [None] and sweep["draft q8_0 n=4"]["differs_at"] == [1]
    assert llama["sweep"]["best"] == "ngram 3/4"
    # the bench prompts: plain and the chosen setting only, each equal to HF greedy's row
    assert [s["name"] for s in llama["settings"]] == ["plain", "ngram 3/4"] and llama["best"] == "ngram 3/4"
    assert all(s["differs_at"] == [None, None] and s["error"] is None for s in llama["settings"])
    assert llama["prompts"] == 2 and llama["max_new_tokens"] == 6
    sent = _requests(tmp_path)
    bench_ids = [json.loads(k) for k in json.loads((tmp_path / "answers.json").read_text())][:2]
    assert [q["body"]["prompt"] for q in sent[-3:]] == [bench_ids[0], *bench_ids]  # warm-up, then the same ids
    chosen = next(ln for ln in md.splitlines() if ln.startswith("| ngram 3/4 (chosen) |"))
    assert chosen.endswith("| 2/2 |") and "## llama.cpp" in md
    assert "### llama.cpp sweep" in md and "DIFFERS (prompt 0, token 1)" in md
    summary = next(ln for ln in result.stdout.splitlines() if ln.startswith("llama.cpp (server timings)"))
    assert "best ngram 3/4" in summary
    assert "warning: llama.cpp draft q8_0 n=4 output differs from hf-greedy" in result.stderr


def test_a_llama_cpp_output_that_differs_is_flagged_and_bench_still_exits_0(fake_server, bench_ckpt, tmp_path,
                                                                            monkeypatch):
    # bench exits 0 when one of its own rows differs from HF greedy (the report is the result): llama.cpp's too
    monkeypatch.setenv("FAKE_ANSWERS", str(_answers(bench_ckpt, tmp_path, 6)))
    result, md, doc = _bench(bench_ckpt, tmp_path, "--peers", "hf-greedy,llama.cpp", "--llama-server",
                             str(fake_server), "--llama-settings", "plain,draft q4_0 n=2", "--sweep-prompts", "1")
    assert result.exit_code == 0, result.output
    llama = doc["llama.cpp"]
    assert llama["sweep"] is None  # one speculative setting: nothing to choose among
    assert [s["name"] for s in llama["settings"]] == ["plain", "draft q4_0 n=2"] and llama["best"] is None
    assert llama["settings"][1]["differs_at"] == [1, 1]
    labels = [p["prompt_id"] for p in doc["prompts"] if p["method"] == "hf-greedy"]
    assert f"DIFFERS (prompt {labels[0]}, token 1)" in md and "no (output differs)" in md
    assert f"warning: llama.cpp draft q4_0 n=2 output differs from hf-greedy (prompt {labels[0]}, token 1)" in \
        result.stderr
    (written,) = (tmp_path / "cache" / "llama.cpp").iterdir()  # the GGUFs these settings need, no other
    assert sorted(p.name for p in written.iterdir()) == ["draft-q4_0.gguf", "target-f32.gguf"]


def test_an_int8_targets_llama_cpp_target_is_the_model_at_q8_0_written_from_its_fp32_weights(tmp_path):
    import gguf

    from skipsearch.kernels.lowbit import check_lowbit
    from skipsearch.model.loader import load_model

    try:
        check_lowbit()
    except ConfigError as exc:
        pytest.skip(str(exc))
    ckpt = tmp_path / "ckpt"
    _bpe_checkpoint(ckpt)
    sm = load_model(str(ckpt), device="cpu", dtype="float32", precision="int8")
    assert lg.target_type(sm) == "q8_0"
    target, drafts = lg.write_ggufs(sm, ckpt, drafts=("q4_0",), cache=tmp_path / "cache")
    assert target.name == "target-q8_0.gguf" and set(drafts) == {"q4_0"}
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(target).tensors}
    assert kinds["blk.0.attn_q.weight"] == kinds["output.weight"] == "Q8_0"


# -- llama.cpp's target in the model's exact blocks (--llama-target exact) ----------------------------------
def _as_blocks(weight: torch.Tensor, ggml: str) -> torch.Tensor:
    """``weight``'s values rounded to ``ggml``'s blocks by gguf's own quantizer and read back: fp32 values that those
    blocks give back exactly, as a model converted from such a GGUF holds."""
    import gguf

    kind = gguf.GGMLQuantizationType[ggml]
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(weight.numpy(), kind), kind).copy())


@pytest.mark.parametrize("ggml", ["Q4_0", "Q4_1", "Q8_0", "BF16", "F32"])
def test_an_exact_tensor_is_the_fewest_bytes_that_give_back_every_fp32_bit(ggml):
    import gguf

    from skipsearch.export.gguf_draft import exact_tensor

    torch.manual_seed(0)
    w = torch.randn(64, 96) * 0.05
    w = w if ggml == "F32" else _as_blocks(w, ggml) + 0.0  # + 0.0: as a GGUF model's conversion holds its zeros
    kind, data = exact_tensor(w)
    assert kind == ggml  # Q4_1 values are not taken for Q8_0's, nor bf16 values for F32
    back = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind]).reshape(w.shape)
    if ggml == "Q4_0":  # gguf decodes d (8 - 8) as -0.0 where d < 0: the same value
        assert (back.view(np.int32) == np.float32(-0.0).view(np.int32)).any()
        back = back + np.float32(0.0)
    assert np.array_equal(back.view(np.int32), w.numpy().view(np.int32))  # every bit, the sign of zero too
    bytes_per_weight = {"Q4_0": 18 / 32, "Q4_1": 20 / 32, "Q8_0": 34 / 32, "BF16": 2, "F32": 4}[ggml]
    assert data.nbytes == w.numel() * bytes_per_weight


def test_the_exact_target_holds_the_models_weights_in_their_blocks_and_the_rest_f32(tmp_path):
    import gguf

    from skipsearch.export.gguf_draft import reorder_rotary

    ckpt = tmp_path / "ckpt"
    model = _bpe_checkpoint(ckpt)
    with torch.no_grad():  # one linear of Q4_1 values, one of bf16 values, the (tied) embedding of Q8_0 values
        q = model.model.layers[0].self_attn.q_proj
        q.weight.copy_(_as_blocks(q.weight.detach(), "Q4_1"))
        up = model.model.layers[1].mlp.up_proj
        up.weight.copy_(up.weight.to(torch.bfloat16).float())
        emb = model.get_input_embeddings()
        emb.weight.copy_(_as_blocks(emb.weight.detach(), "Q8_0"))
    sm = SkippableModel(model, None, name=str(ckpt))
    assert lg.target_type(sm, "exact") == "exact"
    path, drafts = lg.write_ggufs(sm, ckpt, drafts=(), cache=tmp_path / "cache", target="exact")
    assert path.name == "target-exact.gguf" and drafts == {}
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    kinds = {name: t.tensor_type.name for name, t in tensors.items()}
    assert kinds["blk.0.attn_q.weight"] == "Q4_1" and kinds["blk.1.ffn_up.weight"] == "BF16"
    assert kinds["token_embd.weight"] == "Q8_0"
    assert kinds["output.weight"] == ("Q8_0" if model.config.tie_word_embeddings else "F32")
    assert kinds["blk.0.attn_k.weight"] == kinds["blk.0.attn_norm.weight"] == "F32"  # random values; a norm
    attn_q = tensors["blk.0.attn_q.weight"]
    back = gguf.quants.dequantize(attn_q.data, attn_q.tensor_type)
    want = reorder_rotary(q.weight.detach().numpy(), model.config.num_attention_heads)
    assert np.array_equal(back.view(np.int32), want.view(np.int32))  # the rotary rows' order, then every bit
    counts = lg.tensor_types(path)
    assert sum(counts.values()) == len(tensors) and counts["Q4_1"] == 1 and list(counts)[0] == "F32"


def test_an_exact_llama_cpp_target_is_checked_against_its_own_plain_decoding(fake_server, bpe_sm, tmp_path):
    sm, ckpt = bpe_sm
    prompts = [[3, 4, 5, 3, 4], [9, 9, 8]]
    hf = _reference(prompts, 6)
    hf[1] = [t + 1 for t in hf[1]]  # HF greedy differs from llama.cpp's plain decoding on the second prompt
    res = lp.llamacpp_rows(sm, prompts, max_new_tokens=6, threads=1, server=str(fake_server), reference=hf,
                           checkpoint=ckpt, drafts=(), kinds=(lp.PLAIN, lp.NGRAM), n_max=(4,),
                           cache=tmp_path / "cache", start_timeout=60, target="exact")
    assert res.target == "target-exact.gguf" and res.kind == "exact" and dict(res.types)["F32"] > 0
    assert res.checked_against == "llama.cpp's plain decoding of its target" and res.plain_as_hf == 1
    assert all(r.ok for r in res.settings) and res.best == "ngram 3/4"  # each equal to plain's output
    line = report.summary_line(res)
    assert line.startswith("llama.cpp, exact target (server timings): plain ") and "HF greedy on 1/2 prompts" in line
    doc = report.result_to_dict(res)
    assert doc["target_kind"] == "exact" and doc["plain_equal_to_hf_greedy"] == 1 and "F32" in doc["target_types"]
    md = "\n".join(report.markdown_lines(res))
    assert "the values skipsearch's panel kernel holds, in its blocks" in md and "F32 x" in md


def test_llama_cpp_targets_are_checked_before_the_model_loads(bench_ckpt, tmp_path):
    from conftest import assert_one_line_error

    from skipsearch.bench.llamacpp_bench import parse_targets

    assert parse_targets(None, "native") == () and parse_targets("exact, f32,exact", "native") == ("exact", "f32")
    assert parse_targets("q8_0", "int8") == ("q8_0",)
    with pytest.raises(ConfigError, match="no llama.cpp target 'q2_k'"):
        parse_targets("q2_k", "native")
    with pytest.raises(ConfigError, match="for the int8 target is q8_0, not exact"):
        parse_targets("exact", "int8")
    assert_one_line_error(_bench(bench_ckpt, tmp_path, "--llama-target", "exact")[0], "need --peers llama.cpp")
    assert_one_line_error(_bench(bench_ckpt, tmp_path, "--peers", "hf-greedy,llama.cpp", "--llama-target",
                                 "f16")[0], "no llama.cpp target 'f16'")


def test_bench_runs_llama_cpp_on_each_target_asked_for(fake_server, bench_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ANSWERS", str(_answers(bench_ckpt, tmp_path, 6)))
    result, md, doc = _bench(bench_ckpt, tmp_path, "--peers", "hf-greedy,llama.cpp", "--llama-server",
                             str(fake_server), "--llama-settings", "plain,ngram 3/4", "--llama-target", "f32,exact",
                             "--sweep-prompts", "0")
    assert result.exit_code == 0, result.output
    first, (second,) = doc["llama.cpp"], doc["llama.cpp targets"]
    assert (first["target"], second["target"]) == ("target-f32.gguf", "target-exact.gguf")
    assert first["checked_against"] == "HF greedy" and second["plain_equal_to_hf_greedy"] == 2
    assert [s["name"] for s in second["settings"]] == ["plain", "ngram 3/4"] and second["best"] == "ngram 3/4"
    assert "## llama.cpp on `target-f32.gguf`" in md and "## llama.cpp on `target-exact.gguf`" in md
    assert "llama.cpp, exact target (server timings)" in result.stdout
    assert "--llama-target f32,exact" in md  # the command that repeats the run
