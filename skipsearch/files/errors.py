"""The one-line errors of skipsearch's files: a draft profile's (``ProfileError``, and ``NoRecordError`` for one that
keeps no record of its draft) and a cost file's (``CostsError``, a ``ProfileError``, so that whatever catches one
catches both), an output path's (``TargetError``), and an Optuna study's (``StudyError``, here so that the CLI can
name it without importing Optuna)."""

from __future__ import annotations

from skipsearch.files.yamlio import OneLineError


class ProfileError(OneLineError):
    """A profile that cannot be read, written or used. str() is one line: ``<file>: <problem>``."""


class CostsError(ProfileError):
    """A cost file that cannot be read, written or used. str() is one line: ``<file>: <problem>``."""


class TargetError(ProfileError):
    """An output path a command could not or must not write (``files.targets.check_target``): one line,
    ``<path>: <problem>``. A ProfileError, so that whatever catches a file's error catches this one too."""


class NoRecordError(ProfileError):
    """The profile keeps no record of what its draft accepts, but one can be made on the model
    (``device_replan.record_on_model``): a hand-written profile, or one written before profiles kept records."""


class StudyError(RuntimeError):
    """A study that cannot be opened, resumed or run. The message is one line for users."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


__all__ = ["CostsError", "NoRecordError", "ProfileError", "StudyError", "TargetError"]
