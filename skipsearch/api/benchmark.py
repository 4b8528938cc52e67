"""``skipsearch bench`` as a library function: check the input, load the model, bench (``bench.bench``).

``bench_profiles`` returns the report; rendering it, writing the report files and filling the profiles' measured
blocks (``bench.report.measured_updates``) are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.api.checks import check_model_arg, check_prompts_fit, profile_hardware_note, profile_paths
from skipsearch.checkpoints import ModelError
from skipsearch.config import ConfigError
from skipsearch.data import load_prompts
from skipsearch.files.targets import BENCH_JSON, BENCH_REPORT, PROFILE, check_target
from skipsearch.kernels import check_kernel, choose_kernel
from skipsearch.methods import check_kernel_fits
from skipsearch.model.placement import choose_placement
from skipsearch.model.target import NATIVE, check_precision
from skipsearch.profile import Profile, check_model, load_profile

if TYPE_CHECKING:
    from skipsearch.bench import BenchReport
    from skipsearch.bench.batched import BatchedPlan
    from skipsearch.engine.harness import Progress

DEFAULT_PEERS = "hf-greedy,hf-prompt-lookup,hf-early-exit,hf-assisted-quantized"


@dataclass(frozen=True)
class BenchOptions:
    """What ``skipsearch bench`` was asked, its options parsed (each has the CLI option's meaning)."""

    profiles: tuple[str, ...] = ()  # paths, comma-separated lists or globs (``checks.profile_paths``)
    model: str | None = None  # default: the profiles' model, else smollm2-135m
    peers: str = DEFAULT_PEERS  # comma-separated; hf-greedy always runs
    dataset: str = "mtbench,humaneval"
    split: str = "heldout"
    n_prompts: int = 16
    max_new_tokens: int = 128
    repeats: int = 1
    sweep_prompts: int = 2  # calib-split prompts each peer's knob is swept on; 0: no sweep
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    target_precision: str | None = None  # the target's (model/target.py); None: the profiles', else native
    threads: int | None = None
    kernel: str | None = None  # skipsearch's own rows run through it; None: the profiles' common kernel, else eager
    report: Path | None = None  # the Markdown report's path: checked writable here, written by the caller
    as_json: Path | None = None  # the JSON report's path, likewise
    write_measured: bool = False  # the profiles' measured blocks will be filled: checked writable here
    force: bool = False  # use profiles despite a model fingerprint mismatch
    llama_server: str | None = None  # with --peers llama.cpp: the llama-server (None: $SKIPSEARCH_LLAMA_SERVER, PATH)
    llama_settings: str | None = None  # with --peers llama.cpp: comma-separated setting names (None: a small grid)
    llama_target: str | None = None  # with --peers llama.cpp: comma-separated target GGUFs (None: the precision's)
    vllm_python: str | None = None  # with --peers vllm: the Python of vLLM's venv (None: $SKIPSEARCH_VLLM_PYTHON)
    batch_sizes: str | None = None  # comma-separated batch sizes: adds the section by batch size (one profile)
    batch_ks: str | None = None  # with batch_sizes: the fixed K to bench (None: the schedule's considered K, else 1-4)
    strict: bool = False  # with batch_sizes: stop at the first batch whose output differs from plain's


@dataclass(frozen=True)
class BenchRun:
    report: BenchReport
    profiles: tuple[tuple[str, Profile], ...]  # (path, profile) as benched
    command: tuple[str, ...]  # the command that repeats this run, for the report


def bench_profiles(
    o: BenchOptions,
    *,
    on_stage: Callable[[str, int], None] | None = None,
    on_progress: Progress | None = None,
    on_note: Callable[[str], None] | None = None,
) -> BenchRun:
    """Bench ``o.profiles`` and the HF peers on the same prompt ids (``bench.bench``). Every input is checked
    before the model loads; ``on_note`` gets a line per profile measured on other hardware."""
    import torch

    from skipsearch import bench as bn
    from skipsearch.bench import llamacpp_bench as lb
    from skipsearch.bench import vllm_bench as vb
    from skipsearch.model.loader import load_model

    # 1. everything that can be wrong with the input fails here, before the model loads
    check_model_arg(o.model)
    paths = profile_paths(o.profiles)
    profs = [(p, load_profile(p)) for p in paths]
    for target, kind, replace in ((o.report, BENCH_REPORT, o.force), (o.as_json, BENCH_JSON, o.force),
                                  *((p, PROFILE, True) for p in (paths if o.write_measured else ()))):
        if target:
            check_target(target, kind, replace=replace)  # the one overwrite rule (--write-measured asks for it)
    names = {prof.model.name for _, prof in profs}
    if len(names) > 1 or (o.model is not None and names and o.model not in names):
        raise ModelError(f"the profiles are for {', '.join(sorted(names))}; bench one model at a time")
    peers = list(dict.fromkeys(p.strip() for p in o.peers.split(",") if p.strip()))
    if (bad := next((p for p in peers if p not in (*bn.PEERS, lb.PEER, vb.PEER)), None)) is not None:
        raise ConfigError(f"unknown peer '{bad}': use {', '.join((*bn.PEERS, lb.PEER, vb.PEER))}")
    llama = _llama_plan(o, peers, profs)
    vllm = vb.VllmPlan(python=o.vllm_python, threads=o.threads) if vb.PEER in peers else None
    if vllm is None and o.vllm_python is not None:
        raise ConfigError(f"--vllm-python needs --peers {vb.PEER}")
    hf_peers = [p for p in peers if p not in (lb.PEER, vb.PEER)]
    batched = _batched_plan(o, profs)
    prompts = load_prompts(o.dataset, split=o.split, n=o.n_prompts, seed=o.seed)
    sweeping = o.sweep_prompts > 0 and (any(bn.PEERS[p].option for p in hf_peers) or llama is not None)
    sweep_set = load_prompts(o.dataset, split="calib", n=o.sweep_prompts, seed=o.seed) if sweeping else ()
    name = o.model or (names.pop() if names else "smollm2-135m")
    dtype = o.dtype or (profs[0][1].model.dtype if profs else "float32")
    theirs = {prof.model.target_precision for _, prof in profs}
    if o.target_precision is None and len(theirs) > 1:
        raise ConfigError(f"the profiles are for the {' and '.join(sorted(theirs))} targets; bench one target at a "
                          "time (--target-precision)")
    precision = o.target_precision or (theirs.pop() if theirs else NATIVE)
    device = choose_placement(o.device, dtype).device
    check_precision(precision, device=None if device == "auto" else device, dtype=dtype)
    recorded = {prof.kernel or "eager" for _, prof in profs}
    kernel = choose_kernel(o.kernel, recorded.pop() if len(recorded) == 1 else None)
    check_kernel(kernel, device)
    # every prompt fits the model's context (a megabyte is refused by its length, untokenized)
    check_prompts_fit(name, (*prompts, *sweep_set), max_new_tokens=o.max_new_tokens)
    # 2. the model, and the profiles checked against it
    if o.threads:
        torch.set_num_threads(o.threads)
    for path, prof in profs:  # before the model loads: a profile for another target, or a draft that cannot run
        check_model(prof, precision=precision, source=path)  # beside a compiled kernel, is refused in one line
        check_kernel_fits(prof.candidate, kernel, source=path)
    sm = load_model(name, device=o.device, dtype=dtype, precision=precision)
    for path, prof in profs:
        check_model(prof, num_layers=sm.num_layers, fingerprint=sm.fingerprint, force=o.force, source=path)
    for path, prof in profs:
        note = profile_hardware_note(prof, sm.device, source=path)
        if note and on_note:
            on_note(note)
    # 3. the run
    report = bn.bench(
        sm, prompts, profiles=profs, peers=hf_peers, max_new_tokens=o.max_new_tokens, repeats=o.repeats,
        sweep_prompts=sweep_set, sweep=o.sweep_prompts > 0, dataset=o.dataset, split=o.split,
        on_stage=on_stage, on_progress=on_progress, kernel=kernel, llama=llama, batched=batched, vllm=vllm,
    )
    command = _command(o, name=name, paths=paths, peers=peers, dtype=dtype, precision=precision, kernel=kernel,
                       llama=llama, batched=batched)
    return BenchRun(report, tuple(profs), tuple(command))


def _llama_plan(o: BenchOptions, peers: Sequence[str], profs):
    """What ``--peers llama.cpp`` and its options ask for (``llamacpp_bench.LlamaPlan``), checked before the model
    loads; None without the peer, whose options are then refused."""
    from skipsearch.bench import llamacpp_bench as lb

    if lb.PEER not in peers:
        if o.llama_server is not None or o.llama_settings is not None or o.llama_target is not None:
            raise ConfigError(f"--llama-server, --llama-settings and --llama-target need --peers {lb.PEER}")
        return None
    precision = o.target_precision or next(iter({p.model.target_precision for _, p in profs}), NATIVE)
    return lb.LlamaPlan(server=o.llama_server, settings=lb.parse_settings(o.llama_settings), threads=o.threads,
                        targets=lb.parse_targets(o.llama_target, precision))


def _command(o: BenchOptions, *, name: str, paths, peers, dtype: str, precision: str, kernel, llama,
             batched: BatchedPlan | None) -> list[str]:
    """The command line that reruns this bench, every choice the run made spelled out (the report prints it)."""
    command = ["skipsearch", "bench", "--model", name]
    if paths:
        command += ["--profiles", ",".join(paths)]
    command += ["--peers", ",".join(peers), "--dataset", o.dataset, "--split", o.split, "--n-prompts",
                str(o.n_prompts), "--max-new-tokens", str(o.max_new_tokens), "--repeats", str(o.repeats),
                "--sweep-prompts", str(o.sweep_prompts), "--seed", str(o.seed), "--device", o.device, "--dtype", dtype]
    command += ["--target-precision", precision] if precision != NATIVE else []
    command += ["--threads", str(o.threads)] if o.threads else []
    command += ["--kernel", kernel.label]
    command += ["--llama-server", o.llama_server] if llama and o.llama_server else []
    command += ["--llama-settings", ",".join(llama.settings)] if llama and o.llama_settings else []
    command += ["--llama-target", ",".join(llama.targets)] if llama and llama.targets else []
    command += ["--vllm-python", o.vllm_python] if o.vllm_python else []
    command += ["--batch-sizes", ",".join(map(str, batched.batch_sizes))] if batched else []
    command += ["--batch-ks", ",".join(map(str, batched.ks))] if batched and batched.ks is not None else []
    command += ["--strict"] if batched and batched.strict else []
    command += ["--report", str(o.report)] if o.report else []
    command += ["--json-out", str(o.as_json)] if o.as_json else []
    return command


def _batched_plan(o: BenchOptions, profs: list[tuple[str, Profile]]) -> BatchedPlan | None:
    """``--batch-sizes``, ``--batch-ks`` and ``--strict`` checked and read, before the model loads."""
    from skipsearch import methods
    from skipsearch.bench.batched import MAX_BATCH_SIZE, BatchedPlan, parse_sizes
    from skipsearch.files.bounds import MAX_DRAFT_TOKENS

    if o.batch_sizes is None:
        for given, option in ((o.batch_ks is not None, "--batch-ks"), (o.strict, "--strict")):
            if given:
                raise ConfigError(f"{option} goes with --batch-sizes")
        return None
    if len(profs) != 1:
        raise ConfigError(f"--batch-sizes benches one profile (its schedule and fixed K); got {len(profs)}")
    sizes = parse_sizes(o.batch_sizes, option="--batch-sizes", low=1, high=MAX_BATCH_SIZE)
    ks = None if o.batch_ks is None else parse_sizes(o.batch_ks, option="--batch-ks", low=0, high=MAX_DRAFT_TOKENS)
    path, prof = profs[0]
    if prof.method not in methods.batch_methods():  # the registry refuses it too, but only once the model is loaded
        raise ConfigError(f"--batch-sizes: method '{prof.method}' cannot decode a batch (batched decoding covers: "
                          f"{', '.join(methods.batch_methods())})")
    # Profile.schedule is issue 41's schedule key; read it where the profile reader has it (absent: no schedule)
    return BatchedPlan(profile=path, candidate=prof.candidate, batch_sizes=sizes,
                       schedule=prof.schedule, ks=ks, strict=o.strict)


__all__ = ["DEFAULT_PEERS", "BenchOptions", "BenchRun", "bench_profiles"]
