"""The serving engines skipsearch starts and times on this machine, one module each behind the same small interface:
``server_command`` (or the engine's own argument builders), ``serving`` (start it, wait until it answers, stop it in
``finally``), ``complete`` (one greedy completion of token ids: the tokens and the timings the engine gives) and
``parse_completion``. The process, the port and the HTTP are ``process.py``'s, shared.

- ``llamacpp``: llama.cpp's ``llama-server`` (its ``/completion``: the engine's own prompt and decode timings);
- ``vllm``: vLLM's OpenAI server from a venv of its own (``/v1/completions``: the client's wall time).

No torch here: these modules only start programs and speak HTTP.
"""

from __future__ import annotations

ENGINES = {"llama.cpp": "skipsearch.servers.llamacpp", "vllm": "skipsearch.servers.vllm"}  # name -> module
