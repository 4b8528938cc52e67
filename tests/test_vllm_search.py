"""``skipsearch optimize --engine vllm`` without vLLM: the grid, the ranking at each concurrency, the draft length
chosen per concurrency and written as vLLM's ``num_speculative_tokens_per_batch_size``, the record and the export
that follows it, and the whole command against a stand-in vLLM server whose speed depends on its draft length and
on the requests in flight. A schedule that lost to plain at some concurrency is never written."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from conftest import assert_one_line_error
from test_export import _profile
from test_llamacpp_peer import bpe_sm  # noqa: F401  (fixture)
from typer.testing import CliRunner

from skipsearch.api.export import export_profile
from skipsearch.bench import engine_rank as er
from skipsearch.bench import vllm_search as vs
from skipsearch.bench.vllm import VllmRow
from skipsearch.cli import app
from skipsearch.export import ExportError
from skipsearch.files.engine_runs import engine_run_to_dict, vllm_config
from skipsearch.files.errors import ProfileError
from skipsearch.profile import engine_run, load_profile, profile_to_dict, save_profile, with_engine_run

runner = CliRunner()


def _served(name: str, config: dict | None, rates: dict[int, float], *, differs: tuple[int, ...] = ()) -> vs.Served:
    """A setting's server: at each concurrency, 4 prompts of 10 tokens at ``rates[C]`` tokens/s."""
    rows = tuple(VllmRow(name, config, 40, 40_000.0 / rate, 3 if c in differs else 4, 4, concurrency=c)
                 for c, rate in rates.items())
    return vs.Served(name, er.PLAIN if config is None else vs.LOOKUP, config, rows)


K2, K4 = vs.lookup_config(2, (2, 4)), vs.lookup_config(4, (2, 4))
OTHER = vs.lookup_config(4, (3, 5))


def _passes(k4_at_2: float = 0.9) -> tuple:
    """Plain 100 tokens/s everywhere; K 4 wins alone and loses at 2 and 4; K 2 wins at 2; nothing wins at 4."""
    one = (_served("plain", None, {1: 100.0, 2: 100.0, 4: 100.0}),
           _served(vs.label(K2), K2, {1: 110.0, 2: 108.0, 4: 99.0}),
           _served(vs.label(K4), K4, {1: 130.0, 2: 100.0 * k4_at_2, 4: 80.0}),
           _served(vs.label(OTHER), OTHER, {1: 120.0, 2: 130.0, 4: 130.0}, differs=(1,)))
    return one, one[::-1]


def test_the_grid_serves_plain_then_each_lookup_at_each_k_then_an_export_the_grid_lacks():
    settings = vs.grid(ks=(2, 4), lookups=((2, 4),), exports=[("mine", K4), ("code", vs.lookup_config(6, (3, 4)))])
    assert [n for n, _, _ in settings] == ["plain", "ngram 2-4 K 2", "ngram 2-4 K 4", "code export"]
    assert vs.family(K2) == vs.family(K4) != vs.family(OTHER) and vs.family(None) is None


def test_the_k_at_each_concurrency_is_the_fastest_of_the_winner_s_lookup_that_beat_plain_there():
    passes = _passes()
    ranked = vs.ranked_at(passes, 1)
    ships, best = er.choose(ranked)
    assert ships.name == best.name == "ngram 2-4 K 4"  # the other lookup was faster at 2 and 4, but not identical
    assert vs.k_by_level(passes, ships.name, (1, 2, 4)) == ((1, 4, 1.3), (2, 2, 1.08), (4, 0, 1.0))
    assert vs.batch_ranges(((1, 4), (2, 2), (4, 0))) == [[1, 1, 4], [2, 3, 2], [4, 4, 0]]
    assert vs.batch_ranges(((1, 4), (2, 4), (4, 4))) == [[1, 4, 4], [5, 5, 0]]  # never measured past 4: K = 0
    config = vs.scheduled(K4, ((1, 4), (2, 2), (4, 0)))
    assert config["num_speculative_tokens"] == 4 and config[vs.PER_BATCH] == [[1, 1, 4], [2, 3, 2], [4, 4, 0]]
    assert vs.schedule_label(config) == "ngram 2-4 K 4@1 2@2-3 0@4+"
    assert vs.scheduled(K4, ((1, 0), (2, 0))) is None  # never drafts: plain


def test_each_concurrency_gets_its_own_k_and_the_lookup_that_gains_most_over_them_ships():
    one = (_served("plain", None, {1: 100.0, 2: 100.0, 4: 100.0}),
           _served(vs.label(K2), K2, {1: 110.0, 2: 108.0, 4: 99.0}),
           _served(vs.label(K4), K4, {1: 130.0, 2: 90.0, 4: 80.0}),
           _served(vs.label(OTHER), OTHER, {1: 99.0, 2: 130.0, 4: 125.0}))
    passes = (one, one[::-1])
    config, table = vs.best_schedule(passes, (1, 2, 4))  # 2-4 gains 0.38 over the three, 3-5 gains 0.55
    assert table == ((1, 0), (2, 4), (4, 4)) and vs.family(config) == vs.family(OTHER)
    assert config[vs.PER_BATCH] == [[1, 1, 0], [2, 4, 4], [5, 5, 0]] and config["num_speculative_tokens"] == 4
    flat = tuple((_served("plain", None, {1: 100.0}), _served(vs.label(K2), K2, {1: 101.0})) for _ in "ab")
    assert vs.best_schedule(flat, (1,)) is None  # nothing beat plain by 3% anywhere: plain


def _checked(rates: dict[int, float]) -> tuple:
    config = vs.scheduled(K4, ((1, 4), (2, 2), (4, 0)))
    one = (_served("plain", None, {1: 100.0, 2: 100.0, 4: 100.0}), _served(vs.schedule_label(config), config, rates))
    return one, one[::-1]


def _record(checked) -> object:
    return vs.engine_run(_passes(), checked, version="vllm 0.32.0", hardware="this CPU", target="m (fp32)",
                         workload="4 prompts x 10 tokens")


def test_a_schedule_ships_only_if_it_was_at_least_as_fast_as_plain_at_every_concurrency_as_it_would_ship():
    run = _record(_checked({1: 125.0, 2: 104.0, 4: 100.0}))
    assert run.kind == "lookup" and run.setting == "ngram 2-4 K 4@1 2@2-3 0@4+" and run.speedup == 1.25
    assert run.at_concurrency == ((2, 1.04), (4, 1.0)) and run.best_tried == "ngram 2-4 K 4"
    assert vllm_config(run)[vs.PER_BATCH] == [[1, 1, 4], [2, 3, 2], [4, 4, 0]]
    lost = _record(_checked({1: 125.0, 2: 104.0, 4: 97.0}))  # a measured K lost at 4: never written
    assert lost.ships_plain and lost.args == () and lost.speedup == 1.0 and lost.at_concurrency[-1] == (4, 0.97)
    assert _record(None).ships_plain and _record(None).best_tried_speedup == 1.3  # nothing checked: plain
    config = vs.scheduled(K4, ((1, 4), (2, 2), (4, 0)))
    failed = (_served("plain", None, {1: 100.0, 2: 100.0, 4: 100.0}),
              vs.Served(vs.schedule_label(config), vs.LOOKUP, config, error="the vLLM server exited at start"))
    assert _record((failed, failed[::-1])).ships_plain  # its server never answered: plain


def test_the_record_round_trips_and_the_export_writes_the_measured_schedule_or_refuses(bpe_sm, tmp_path):  # noqa: F811
    sm, _ = bpe_sm
    lookup = _profile(sm, "ngram", min_n=3, max_n=4)
    run = _record(_checked({1: 125.0, 2: 104.0, 4: 100.0}))
    path = save_profile(with_engine_run(lookup, run), tmp_path / "fast.yaml")
    assert engine_run(load_profile(path), "vllm") == run
    done = export_profile(str(path), engine="vllm", out=tmp_path / "out")
    written = json.loads((tmp_path / "out" / "speculative_config.json").read_text())
    assert written == vllm_config(run) and written[vs.PER_BATCH][-1] == [4, 4, 0]
    assert done.speedup.kind == "measured" and done.speedup.value == 1.25
    slow = save_profile(with_engine_run(lookup, _record(_checked({1: 125.0, 2: 104.0, 4: 97.0}))),
                        tmp_path / "slow.yaml")
    with pytest.raises(ExportError, match="4: 0.97x"):
        export_profile(str(slow), engine="vllm", out=tmp_path / "slow-out")
    assert not (tmp_path / "slow-out").exists()
    # a record whose args are not a speculative config: one line naming the key
    raw = profile_to_dict(load_profile(path))
    raw["measured"]["engines"]["vllm"]["args"] = ["--speculative-config", "{not json"]
    import yaml

    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match=r"measured.engines.vllm.args must be \[--speculative-config") as e:
        load_profile(tmp_path / "bad.yaml")
    assert "\n" not in str(e.value)
    raw["measured"]["engines"]["vllm"].update(args=[], kind="ngram-simple")  # llama.cpp's kind: not vLLM's
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match="kind must be one of plain, lookup"):
        load_profile(tmp_path / "bad.yaml")
    assert engine_run_to_dict(run)["args"][0] == "--speculative-config"


def test_optimize_engine_vllm_refuses_bad_input_in_one_line_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("SKIPSEARCH_VLLM_PYTHON", raising=False)
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "vllm", "--out", str(tmp_path / "a.yaml")]),
                          "vLLM is not installed here: `bash scripts/setup_engines.sh vllm`")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "vllm", "--vllm-python", str(tmp_path / "no"),
                                              "--out", str(tmp_path / "a.yaml")]), "--vllm-python")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "vllm", "--target-precision", "int8",
                                              "--out", str(tmp_path / "a.yaml")]), "its 8-bit peer is llama.cpp")
    assert_one_line_error(runner.invoke(app, ["optimize", "--vllm-python", "x"]), "go with --engine")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "llama.cpp", "--vllm-python", "x"]),
                          "--vllm-python goes with --engine vllm, not --engine llama.cpp")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "vllm", "--llama-server", "x"]),
                          "--llama-server goes with --engine llama.cpp, not --engine vllm")
    assert not list(tmp_path.glob("*.yaml"))


# A stand-in for vLLM's Python: serves /health, /metrics and /v1/completions, answering each prompt with the
# answers file's tokens, and taking per token 20 ms times a factor of its draft length K and of the requests in
# flight (K from --speculative-config, per batch size where it has a schedule): K 4 pays alone and loses with
# others in flight, K 2 pays most with 2 and 4 (K 3 runs as K 2). K 6 and above have no factor: the request fails,
# and the search goes on.
STAND_IN = textwrap.dedent('''\
    import json, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    argv = sys.argv
    port = int(argv[argv.index("--port") + 1])
    spec = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else {}
    answers = {tuple(json.loads(k)): v for k, v in json.load(open(ANSWERS)).items()}
    FACTOR = {(0, 1): 1.0, (0, 2): 1.0, (0, 4): 1.0, (2, 1): 0.8, (2, 2): 0.5, (2, 4): 0.6,
              (4, 1): 0.4, (4, 2): 1.6, (4, 4): 2.0}
    lock, flight = threading.Lock(), [0]

    def k_at(n):
        for start, end, k in spec.get("num_speculative_tokens_per_batch_size", []):
            if start <= n <= end:
                return k
        if spec.get("num_speculative_tokens_per_batch_size"):
            return spec["num_speculative_tokens_per_batch_size"][-1][2]
        return spec.get("num_speculative_tokens", 0)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, body, kind="application/json"):
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send("" if self.path == "/health" else "# no counters\\n", "text/plain")

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                flight[0] += 1
            time.sleep(0.02)  # the requests sent at once have all arrived
            with lock:
                n = flight[0] if flight[0] <= 2 else 4
            tokens = answers[tuple(req["prompt"])][:req["max_tokens"]]
            time.sleep(0.02 * len(tokens) * FACTOR[(min(k_at(n), 6) if k_at(n) != 3 else 2, n if n <= 2 else 4)])
            with lock:
                flight[0] -= 1
            self._send(json.dumps({"choices": [{"token_ids": tokens, "finish_reason": "length"}],
                                   "usage": {"prompt_tokens": len(req["prompt"])}}))

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    ''')


def test_optimize_engine_vllm_ships_the_winner_s_k_per_concurrency_against_a_stand_in_server(
        bpe_sm, tmp_path, monkeypatch):  # noqa: F811
    from skipsearch.engine.decoding import hf_generate

    sm, ckpt = bpe_sm
    ids = [[5, 9, 12, 5, 9], [7, 3, 7, 3, 7, 3]]  # the model has no tokenizer: these are the prompts' ids
    monkeypatch.setattr("skipsearch.data.encode_all_within", lambda *a, **k: ids)
    monkeypatch.setattr("skipsearch.model.loader.load_model", lambda *a, **k: sm)
    monkeypatch.setattr("skipsearch.checkpoints.ensure_embedded", lambda name: ckpt)
    monkeypatch.setattr("skipsearch.api.engine_search.check_prompts_fit", lambda *a, **k: None)
    monkeypatch.setattr(vs, "server_version", lambda python: "vllm stand-in")
    answers = {json.dumps(list(p)): list(hf_generate(sm, p, max_new_tokens=6)) for p in ids}
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    script = tmp_path / "stand_in.py"
    script.write_text(f"ANSWERS = {str(tmp_path / 'answers.json')!r}\n" + STAND_IN)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(0o755)
    result = runner.invoke(app, ["optimize", "--engine", "vllm", "--model", "smollm2-135m", "--n-prompts", "2",
                                 "--max-new-tokens", "6", "--threads", "1", "--vllm-python", str(python),
                                 "--concurrency", "2,4", "--out", str(tmp_path / "v.yaml")])
    assert result.exit_code == 0, result.output
    run = engine_run(load_profile(tmp_path / "v.yaml"), "vllm")
    assert run.setting == "ngram 2-4 K 4@1 2@2-4 0@5+"
    assert vllm_config(run)[vs.PER_BATCH] == [[1, 1, 4], [2, 4, 2], [5, 5, 0]]
    # as it would ship: at least as fast as plain at every concurrency (the stand-in makes it 1.6-2.5x on a quiet
    # machine; the margins leave room for a busy one)
    assert run.identical == run.prompts == 2 and run.speedup > 1.3 and all(r >= 1.0 for _, r in run.at_concurrency)
    out = result.stdout
    assert [line.split()[0] for line in out.splitlines() if line.endswith("in flight:")] == ["1", "2", "4"]
    table = out[out.index("1 request in flight:"):out.index("2 requests in flight:")]
    assert [line.split("  ")[0] for line in table.splitlines()[2:]] == ["plain", "ngram 2-4 K 4", "ngram 2-4 K 2",
                                                                        "ngram 2-4 K 6"]
    assert "no answer from the vLLM server" in table.splitlines()[-1]  # K 6 failed; the search went on
    assert "vllm ships ngram 2-4 K 4@1 2@2-4 0@5+" in out
    assert (tmp_path / "v-logs" / "vllm-plain.log").is_file()


def _stand_in_python(tmp_path, answers: dict) -> object:
    (tmp_path / "answers.json").write_text(json.dumps({json.dumps(list(k)): list(v) for k, v in answers.items()}))
    script = tmp_path / "stand_in.py"
    script.write_text(f"ANSWERS = {str(tmp_path / 'answers.json')!r}\n" + STAND_IN)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_bench_s_vllm_peer_serves_plain_and_each_profile_s_vllm_setting_against_hf_greedy(bpe_sm, tmp_path,  # noqa: F811
                                                                                         monkeypatch):
    from skipsearch.bench import report as br
    from skipsearch.bench import vllm_bench as vb

    sm, ckpt = bpe_sm
    monkeypatch.setattr("skipsearch.checkpoints.ensure_embedded", lambda name: ckpt)
    monkeypatch.setattr(vs, "server_version", lambda python: "vllm stand-in")
    ids = [[5, 9, 12, 5, 9], [7, 3, 7, 3, 7, 3]]
    answers = {tuple(ids[0]): [1, 2, 3, 4], tuple(ids[1]): [5, 6, 7, 8]}
    python = _stand_in_python(tmp_path, answers)
    lookup = _profile(sm, "ngram", min_n=3, max_n=4)
    fast = with_engine_run(lookup, _record(_checked({1: 125.0, 2: 104.0, 4: 100.0})))
    slow = with_engine_run(lookup, _record(_checked({1: 125.0, 2: 104.0, 4: 97.0})))
    reference = [[1, 2, 3, 4], [5, 6, 7, 9]]  # the second prompt's last token differs from what the server says
    result = vb.bench_vllm(sm, vb.VllmPlan(python=str(python), log_dir=str(tmp_path / "logs")), ids, reference,
                           max_new_tokens=4, threads=1,
                           profiles=[("own.yaml", lookup), ("fast.yaml", fast), ("slow.yaml", slow),
                                     ("skip.yaml", _profile(sm, "layer-skip"))])
    names = [r.setting for r in result.rows]
    assert names == ["plain", "own export", "fast (vLLM's measured ngram 2-4 K 4@1 2@2-3 0@4+)"]
    assert result.row("own export").speculative == {"method": "ngram", "num_speculative_tokens":
                                                    lookup.draft.max_draft_tokens, "prompt_lookup_min": 3,
                                                    "prompt_lookup_max": 4}
    assert result.rows[2].speculative[vs.PER_BATCH] == [[1, 1, 4], [2, 3, 2], [4, 4, 0]]
    assert all((r.identical, r.prompts) == (1, 2) for r in result.rows)
    assert any(n.startswith("slow: vLLM measured nothing faster") for n in result.notes)
    assert not any(n.startswith("skip:") for n in result.notes)  # its export is plain: vLLM's plain row
    md = "\n".join(vb.markdown_lines(result, baseline_tokens_per_s=10.0))
    assert "| plain | none |" in md and "no (output differs)" in md and "measured.engines.vllm" in md
    line = vb.summary_line(result)
    assert line.startswith("vllm (vllm stand-in, client wall time): plain") and "DIFFERS on 1" in line
    doc = vb.result_to_dict(result)
    assert [s["name"] for s in doc["settings"]] == names and doc["settings"][1]["source"] == "export --engine vllm"
    assert br.upgrade({"format": br.JSON_FORMAT, "version": 6, "summary": {}})["vllm"] is None
    # an int8 target: vLLM serves the fp32 checkpoint, so it is no peer of it; one line, and the bench goes on
    from types import SimpleNamespace

    int8 = vb.bench_vllm(SimpleNamespace(name="m", target_precision="int8"), vb.VllmPlan(python=str(python)), ids,
                         reference, max_new_tokens=4, threads=1)
    assert int8.rows == () and "not the int8 target" in int8.unavailable
    # no vLLM here: one line, and the bench goes on
    monkeypatch.delenv("SKIPSEARCH_VLLM_PYTHON", raising=False)
    gone = vb.bench_vllm(sm, vb.VllmPlan(), ids, reference, max_new_tokens=4, threads=1)
    assert gone.unavailable.startswith("vllm: vLLM is not installed here") and "\n" not in gone.unavailable


def test_bench_s_vllm_peer_stops_at_a_server_that_cannot_decode_plainly(bpe_sm, tmp_path, monkeypatch):  # noqa: F811
    """A vLLM that dies at start fails plain decoding, the baseline; every profile's export would fail after it as
    slowly (a server that hangs waits out its start timeout each time), so the peer stops there, saying why."""
    from skipsearch.bench import vllm_bench as vb

    sm, ckpt = bpe_sm
    monkeypatch.setattr("skipsearch.checkpoints.ensure_embedded", lambda name: ckpt)
    monkeypatch.setattr(vs, "server_version", lambda python: "vllm stand-in")
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'RuntimeError: no CPU backend' >&2\nexit 4\n")
    python.chmod(0o755)
    ids = [[5, 9, 12, 5, 9]]
    result = vb.bench_vllm(sm, vb.VllmPlan(python=str(python), log_dir=str(tmp_path / "logs")), ids, [[1, 2, 3, 4]],
                           max_new_tokens=4, threads=1, profiles=[("own.yaml", _profile(sm, "ngram", min_n=3,
                                                                                           max_n=4))])
    assert result.rows == () and [name for name, _ in result.errors] == ["plain"]
    assert "no CPU backend" in result.errors[0][1] and "\n" not in result.errors[0][1]
    assert vb.summary_line(result) == f"vllm (vllm stand-in, client wall time): plain failed: {result.errors[0][1]}"
