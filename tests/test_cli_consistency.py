"""One consistent CLI: a shared option has one default and one help in every command; choices are listed; ``--json``
is JSON on stdout alone; ``bench`` exits 1 when skipsearch's output differs from HF greedy (2 stays bad input); the
exports' ``use:`` lines name the model as the engine loads it; old spellings still work with one notice."""

from __future__ import annotations

import dataclasses
import json
import shlex
from types import SimpleNamespace
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from skipsearch.cli import app, options

runner = CliRunner()


def _commands() -> dict:
    """Every command, by its path (``study show``), as click builds it."""
    out: dict = {}

    def walk(cmd, path: str) -> None:
        if hasattr(cmd, "commands"):  # a group (typer's own group class)
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            out[path] = cmd

    walk(typer.main.get_command(app), "")
    return out


def _shared(commands: dict) -> dict[str, list]:
    """Each option name shown in --help (hidden old spellings left out) -> the commands that take it."""
    seen: dict[str, list] = {}
    for path, cmd in commands.items():
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden:
                seen.setdefault(p.name, []).append((path, p))
    return {name: users for name, users in seen.items() if len(users) > 1}


def _check_one_default_and_meaning(commands: dict) -> None:
    for name, users in _shared(commands).items():
        if name in options.OWN:
            continue
        defaults = {(path, repr(p.default)) for path, p in users}
        helps = {(path, p.help) for path, p in users}
        assert len({d for _, d in defaults}) == 1, f"--{name} has several defaults: {sorted(defaults)}"
        assert len({h for _, h in helps}) == 1, f"--{name} has several meanings: {sorted(helps)}"
        assert len({tuple(p.opts) for _, p in users}) == 1, f"--{name} is spelt several ways"


def test_every_shared_option_has_one_default_and_one_meaning():
    commands = _commands()
    assert {"max_new_tokens", "n_prompts", "kernel", "dataset", "seed", "threads", "device", "dtype", "model",
            "as_json", "repeats"} <= set(_shared(commands))  # the walk sees what several commands share
    _check_one_default_and_meaning(commands)


def test_the_walk_covers_plan_s_subcommands_and_its_old_spelling():
    """``plan profile`` and ``plan hierarchical`` are walked like any command (their options placed in help panels
    keep the shared default and help), and so is the hidden command behind the old ``plan --...`` spelling."""
    commands = _commands()
    assert {"plan profile", "plan hierarchical", "plan flat"} <= set(commands) and "plan" not in commands
    shared = _shared(commands)
    for name in ("max_new_tokens", "n_prompts", "dataset", "seed", "device", "dtype", "model", "as_json", "report"):
        assert {"plan profile", "plan hierarchical"} <= {path for path, _ in shared[name]}, name
    for name in ("max_m", "max_n", "alpha", "validate"):  # declared once for plan hierarchical and the old spelling
        assert {path for path, _ in shared[name]} == {"plan hierarchical", "plan flat"}, name
    placed = {p.name: p for p in commands["plan hierarchical"].params}
    assert placed["max_new_tokens"].rich_help_panel and placed["alpha"].rich_help_panel
    assert not options.MaxNewTokens.__metadata__[0].rich_help_panel  # in_panel placed a copy, not the shared one


def test_the_walk_catches_a_second_default_and_a_second_meaning():
    """The check above can fail: a command whose --max-new-tokens defaults to 64 again, or whose --seed says
    something else, is caught."""
    def drifted(max_new_tokens: options.MaxNewTokens = 64) -> None:  # the drift the issue found
        """A command out of step."""

    def reworded(seed: Annotated[int, typer.Option(help="Which prompts.")] = options.SEED) -> None:
        """Another."""

    for odd, fragment in ((drifted, "--max_new_tokens has several defaults"),
                          (reworded, "--seed has several meanings")):
        extra = typer.Typer()
        extra.command("odd")(odd)
        extra.command("other")(lambda: None)
        with pytest.raises(AssertionError, match=fragment):
            _check_one_default_and_meaning({**_commands(), "odd": typer.main.get_command(extra).commands["odd"]})


def _help(*command: str) -> str:
    shown = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "1000"})
    assert shown.exit_code == 0, shown.output
    return " ".join(shown.stdout.replace("│", " ").split())


@pytest.mark.parametrize("command", ["decode", "optimize", "bench", "costs"])
def test_kernel_lists_its_choices_and_takes_auto_everywhere(command):
    text = _help(command)
    assert "[eager|inductor|inductor-c1|" in text and "|auto" in text and "[dtype" not in text
    assert "auto|float32|float16|bfloat16" in text
    forms = options.kernel_values(costs=command == "costs")
    assert "auto" in forms and ("fastest" in forms) == (command == "costs")


def test_choices_are_listed_in_help():
    assert "[heldout|calib|all]" in _help("bench")
    assert "[auto|two-stage|surrogate|timed]" in _help("optimize")
    assert "[hf|vllm|sglang|llama.cpp]" in _help("export")


def test_shell_completion_is_on():
    text = _help()
    assert "--install-completion" in text and "--show-completion" in text


def test_a_choice_keeps_the_librarys_own_message():
    from conftest import assert_one_line_error

    assert_one_line_error(runner.invoke(app, ["decode", "--prompt", "hi", "--kernel", "inductor-c99"]),
                          "kernel block must be one of 1, 2, 4, 8, 16 tokens, got 99")
    assert_one_line_error(runner.invoke(app, ["optimize", "--kernel", "fastest"]), "--kernel fastest")


def test_json_is_json_on_stdout_alone():
    result = runner.invoke(app, ["plan", "hierarchical", "--alpha", "0.8", "--beta", "0.7", "--c", "0.3",
                                 "--cs", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    assert isinstance(json.loads(result.stdout), dict)


# -- bench: the exit code of a mismatch, and --json / --json-out (the run itself stubbed: nothing is timed) --------
def _row(method: str, family: str, flagged: bool):
    return SimpleNamespace(method=method, family=family, flagged=flagged, ties=0, first_mismatch="prompt p1, token 3")


def _stub_bench(monkeypatch, rows):
    from skipsearch import api
    from skipsearch.bench import report as br

    report = SimpleNamespace(rows=rows, prompts=(), llama=None, llama_sweep=None, llama_more=(), batched=None,
                             vllm=None)
    monkeypatch.setattr(api, "bench_profiles", lambda options, **_: SimpleNamespace(
        report=report, profiles=(), command=("skipsearch", "bench")))
    monkeypatch.setattr(br, "rich_tables", lambda result, **_: [])
    monkeypatch.setattr(br, "summary_lines", lambda result: ["summary line"])
    monkeypatch.setattr(br, "report_json", lambda result: json.dumps(
        {"rows": [{"method": r.method, "flagged": r.flagged} for r in result.rows]}, indent=2) + "\n")


def test_bench_exits_1_when_skipsearch_output_differs_after_writing_its_report(monkeypatch, tmp_path):
    _stub_bench(monkeypatch, [_row("hf-greedy", "hf", False), _row("hf-prompt-lookup", "hf", True),
                              _row("tpe.yaml", "skipsearch", True), _row("ngram.yaml", "skipsearch", False)])
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["bench", "--json-out", str(out)])
    assert result.exit_code == 1, result.output
    assert json.loads(out.read_text())["rows"][2] == {"method": "tpe.yaml", "flagged": True}  # written first
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "tpe.yaml" in errors[0] and "hf-prompt-lookup" not in errors[0]


def test_bench_exits_0_when_only_a_peer_differs(monkeypatch):
    _stub_bench(monkeypatch, [_row("hf-greedy", "hf", False), _row("hf-early-exit", "hf", True),
                              _row("tpe.yaml", "skipsearch", False)])
    result = runner.invoke(app, ["bench", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"][1]["method"] == "hf-early-exit"  # stdout: the JSON report alone
    assert "summary line" in result.stderr and "hf-early-exit output differs" in result.stderr


def test_bench_json_path_is_the_old_spelling_of_json_out(monkeypatch, tmp_path):
    _stub_bench(monkeypatch, [_row("hf-greedy", "hf", False)])
    out = tmp_path / "old.json"
    result = runner.invoke(app, ["bench", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["rows"][0]["method"] == "hf-greedy"
    notices = [ln for ln in result.stderr.splitlines() if ln.startswith("notice: ")]
    assert len(notices) == 1 and "--json-out" in notices[0]
    assert "summary line" in result.stdout  # the old spelling keeps the old output


# -- exports: the use: line names the model as the engine loads it --------------------------------------------------
def _lookup_profile(tmp_path, name: str) -> str:
    from skipsearch.profile import load_profile, save_profile

    prof = load_profile("profiles/smollm2-135m/example.yaml")
    from skipsearch import methods

    cand = methods.get("ngram").example(prof.model.num_layers)
    from skipsearch.profile import profile_from_dict, profile_to_dict

    data = profile_to_dict(prof)
    data.update(method="ngram", method_params={**dict(cand.plain_params()), "min_n": 2, "max_n": 2},
                draft={"max_draft_tokens": 3, "exit": {"threshold": 0.0, "adaptive": False}})
    data.pop("measured", None)
    made = profile_from_dict(data)
    made = dataclasses.replace(made, model=dataclasses.replace(made.model, name=name))
    path = tmp_path / f"{name.replace('/', '_')}.yaml"
    save_profile(made, path)
    return str(path)


def _use_line(tmp_path, profile: str, engine: str, *extra: str) -> list[str]:
    out = tmp_path / f"{engine}-{len(list(tmp_path.iterdir()))}"
    result = runner.invoke(app, ["export", "--profile", profile, "--engine", engine, "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("use: ")]
    assert len(lines) == 1, result.stdout
    return shlex.split(lines[0].removeprefix("use: "))


def test_the_use_line_names_an_alias_by_its_hub_id(tmp_path):
    path = _lookup_profile(tmp_path, "llama-2-13b")
    assert _use_line(tmp_path, path, "vllm")[:3] == ["vllm", "serve", "meta-llama/Llama-2-13b-hf"]
    sglang = _use_line(tmp_path, path, "sglang", "--nearest")
    assert sglang[sglang.index("--model-path") + 1] == "meta-llama/Llama-2-13b-hf"
    llama = _use_line(tmp_path, path, "llama.cpp")
    assert llama[:3] == ["llama-server", "-m", "TARGET.gguf"] and "llama-2-13b" not in " ".join(llama)
    manifest = (tmp_path / next(p for p in tmp_path.iterdir() if p.name.startswith("llama.cpp")) / "export.yaml")
    assert "convert meta-llama/Llama-2-13b-hf to TARGET.gguf" in manifest.read_text()


def test_the_use_line_names_a_local_checkpoint_by_its_path(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = _lookup_profile(tmp_path, str(ckpt))
    assert _use_line(tmp_path, path, "vllm")[2] == str(ckpt.resolve())


def test_the_use_line_names_the_embedded_model_as_its_converted_directory_and_gguf(tmp_path):
    import importlib.util

    from skipsearch.checkpoints import EMBEDDED, cache_dir

    path = _lookup_profile(tmp_path, "smollm2-135m")
    assert _use_line(tmp_path, path, "vllm")[2] == str(cache_dir() / "models" / "smollm2-135m")
    sglang = _use_line(tmp_path, path, "sglang", "--nearest")
    assert sglang[sglang.index("--model-path") + 1] == str(cache_dir() / "models" / "smollm2-135m")
    llama = _use_line(tmp_path, path, "llama.cpp")
    spec = EMBEDDED["smollm2-135m"]
    if importlib.util.find_spec(spec.package) is not None:
        assert llama[2].endswith(spec.gguf_file)
        from pathlib import Path

        assert Path(llama[2]).is_file()  # the file llama-server loads is there, as printed
    else:
        assert llama[2] == "TARGET.gguf"


def test_costs_old_spellings_work_with_one_notice_each():
    """``costs --kernel auto`` (the timed choice, now ``fastest``) and ``--repeats`` (now ``--samples``); a bad
    figure stops the command right after, before anything loads."""
    result = runner.invoke(app, ["costs", "--kernel", "auto", "--repeats", "3", "--bandwidth", "100"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert [ln.split(" is now ")[1].split(";")[0] for ln in lines[:2]] == ["--samples", "--kernel fastest"]
    assert lines[2].startswith("error: ") and len(lines) == 3
    quiet = runner.invoke(app, ["costs", "--bandwidth", "100"])  # the default auto: no notice
    assert [ln for ln in quiet.stderr.splitlines() if ln.strip()][0].startswith("error: ")
