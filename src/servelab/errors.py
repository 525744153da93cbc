"""The one error tree servelab raises for things a user can fix.

Every message names the field, the value received, what was expected and how
to fix it, in one line, so the CLI can print it without a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ServelabError(Exception):
    """Root of every error that is the user's to fix (bad input, bad config, a store)."""


class InputError(ServelabError, ValueError):
    """A value given by the user is wrong: a scenario key, a flag, a file's contents.

    Built by `invalid`, it carries the field as the message names it (`field`, e.g.
    "[workload] qps"), the scenario key when the field is one (`key`, "workload.qps"),
    and the message after the field (`detail`), so a caller that knows the field by
    another name (a CLI flag) can say it without parsing the text.
    """

    def __init__(self, message: str, *, field: str | None = None, key: str | None = None,
                 detail: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.key = key
        self.detail = detail


class ConfigError(ServelabError):
    """The setup cannot work as described (e.g. an SLO below the physical minimum)."""


class StoreError(ServelabError):
    """A backing store (file, database, server) failed or could not be reached."""


def closest(name: str, valid: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The closest valid name to a typo, or None when nothing is close."""
    matches = difflib.get_close_matches(name, list(valid), n=1, cutoff=cutoff)
    return matches[0] if matches else None


MAX_SHOWN = 120  # characters of a user's value quoted in a message


def cut(text: str, limit: int = MAX_SHOWN) -> str:
    """A value as shown in a message: one line, at most `limit` characters."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def shown(value: Any) -> str:
    """A user's value quoted for a message, cut so an unbounded value cannot flood it."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. an int with more digits than repr allows
        text = f"<{type(value).__name__}>"
    return cut(text)


def invalid(field: str, value: Any, expected: str, fix: str) -> InputError:
    """Build the standard message: field, value, what was expected, the fix. A field
    named as a scenario key ("[section] key") carries that key ("section.key")."""
    detail = f" = {shown(value)}: expected {expected}; fix: {fix}"
    section, _, key = field.partition("] ")
    flat = (f"{section[1:]}.{key}" if section.startswith("[") and key.isidentifier()
            else None)
    return InputError(field + detail, field=field, key=flat, detail=detail)


def unknown_key(field: str, key: str, valid: Iterable[str]) -> InputError:
    """An unknown key, with the closest valid name when there is one."""
    valid = sorted(valid)
    guess = closest(key, valid) if isinstance(key, str) and len(key) < 200 else None
    hint = f"did you mean {guess!r}?" if guess else f"use one of {', '.join(valid)}"
    return InputError(
        f"{cut(field)}: unknown key {shown(key)}; expected one of {', '.join(valid)}; fix: {hint}"
    )
