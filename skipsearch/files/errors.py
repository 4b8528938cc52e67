"""The one-line errors of skipsearch's files: a draft profile's (``ProfileError``) and a cost file's
(``CostsError``, a ``ProfileError``, so that whatever catches one catches both)."""

from __future__ import annotations

from skipsearch.files.yamlio import OneLineError


class ProfileError(OneLineError):
    """A profile that cannot be read, written or used. str() is one line: ``<file>: <problem>``."""


class CostsError(ProfileError):
    """A cost file that cannot be read, written or used. str() is one line: ``<file>: <problem>``."""


__all__ = ["CostsError", "ProfileError"]
