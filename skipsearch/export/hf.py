"""``--engine hf``: a profile as a transformers ``custom_generate`` directory.

transformers' convention (``GenerationMixin.load_custom_generate``, transformers 5.x): a directory holding
``custom_generate/generate.py`` with a module-level ``generate(model, ...)`` and, optionally,
``custom_generate/requirements.txt``; ``model.generate(..., custom_generate=DIR, trust_remote_code=True)`` runs
that function instead of its own loop (a local directory needs ``trust_remote_code`` too). transformers copies
``generate.py`` into its modules cache before importing it, so the file cannot find a profile beside itself: the
profile's text is carried in it (and written beside it as ``profile.yaml``, for people and for re-exporting).
Every profile is expressible: the generate function runs skipsearch's own engine (``hf_runtime``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from skipsearch.export.base import Engine, Written, batch_one_note, served_model, write_text
from skipsearch.files.yamlio import Dumper
from skipsearch.profile import Profile, profile_to_dict

USAGE = """\
from transformers import AutoModelForCausalLM, AutoTokenizer
model_id = {model!r}
model, tok = AutoModelForCausalLM.from_pretrained(model_id), AutoTokenizer.from_pretrained(model_id)
out = model.generate(**tok("def fib(n):", return_tensors="pt"), custom_generate={dir!r}, trust_remote_code=True,
                     max_new_tokens=64)
print(tok.decode(out[0]))
"""  # model_id: as transformers loads it (export.base.served_model), never skipsearch's alias


def profile_text(profile: Profile) -> str:
    """The profile as the YAML a profile file holds."""
    body = yaml.dump(profile_to_dict(profile), Dumper=Dumper, sort_keys=False, allow_unicode=True)
    return f"# skipsearch draft profile (schema v{profile.schema_version})\n{body}"


def generate_py(profile: Profile, text: str) -> str:
    """The ``custom_generate/generate.py`` that decodes with ``profile`` (whose YAML is ``text``)."""
    sha = hashlib.sha256(text.encode()).hexdigest()
    name = f"{profile.method}, K={profile.draft.max_draft_tokens}, for {profile.model.name}"
    return (
        f'"""A skipsearch draft profile ({name}) inside transformers\' generate: written by `skipsearch export\n'
        f'--engine hf`. The profile is PROFILE below (sha256 {sha[:16]}), the same as ../profile.yaml."""\n\n'
        "from skipsearch.export.hf_runtime import generate_with_profile\n\n\n"
        "def generate(model, input_ids=None, **kwargs):\n"
        '    """transformers calls this with generate\'s arguments; it returns the sequences, prompt included."""\n'
        '    return generate_with_profile(model, input_ids, profile_text=PROFILE, source="custom_generate profile '
        f'({profile.model.name}, {profile.method})", **kwargs)\n\n\n'
        f"PROFILE = {text!r}\n"
    )


def requirements_txt() -> str:
    """What transformers checks before it runs generate.py (``check_python_requirements``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = f"skipsearch>={version('skipsearch')}"
    except PackageNotFoundError:
        ours = "skipsearch"
    return f"{ours}\ntransformers>=4.56\n"  # custom_generate directories: transformers 4.56 and later


def write(directory: Path, profile: Profile, model=None) -> Written:
    """The ``custom_generate`` directory for ``profile`` in ``directory`` (which exists)."""
    text = profile_text(profile)
    (directory / "custom_generate").mkdir(exist_ok=True)
    files = (
        write_text(directory, "custom_generate/generate.py", generate_py(profile, text)),
        write_text(directory, "custom_generate/requirements.txt", requirements_txt()),
        write_text(directory, "profile.yaml", text),
        write_text(directory, "README.md", readme(profile, directory)),
    )
    return Written(files, {"custom_generate": str(directory), "method": profile.method,
                           "max_draft_tokens": profile.draft.max_draft_tokens}, _usage(profile, directory),
                   batch_one_note(profile, "HF generate (custom_generate)"))


def _usage(profile: Profile, directory: Path) -> str:
    return USAGE.format(model=served_model(profile).hf, dir=str(directory))


def readme(profile: Profile, directory: Path) -> str:
    # the custom_generate tag is what the Hub looks for when the directory is pushed as a repository
    return ("---\ntags:\n- custom_generate\n---\n\n"
            f"# skipsearch draft profile for {profile.model.name} ({profile.method})\n\n"
            "Decodes inside transformers' `generate` with skipsearch's engine; greedy output is the model's own.\n\n"
            f"```python\n{_usage(profile, directory)}```\n\nNeeds `pip install skipsearch` where it runs.\n")


ENGINE = Engine(
    name="hf",
    describe=lambda p: f"custom_generate running {p.method} (K={p.draft.max_draft_tokens}) in transformers' generate",
    gap=lambda _p: None,
    write=write,
    checked="decoded here with transformers' generate (tests: identical greedy output to plain generate)",
)

__all__ = ["ENGINE", "generate_py", "profile_text", "requirements_txt", "write"]
