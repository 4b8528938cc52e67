"""The vLLM engine without vLLM: its server command, the request, the parsing of ``/v1/completions`` answers and of
``/metrics`` written from vLLM's documented shapes, and a stand-in server (a Python script answering /health,
/v1/completions and /metrics) that answers, dies, hangs or answers garbage: each a one-line ``VllmError``, the
server stopped. Where vLLM's CPU build is installed (``SKIPSEARCH_VLLM_PYTHON``: its venv's Python), a real server
decodes two prompts, identical to HF greedy in fp32."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import pytest

from skipsearch.servers import ENGINES, process
from skipsearch.servers import vllm as vs


def test_the_registry_names_each_engine_module():
    import importlib

    assert set(ENGINES) == {"llama.cpp", "vllm"}
    for module in ENGINES.values():
        assert hasattr(importlib.import_module(module), "complete")


# -- arguments and bodies ------------------------------------------------------------------------------------
def test_the_server_command_serves_one_checkpoint_on_the_loopback_with_the_export_as_its_speculative_config():
    spec = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 3, "prompt_lookup_max": 4}
    cmd = vs.server_command("/v/bin/python", "/m/smollm2", 8123, speculative=spec)
    assert cmd[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert flags["--model"] == "/m/smollm2" and flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--dtype"] == "float32" and "--no-enable-prefix-caching" in cmd
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == spec
    assert "--speculative-config" not in vs.server_command("p", "m", 1)  # plain decoding
    cmd = vs.server_command("p", "m", 1, memory_fraction=0.25)  # on a CPU: the share of memory it reserves
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.25"


def test_the_request_is_greedy_over_token_ids_and_asks_for_the_generated_ids():
    body = vs.request_body([1, 2, 3], 16)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 16 and body["temperature"] == 0.0
    assert body["return_token_ids"] is True and body["stream"] is False


def test_the_venv_openmp_runtime_is_preloaded_where_the_venv_has_one(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text("")
    assert "libiomp5" not in vs.server_env(python).get("LD_PRELOAD", "")
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    assert vs.server_env(python)["LD_PRELOAD"].split(":")[0] == str(tmp_path / "lib" / "libiomp5.so")
    # a venv's bin/python is a link to the system's interpreter: the venv's runtime, not one beside the system's
    python.unlink()
    python.symlink_to(sys.executable)
    assert vs.server_env(python)["LD_PRELOAD"].split(":")[0] == str(tmp_path / "lib" / "libiomp5.so")


def test_the_worker_binds_the_threads_asked_for_or_leaves_vllm_its_own_choice():
    assert vs.server_env("python", threads=2)["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert vs.server_env("python", threads=1)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert vs.server_env("python").get("VLLM_CPU_OMP_THREADS_BIND") == os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


ANSWER = {"id": "cmpl-1", "object": "text_completion", "model": "model",
          "choices": [{"index": 0, "text": " a b", "token_ids": [5, 9, 2], "finish_reason": "stop",
                       "prompt_token_ids": [1, 2, 3]}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}


def test_an_answer_parses_to_its_generated_ids():
    c = vs.parse_completion(ANSWER, wall_ms=12.5)
    assert c == vs.Completion((5, 9, 2), "stop", 3, 12.5)


@pytest.mark.parametrize("answer, says", [
    ([], "not a JSON object"),
    ({"error": {"message": "max_tokens too large", "type": "BadRequestError"}}, "max_tokens too large"),
    ({"choices": []}, "no single choice"),
    ({**ANSWER, "choices": [{**ANSWER["choices"][0], "token_ids": None}]}, "older than 0.10.2"),
    ({**ANSWER, "choices": [{**ANSWER["choices"][0], "token_ids": [1, "x"]}]}, "token_ids"),
    ({**ANSWER, "usage": {"prompt_tokens": -1}}, "not a count"),
])
def test_a_malformed_answer_is_one_line(answer, says):
    with pytest.raises(vs.VllmError, match=says) as e:
        vs.parse_completion(answer, wall_ms=1.0)
    assert "\n" not in str(e.value)


def test_the_spec_counters_sum_every_series_and_read_nothing_else():
    page = textwrap.dedent("""\
        # HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
        # TYPE vllm:spec_decode_num_draft_tokens_total counter
        vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="model"} 120.0
        vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="model"} 30.0
        vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="model"} 90.0
        vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 50.0
        vllm:num_requests_running{engine="0"} 1.0
        """)
    assert vs.spec_counters(page) == (150.0, 90.0)
    assert vs.spec_counters(None) == (0.0, 0.0) == vs.spec_counters("garbage without numbers x")


# -- a stand-in server ---------------------------------------------------------------------------------------
# answers /health, /v1/completions (the prompt's last id, then 7, 8, ... up to max_tokens) and /metrics; MODE
# "die" exits at the first completion, "hang" never answers it, "garbage" answers text that is not JSON
FAKE = textwrap.dedent('''\
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, mode = int(sys.argv[sys.argv.index("--port") + 1]), sys.argv[-1]
    print("stand-in vLLM on", port, flush=True)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body, kind="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/metrics":
                self._send(200, 'vllm:spec_decode_num_draft_tokens_total{engine="0"} 12.0\\n'
                                'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 9.0\\n', "text/plain")
            else:
                self._send(404, "{}")

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if mode == "die":
                print("ERROR: engine core died", flush=True)
                sys.exit(3)
            if mode == "hang":
                time.sleep(60)
            if mode == "garbage":
                return self._send(200, "<html>oops</html>", "text/html")
            ids = [req["prompt"][-1]] + list(range(7, 7 + req["max_tokens"] - 1))
            self._send(200, json.dumps({"choices": [{"token_ids": ids, "finish_reason": "length"}],
                                        "usage": {"prompt_tokens": len(req["prompt"])}}))

    server = HTTPServer(("127.0.0.1", port), H)
    if mode == "die":
        import threading
        threading.Thread(target=server.serve_forever, daemon=True).start()
        while True:
            time.sleep(0.05)
    server.serve_forever()
    ''')


def _stand_in(tmp_path, mode: str):
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE)
    port = process.free_port()
    cmd = [sys.executable, str(script), "--port", str(port), mode]
    return cmd, port, tmp_path / "server.log"


def test_a_stand_in_server_answers_and_is_stopped_after(tmp_path):
    cmd, port, log = _stand_in(tmp_path, "ok")
    with vs.serving(cmd, port, log=log, start_timeout=30, poll=0.05) as alive:
        c = vs.complete(port, [1, 2, 40], 4, timeout=10, alive=alive)
        assert c.tokens == (40, 7, 8, 9) and c.finish_reason == "length" and c.prompt_tokens == 3 and c.wall_ms > 0
        assert vs.read_spec_counters(port) == (12.0, 9.0)
    with pytest.raises(vs.VllmError, match="no answer from the vLLM server"):  # stopped on the way out
        vs.complete(port, [1], 1, timeout=2)


def test_a_server_that_dies_says_so_from_its_log_in_one_line(tmp_path):
    cmd, port, log = _stand_in(tmp_path, "die")
    with pytest.raises(vs.VllmError) as e, vs.serving(cmd, port, log=log, start_timeout=30, poll=0.05) as alive:
        vs.complete(port, [1, 2], 4, timeout=10, alive=alive)
    message = str(e.value)
    assert "\n" not in message and ("exited (status 3)" in message or "no answer" in message), message


def test_a_server_that_hangs_is_given_up_on_at_the_timeout_and_stopped(tmp_path):
    cmd, port, log = _stand_in(tmp_path, "hang")
    t = time.monotonic()
    with pytest.raises(vs.VllmError, match="no answer from the vLLM server") as e, \
            vs.serving(cmd, port, log=log, start_timeout=30, poll=0.05) as alive:
        vs.complete(port, [1, 2], 4, timeout=1.5, alive=alive)
    assert time.monotonic() - t < 30 and "\n" not in str(e.value)


def test_an_answer_that_is_not_json_is_one_line(tmp_path):
    cmd, port, log = _stand_in(tmp_path, "garbage")
    with pytest.raises(vs.VllmError, match="not JSON") as e, \
            vs.serving(cmd, port, log=log, start_timeout=30, poll=0.05) as alive:
        vs.complete(port, [1, 2], 4, timeout=10, alive=alive)
    assert "\n" not in str(e.value)


def test_a_binary_that_will_not_start_and_a_server_that_never_answers_are_one_line(tmp_path):
    with pytest.raises(vs.VllmError, match="cannot start"), \
            vs.serving([str(tmp_path / "no-such-python")], process.free_port(), log=tmp_path / "l.log"):
        pass
    quiet = [sys.executable, "-c", "import time; print('loading'); time.sleep(60)"]
    with pytest.raises(vs.VllmError, match="did not answer /health within 1 s"), \
            vs.serving(quiet, process.free_port(), log=tmp_path / "q.log", start_timeout=1, poll=0.05):
        pass


# -- the real engine, where it is installed ------------------------------------------------------------------
@pytest.mark.model
def test_a_real_vllm_server_decodes_two_prompts_as_hf_greedy_does(tmp_path):
    python = os.environ.get("SKIPSEARCH_VLLM_PYTHON")
    if not python:
        pytest.skip("vLLM is not installed here (SKIPSEARCH_VLLM_PYTHON names its venv's Python)")
    from skipsearch.checkpoints import ensure_embedded
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import hf_generate
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    prompts = [encode_prompt(sm.tokenizer, p) for p in load_prompts("mtbench,humaneval", split="heldout", n=2)]
    port = process.free_port()
    cmd = vs.server_command(python, ensure_embedded("smollm2-135m"), port, memory_fraction=0.25)
    with vs.serving(cmd, port, log=tmp_path / "vllm.log", env=vs.server_env(python)) as alive:
        got = [vs.complete(port, ids, 32, alive=alive).tokens for ids in prompts]
    assert got == [hf_generate(sm, ids, max_new_tokens=32) for ids in prompts]


def test_the_peer_serves_a_setting_warms_it_up_and_checks_every_output_against_the_reference(tmp_path):
    """bench.vllm.run_setting through the real server command, with a stand-in where vLLM's Python would be."""
    from skipsearch.bench.vllm import run_setting

    (tmp_path / "fake_vllm.py").write_text(FAKE)
    python = tmp_path / "python"  # takes vLLM's arguments and runs the stand-in with them
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake_vllm.py'} \"$@\" ok\n")
    python.chmod(0o755)
    prompts = [[1, 2, 40], [3, 41]]
    reference = [(40, 7, 8, 9), (41, 7, 8, 10)]  # the second differs at its last token
    row = run_setting(python, tmp_path / "model", "ngram 3-4 K 6", {"method": "ngram", "num_speculative_tokens": 6},
                      prompts, reference, max_new_tokens=4, log_dir=tmp_path, start_timeout=30)
    assert row.outputs == ((40, 7, 8, 9), (41, 7, 8, 9)) and (row.identical, row.prompts) == (1, 2)
    assert row.tokens == 8 and row.tokens_per_s > 0 and (row.drafted, row.accepted) == (0.0, 0.0)
    assert (tmp_path / "vllm-ngram-3-4-K-6.log").is_file()
