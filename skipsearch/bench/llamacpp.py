"""llama.cpp as a bench peer: ``llama-server`` over a small grid of its own speculative settings, on the prompt
token ids the bench's rows decode, each output checked against HF greedy's token for token.

llama.cpp is the engine CPU users run. The target is the model itself as an all-F32 GGUF (``gguf_draft`` with
every sublayer and the head at full precision), so that llama.cpp computes with the weights HF computes with; the
self-drafts are the same model at Q8_0 and Q4_0 (``gguf_draft`` at int8 / int4, LM head included, the token
embedding F32). They are written once, into a cache directory keyed by the weights' fingerprint.

The settings, with flags as the llama.cpp vendored in llama-cpp-python 0.3.36 spells them (``common/arg.cpp``;
``export/llamacpp.py`` writes the same ones), each over draft lengths N (2, 4, 8 by default):
- ``plain``: no ``--spec-type``;
- ``draft``: ``--spec-type draft-simple -md DRAFT.gguf --spec-draft-n-max N --spec-draft-n-min 0
  --spec-draft-p-min 0`` (p-min 0: greedy verification keeps the output whatever the draft proposes); besides the
  self-drafts of every layer, a **shallow** self-draft (``Shallow``): a layer-skip draft as a GGUF of its own, the
  model's kept whole layers at one GGML type (llama.cpp has no form for a skipped sublayer), at its own lengths;
- ``ngram``: ``--spec-type ngram-simple --spec-ngram-simple-size-n S --spec-ngram-simple-size-m N
  --spec-ngram-simple-min-hits 1``;
- ``ngram+draft``: both, ``--spec-type ngram-simple,draft-simple`` (llama.cpp drafts with the n-gram first and with
  the draft model where the n-gram finds nothing);
- ``default``: what ``--spec-default`` sets (``ngram-mod``, match 24, 48 to 64 tokens), spelled out;
- ``export``: a profile's own ``skipsearch export --engine llama.cpp`` flags (``llama-args.txt``).

Each setting runs in a llama-server of its own on 127.0.0.1 (a free port; loopback only), ``-np 1``, ``-t
THREADS``, one context size for every setting; requests are greedy (temperature 0, top-k 1) with ``n_predict`` =
max_new_tokens and the prompt as token ids, after one warm-up request. Tokens/s are the server's own figures
(``timings``): predicted tokens over predicted milliseconds, summed over the prompts, and the same with the prompt's
milliseconds added (the bench's own tokens/s include the prefill). The best setting is the fastest speculative one
whose output equals HF greedy's on every prompt; a setting that differs (or fails) is reported and never chosen.

The binary is ``--llama-server PATH``, else ``$SKIPSEARCH_LLAMA_SERVER``, else ``llama-server`` on PATH. One
command builds it from the llama.cpp vendored in llama-cpp-python's sdist (``build/bin/llama-server``)::

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz \\
      && cd llama_cpp_python-0.3.36/vendor/llama.cpp && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
      -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
      -DLLAMA_BUILD_SERVER=ON && ninja -C build llama-server
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from skipsearch.bench.llamacpp_ggufs import (
    F32,
    Shallow,
    gguf_source,
    target_type,
    tensor_types,
    write_ggufs,
    write_shallow,
)
from skipsearch.config import ConfigError
from skipsearch.export.gguf_draft import DRAFT_SCHEMES
from skipsearch.servers.llamacpp import Completion, LlamaCppError, complete, free_port, serving

ENV = "SKIPSEARCH_LLAMA_SERVER"
BINARY = "llama-server"
FAMILY = "llama.cpp"  # the rows' family beside bench's "hf" and "skipsearch"

PLAIN, DRAFT, NGRAM, BOTH, DEFAULT, EXPORT = "plain", "draft", "ngram-simple", "ngram+draft", "default", "export"
KINDS = (PLAIN, DRAFT, NGRAM, BOTH, DEFAULT, EXPORT)
SPECULATIVE = (DRAFT, NGRAM, BOTH, DEFAULT)  # the kinds "best" is chosen among: llama.cpp's own speculation


# -- finding the binary ------------------------------------------------------------------------------------
def find_server(explicit: str | None = None, *, env: Mapping[str, str] | None = None,
                which: Callable[[str], str | None] = shutil.which) -> tuple[str | None, str | None]:
    """(the llama-server to run, None) or (None, one line saying why there is none)."""
    env = os.environ if env is None else env
    for given, where in ((explicit, "--llama-server"), (env.get(ENV) or None, f"${ENV}")):
        if given is None:
            continue
        path = Path(given).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path), None
        found = which(given) if os.sep not in given else None
        if found:
            return found, None
        return None, f"{FAMILY}: {where} {given} is not an executable llama-server"
    found = which(BINARY)
    if found:
        return found, None
    return None, (f"{FAMILY}: no llama-server found (give --llama-server PATH, set ${ENV}, or put {BINARY} on "
                  "PATH; the skipsearch.bench.llamacpp docstring has the one command that builds it)")


# -- the settings, as llama-server arguments ---------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One llama-server configuration: its row label and the flags that select it."""

    name: str  # the row label, unique in a run: "draft q8_0 n=4", "ngram 3/4", ...
    kind: str  # one of KINDS
    args: tuple[str, ...]  # flags after the common ones (model, host, port, threads, context)
    note: str = ""  # for people: where an export's flags came from and what it could not express
    draft_layers: tuple[int, ...] | None = None  # a shallow self-draft's kept layers (None: every layer)

    @property
    def flags(self) -> str:
        """The flags for a row, GGUF paths shortened to their file names."""
        return " ".join(Path(a).name if a.endswith(".gguf") else a for a in self.args) or "(no --spec-type)"


def draft_args(gguf: str | os.PathLike, n_max: int) -> list[str]:
    return ["-md", str(gguf), "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]


def ngram_args(size_n: int, size_m: int) -> list[str]:
    return ["--spec-ngram-simple-size-n", str(size_n), "--spec-ngram-simple-size-m", str(size_m),
            "--spec-ngram-simple-min-hits", "1"]


def spec_args(*, ngram: tuple[int, int] | None = None, draft: tuple[str | os.PathLike, int] | None = None) -> list[str]:
    """``--spec-type`` and its settings: an n-gram lookup (size n, size m), a draft model (GGUF, n-max), or both (the
    n-gram first, as ``common_speculative_init`` orders them and as ``export/llamacpp.py`` writes them)."""
    types, out = [], []
    if ngram is not None:
        types.append("ngram-simple")
        out += ngram_args(*ngram)
    if draft is not None:
        types.append("draft-simple")
        out += draft_args(*draft)
    if not types:
        raise ConfigError("a speculative llama.cpp setting needs an n-gram, a draft model or both")
    return ["--spec-type", ",".join(types), *out]


def default_args() -> list[str]:
    """What llama-server's ``--spec-default`` sets (``common/arg.cpp``), spelled out flag by flag."""
    return ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-min", "48",
            "--spec-ngram-mod-n-max", "64"]


def grid(*, drafts: Mapping[str, str | os.PathLike] | None = None, n_max: Sequence[int] = (2, 4, 8),
         ngram_n: Sequence[int] = (3,), exports: Sequence[Setting] = (),
         kinds: Collection[str] = KINDS, names: Collection[str] | None = None,
         shallow: Mapping[Shallow, str | os.PathLike] | None = None,
         shallow_n: Sequence[int] = (2, 4)) -> tuple[Setting, ...]:
    """Every setting to run, plain first: each draft GGUF (name -> path) and n-gram size at each draft length, each
    shallow self-draft (-> its GGUF) alone at each of ``shallow_n``; only those named in ``names`` where given
    (e.g. plain and a best setting chosen on other prompts)."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ConfigError(f"unknown llama.cpp setting kind {sorted(unknown)[0]!r}: use {', '.join(KINDS)}")
    drafts = drafts or {}
    out = [Setting(PLAIN, PLAIN, ())] if PLAIN in kinds else []
    if DRAFT in kinds:
        out += [Setting(f"draft {d} n={n}", DRAFT, tuple(spec_args(draft=(p, n)))) for d, p in drafts.items()
                for n in n_max]
        out += [Setting(f"draft {sh.name} n={n}", DRAFT, tuple(spec_args(draft=(p, n))), draft_layers=sh.layers)
                for sh, p in (shallow or {}).items() for n in shallow_n]
    if NGRAM in kinds:
        out += [Setting(f"ngram {s}/{n}", NGRAM, tuple(spec_args(ngram=(s, n)))) for s in ngram_n for n in n_max]
    if BOTH in kinds:
        out += [Setting(f"ngram {s}/{n} + draft {d} n={n}", BOTH, tuple(spec_args(ngram=(s, n), draft=(p, n))))
                for s in ngram_n for d, p in drafts.items() for n in n_max]
    if DEFAULT in kinds:
        out.append(Setting("spec-default (ngram-mod)", DEFAULT, tuple(default_args())))
    if EXPORT in kinds:
        out += exports
    made = [s.name for s in out]
    if len(set(made)) != len(made):
        raise ConfigError(f"two llama.cpp settings are named {next(n for n in made if made.count(n) > 1)!r}")
    if names is not None:
        missing = sorted(set(names) - set(made))
        if missing:
            raise ConfigError(f"no llama.cpp setting named {missing[0]!r} in this grid")
        out = [s for s in out if s.name in names]
    return tuple(out)


def export_setting(directory: str | os.PathLike, *, label: str | None = None, note: str = "") -> Setting:
    """The flags a ``skipsearch export --engine llama.cpp`` directory holds (``llama-args.txt``)."""
    from skipsearch.export.llamacpp import ARGS

    path = Path(directory) / ARGS
    try:
        args = shlex.split(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the llama.cpp export {path}: {e}") from None
    return Setting(f"export {label or Path(directory).name}", EXPORT, tuple(args), note or str(path))


def profile_setting(label: str, profile, directory: Path, model: Callable[[], tuple]) -> Setting:
    """``profile`` exported for llama.cpp into ``directory`` as ``skipsearch export`` writes it: the setting llama.cpp
    itself measured fastest where the profile records one (``optimize --engine llama.cpp``), plain decoding where
    it measured nothing faster (the export refuses then), else the profile's own setting (its nearest where
    llama.cpp cannot express it, as ``--nearest`` writes it); ``model()`` gives (adapter, checkpoint) for a draft
    GGUF."""
    from skipsearch.export import llamacpp
    from skipsearch.export.base import plain
    from skipsearch.profile import engine_run

    directory.mkdir(parents=True, exist_ok=True)
    run = engine_run(profile, FAMILY)
    if run is not None and run.ships_plain:
        llamacpp.write(directory, plain(profile), model)
        return export_setting(directory, label=label, note="llama.cpp measured nothing faster than its plain "
                                                           "decoding: the export refuses, plain decoding")
    if run is not None and run.replaces_own:
        llamacpp.write_run(directory, run, model)
        return export_setting(directory, label=label, note=f"measured on llama.cpp: {run.setting}")
    gap = llamacpp.gap(profile)
    llamacpp.write(directory, gap.nearest if gap else profile, model)
    return export_setting(directory, label=label, note=f"nearest: {gap.what} not expressible" if gap else "exact")


def server_command(server: str, target: str | os.PathLike, setting_args: Sequence[str], *, port: int, threads: int,
                   context: int, slots: int = 1) -> list[str]:
    """The llama-server command line: loopback only, ``slots`` slots (one by default) of ``context`` positions each
    (llama-server shares ``-c`` out among its slots), ``threads`` threads."""
    return [server, "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-c", str(context * slots), "-np", str(slots), *setting_args]


def context_size(prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, draft: int = 64) -> int:
    """One context for every setting: the longest prompt, the new tokens and room for a draft beyond them,
    rounded up to 256."""
    need = max(map(len, prompt_ids), default=0) + max_new_tokens + draft
    return -(-need // 256) * 256


# -- results -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SettingResult:
    """One setting on every prompt: the server's completions and each output against HF greedy's."""

    setting: Setting
    completions: tuple[Completion, ...] = ()  # one per prompt, in order
    differs_at: tuple[int | None, ...] = ()  # per prompt: None where identical, else the first differing token
    error: str | None = None  # one line: why the setting did not run to the end
    concurrency: int = 1  # requests in flight at once (one slot each)
    wall_seconds: float | None = None  # from the first request sent to the last answer, with concurrency > 1

    @property
    def throughput(self) -> float | None:
        """Generated tokens over wall seconds, every request in flight counted: what a server with several
        requests at once delivers. At concurrency 1, the server's own rate with the prompt's time included."""
        if self.wall_seconds is None:
            return self.tokens_per_s_with_prompt
        return sum(c.predicted_n for c in self.completions) / self.wall_seconds if self.wall_seconds > 0 else None

    @property
    def identical(self) -> int:
        return sum(d is None for d in self.differs_at)

    @property
    def ok(self) -> bool:
        """Ran on every prompt and equals HF greedy on each."""
        return self.error is None and bool(self.completions) and self.identical == len(self.completions)

    @property
    def tokens_per_s(self) -> float | None:
        """The server's decode rate: predicted tokens over predicted seconds, summed over prompts."""
        ms = sum(c.predicted_ms for c in self.completions)
        return 1000 * sum(c.predicted_n for c in self.completions) / ms if ms > 0 else None

    @property
    def tokens_per_s_with_prompt(self) -> float | None:
        """Predicted tokens over predicted plus prompt seconds (the bench's own rows count the prefill)."""
        ms = sum(c.predicted_ms + c.prompt_ms for c in self.completions)
        return 1000 * sum(c.predicted_n for c in self.completions) / ms if ms > 0 else None

    @property
    def drafted(self) -> int:
        return sum(c.drafted for c in self.completions)

    @property
    def accepted(self) -> int:
        return sum(c.accepted for c in self.completions)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def first_mismatch(self, labels: Sequence[str] | None = None) -> str | None:
        for i, d in enumerate(self.differs_at):
            if d is not None:
                return f"prompt {labels[i] if labels else i}, token {d}"
        return None


@dataclass(frozen=True)
class LlamaCppResult:
    """The llama.cpp peer in one bench run: every setting tried, and the best speculative one."""

    server: str | None  # the binary that ran; None: none found
    unavailable: str | None = None  # one line where nothing ran (no binary, a GGUF that cannot be written)
    settings: tuple[SettingResult, ...] = ()
    best: str | None = None  # choose_best's pick; None: no speculative setting equal to HF greedy everywhere
    target: str = ""  # the target GGUF's file name
    # what each setting's output was checked against: HF greedy's (an F32 target: the same model), or, for a target
    # in llama.cpp's own arithmetic over blocks (exact: the same weights; Q8_0: another 8-bit model), llama.cpp's own
    # plain decoding of it
    checked_against: str = "HF greedy"
    kind: str = F32  # the target's kind (llamacpp_ggufs.TARGETS)
    types: tuple[tuple[str, int], ...] = ()  # the target GGUF's tensors by GGML type: (("Q4_1", 210), ...)
    plain_as_hf: int | None = None  # of a target checked against its own plain decoding: prompts where plain's
    # output equals HF greedy's (None: not compared)
    threads: int = 0
    context: int = 0
    max_new_tokens: int = 0
    prompts: int = 0

    def setting(self, name: str) -> SettingResult | None:
        return next((s for s in self.settings if s.setting.name == name), None)


def choose_best(results: Sequence[SettingResult], *, kinds: Collection[str] = SPECULATIVE) -> str | None:
    """The fastest setting of ``kinds`` whose output equals HF greedy's on every prompt; a setting that differs or
    failed is never chosen. None when no setting qualifies."""
    clean = [(r.tokens_per_s, r.setting.name) for r in results
             if r.setting.kind in kinds and r.ok and r.tokens_per_s is not None]
    return max(clean, key=lambda t: t[0])[1] if clean else None


def first_difference(got: Sequence[int], want: Sequence[int]) -> int | None:
    """None where equal token for token; else the first index where they differ (or where one ends)."""
    from skipsearch.engine.harness import first_difference as first

    return None if tuple(got) == tuple(want) else first(got, want)


# -- running -----------------------------------------------------------------------------------------------
def run_setting(server: str, target: str | os.PathLike, setting: Setting, prompt_ids: Sequence[Sequence[int]],
                reference: Sequence[Sequence[int]], *, max_new_tokens: int, threads: int, context: int,
                log: str | os.PathLike, start_timeout: float = 300.0, request_timeout: float = 600.0,
                concurrency: int = 1) -> SettingResult:
    """``setting`` in a llama-server of its own: one warm-up request, then every prompt once; with ``concurrency``
    C > 1, a server of C slots with C requests in flight at once, timed by the wall clock. A server that fails to
    start, dies or answers badly gives a result with a one-line ``error``, not an exception."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    port = free_port()
    cmd = server_command(server, target, setting.args, port=port, threads=threads, context=context,
                         slots=concurrency)
    done: list[Completion] = []
    wall = None
    try:
        with serving(cmd, port, log=Path(log), start_timeout=start_timeout) as alive:
            # the first request pays for allocations no later one does
            complete(port, prompt_ids[0], min(8, max_new_tokens), timeout=request_timeout, alive=alive)
            if concurrency == 1:
                for ids in prompt_ids:
                    done.append(complete(port, ids, max_new_tokens, timeout=request_timeout, alive=alive))
            else:
                t0 = time.perf_counter()
                with ThreadPoolExecutor(max_workers=concurrency) as pool:
                    done = list(pool.map(lambda ids: complete(port, ids, max_new_tokens, timeout=request_timeout,
                                                              alive=alive), prompt_ids))
                wall = time.perf_counter() - t0
    except LlamaCppError as e:
        error = f"{setting.name}: {e}"
    else:
        error = None
    differs = tuple(first_difference(c.tokens, ref) for c, ref in zip(done, reference, strict=False))
    return SettingResult(setting, tuple(done), differs, error, concurrency=concurrency, wall_seconds=wall)


def _export_settings(export_dirs: Sequence[str | os.PathLike], profiles: Sequence[tuple[str, object]],
                     directory: Path, model: Callable[[], tuple]) -> tuple[list[Setting], list[SettingResult]]:
    """The export settings, and a failed row for each export that cannot be read or written (not the end of the
    bench)."""
    jobs = [(Path(d).name, lambda d=d: export_setting(d)) for d in export_dirs]
    jobs += [(label, lambda i=i, label=label, p=p: profile_setting(label, p, directory / f"export-{i}", model))
             for i, (label, p) in enumerate(profiles)]
    made, failed = [], []
    for label, make in jobs:
        try:
            made.append(make())
        except (ConfigError, OSError) as e:
            failed.append(SettingResult(Setting(f"export {label}", EXPORT, ()), error=f"export {label}: {e}"))
    return made, failed


def _files(sm, checkpoint, *, kind: str, kinds: Collection[str], drafts: Sequence[str], shallow: Sequence[Shallow],
           cache) -> tuple:
    """(the checkpoint, the target GGUF of ``kind``, {draft: GGUF}, {shallow draft: GGUF}) that the settings of
    ``kinds`` need, each written once (``llamacpp_ggufs``); the checkpoint found by ``sm``'s name when None."""
    if checkpoint is None:
        from skipsearch.checkpoints import find_checkpoint

        checkpoint = find_checkpoint(sm.name).path
    path, ggufs = write_ggufs(sm, checkpoint, drafts=drafts if {DRAFT, BOTH} & set(kinds) else (), cache=cache,
                              target=kind)
    return checkpoint, path, ggufs, write_shallow(sm, checkpoint, shallow if DRAFT in kinds else (), cache=cache)


def llamacpp_rows(sm, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int, threads: int,
                  server: str | None = None, reference: Sequence[Sequence[int]] | None = None,
                  checkpoint: str | os.PathLike | None = None, profiles: Sequence[tuple[str, object]] = (),
                  export_dirs: Sequence[str | os.PathLike] = (), drafts: Sequence[str] = ("q8_0", "q4_0"),
                  n_max: Sequence[int] = (2, 4, 8), ngram_n: Sequence[int] = (3,), kinds: Collection[str] = KINDS,
                  names: Collection[str] | None = None,
                  cache: str | os.PathLike | None = None, start_timeout: float = 300.0,
                  request_timeout: float = 600.0, reverse: bool = False, concurrency: int = 1,
                  on_setting: Callable[[str, int, int], None] | None = None,
                  shallow: Sequence[Shallow] = (), target: str | None = None) -> LlamaCppResult:
    """The llama.cpp peer on ``prompt_ids``: every setting of ``grid`` (and each profile's export, each directory of
    ``export_dirs``), each output against ``reference`` (HF greedy's outputs on the same ids; decoded here when not
    given). ``profiles`` are (label, Profile) pairs; ``checkpoint`` is where ``sm`` loaded from (its tokenizer goes
    into the GGUFs; by default ``find_checkpoint(sm.name)``). ``names`` keeps only the grid settings it names (to
    run a best setting chosen on other prompts: ``result.best`` of a first call); the exports asked for by
    ``profiles`` and ``export_dirs`` run whatever it names. ``on_setting(name, index, total)`` opens each
    setting. ``shallow`` adds each shallow self-draft (kind draft, at its own lengths: ``grid``'s ``shallow_n``).
    ``concurrency`` C > 1 runs each setting with C requests in flight (C slots). ``target`` is llama.cpp's target
    GGUF (``llamacpp_ggufs.TARGETS``; None: ``target_type``'s default). ``reverse`` runs the settings in the opposite
    order, plain last (a second timed pass, so that a drift of the machine's speed does not favour the settings run
    early; a target not checked against HF greedy then needs the reference of a first pass). No binary: a result
    whose ``unavailable`` says so in one line, with nothing run."""
    import tempfile

    found, missing = find_server(server)
    if found is None:
        return LlamaCppResult(server=None, unavailable=missing)
    if not prompt_ids:
        raise ConfigError("the llama.cpp peer needs at least one prompt")
    kind = target_type(sm, target)
    same_model = kind == F32
    if reference is None and same_model:
        from skipsearch.engine.decoding import hf_generate

        reference = [hf_generate(sm, ids, max_new_tokens=max_new_tokens) for ids in prompt_ids]
    try:
        checkpoint, path, ggufs, shallow_ggufs = _files(sm, checkpoint, kind=kind, kinds=kinds, drafts=drafts,
                                                        shallow=shallow, cache=cache)
    except (ConfigError, OSError) as e:
        return LlamaCppResult(server=found, unavailable=f"{FAMILY}: cannot write the GGUFs: {e}")
    context = context_size(prompt_ids, max_new_tokens, draft=max((*n_max, 64)))
    with tempfile.TemporaryDirectory(prefix="skipsearch-llamacpp-") as tmp:
        exports, failed = _export_settings(*((export_dirs, profiles) if EXPORT in kinds else ((), ())), Path(tmp),
                                           lambda: (gguf_source(sm, checkpoint), Path(checkpoint)))
        if not same_model:  # another model's numbers: its settings are checked against its plain decoding
            kinds, names = {*kinds, PLAIN}, None if names is None else {*names, PLAIN}
        settings = grid(drafts=ggufs, n_max=n_max, ngram_n=ngram_n, exports=exports, kinds=kinds,
                        names=None if names is None else {*names, *(s.name for s in exports)},
                        shallow=shallow_ggufs)
        if reverse:
            if not same_model and reference is None:
                raise ConfigError(f"a reversed llama.cpp pass over a {kind} target needs the reference of a first pass")
            settings = settings[::-1]
        results, plain_as_hf = [], None
        for i, s in enumerate(settings):  # plain first (grid's order), or last (reverse)
            if on_setting:
                on_setting(s.name, i, len(settings))
            results.append(run_setting(found, path, s, prompt_ids, reference or (), max_new_tokens=max_new_tokens,
                                       threads=threads, context=context, log=Path(tmp) / f"server-{i}.log",
                                       start_timeout=start_timeout, request_timeout=request_timeout,
                                       concurrency=concurrency))
            if s.kind == PLAIN and not reverse and results[-1].error:
                # no baseline, and a server that cannot decode plainly (it dies at start, or never answers within
                # start_timeout) would fail every setting after it as slowly: its one error says why
                break
            if not same_model and s.kind == PLAIN and not reverse:
                if reference is not None:  # HF greedy's, given: how often llama.cpp's own arithmetic agrees with it
                    plain_as_hf = sum(d is None for d in results[-1].differs_at)
                reference = [c.tokens for c in results[-1].completions]
                if len(reference) != len(prompt_ids):
                    break  # nothing to check the others against
                results[-1] = replace(results[-1], differs_at=(None,) * len(reference))
    results += failed
    return LlamaCppResult(server=found, settings=tuple(results), best=choose_best(results), target=path.name,
                          threads=threads, context=context, max_new_tokens=max_new_tokens, prompts=len(prompt_ids),
                          checked_against="HF greedy" if same_model else "llama.cpp's plain decoding of its target",
                          kind=kind, types=tuple(tensor_types(path).items()), plain_as_hf=plain_as_hf)


__all__ = ["BINARY", "DRAFT_SCHEMES", "ENV", "FAMILY", "KINDS", "SPECULATIVE", "LlamaCppResult", "Setting",
           "SettingResult", "choose_best", "context_size", "default_args", "draft_args", "export_setting",
           "find_server", "first_difference", "grid", "llamacpp_rows", "ngram_args", "profile_setting", "run_setting",
           "server_command", "spec_args"]
