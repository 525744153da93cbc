"""Reading a user's files: one place that turns every way a file can be wrong into one line.

A scenario, a trace, a profile, a config.json: each is read whole, as UTF-8
text, up to a size cap, so a directory, a device (``/dev/zero``), a binary
file, a name too long or a Latin-1 byte is a clear ``InputError`` naming the
field, never a traceback or an unbounded read. Parsers (TOML, JSON) are wrapped
the same way, including documents nested deeply enough to exhaust Python's
recursion limit.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servelab.errors import InputError, cut, invalid

# A scenario, a config.json or a feature repo is a few KiB; traces and profiles may be
# larger. Anything past this is not what the field is for (or is /dev/zero).
MAX_TEXT_BYTES = 64 * 1024 * 1024  # 64 MiB
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # 4 MiB: scenarios, config.json, feature_repo.toml


def read_text(path: str | Path, field: str, *, max_bytes: int = MAX_TEXT_BYTES,
              what: str = "file") -> str:
    """A file's whole text, or an InputError that says what is wrong with it and the fix."""
    shown = cut(str(path))
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device (/dev/zero): never read it
            raise InputError(f"{field} = {shown}: not a regular file; "
                             f"fix: give the path of a {what}")
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{field} = {shown}: no such file; fix: check the path "
                         "(relative paths start at the scenario file, or the current "
                         "folder for a flag)") from None
    except IsADirectoryError:
        raise InputError(f"{field} = {shown}: is a folder, expected a {what}; "
                         "fix: name the file inside it") from None
    except PermissionError:
        raise InputError(f"{field} = {shown}: permission denied; "
                         "fix: make the file readable, or copy it somewhere readable") from None
    except OSError as exc:
        reason = "file name too long" if exc.errno == errno.ENAMETOOLONG else (
            exc.strerror or type(exc).__name__)
        raise InputError(f"{field} = {shown}: cannot read ({reason}); "
                         f"fix: give the path of a readable {what}") from None
    except ValueError:  # embedded NUL in the path
        raise InputError(f"{field} = {shown}: not a valid path; fix: give a file path") from None
    if len(data) > max_bytes:
        raise InputError(f"{field} = {shown}: larger than {max_bytes // (1024 * 1024)} MiB; "
                         f"fix: give a smaller {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{field} = {shown}: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                         f"offset {exc.start}); fix: save the {what} as UTF-8") from None


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text to a dict, with syntax errors and runaway nesting as one line."""
    out: dict[str, Any] = _parse(tomllib.loads, text, where, "TOML", "the tables")
    return out


def parse_json(text: str, where: str) -> Any:
    """JSON text to Python values, with syntax errors and runaway nesting as one line."""
    return _parse(json.loads, text, where, "JSON", "the document")


def _parse(loads: Callable[[str], Any], text: str, where: str, kind: str, flatten: str) -> Any:
    try:
        return loads(text)
    except ValueError as exc:  # a syntax error, or an integer of thousands of digits
        raise InputError(f"{where}: not valid {kind} ({cut(str(exc), 200)}); "
                         "fix: correct the file's syntax") from None
    except RecursionError:
        raise InputError(f"{where}: {kind} nested too deeply; fix: flatten {flatten}") from None


def check_writable_target(path: str | Path, field: str) -> Path:
    """Check, before any work, that a file can be written at `path` (its folder exists)."""
    p = Path(path)
    shown = cut(str(path))
    try:
        if p.is_dir():
            raise InputError(f"{field} = {shown}: is a folder; fix: give a file name inside it")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise InputError(f"{field} = {shown}: folder {cut(str(parent))} does not exist; "
                             "fix: create it first, or choose another path")
        if not os.access(parent, os.W_OK):
            raise InputError(f"{field} = {shown}: folder {cut(str(parent))} is not writable; "
                             "fix: choose a writable path")
    except OSError as exc:
        raise InputError(f"{field} = {shown}: not a usable path ({exc.strerror}); "
                         "fix: choose a shorter or valid path") from None
    return p


def prepare_out_dir(path: str | Path, field: str) -> Path:
    """Create the folder a command will write its results into, before any work (a
    long run must not end in a path that cannot be written)."""
    p = Path(path)
    shown = cut(str(path))
    try:
        p.mkdir(parents=True, exist_ok=True)
        if not os.access(p, os.W_OK):
            raise InputError(f"{field} = {shown}: folder is not writable; fix: choose a "
                             "writable folder")
        probe = p / ".servelab-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except FileExistsError:
        raise InputError(f"{field} = {shown}: a file is in the way (expected a folder); fix: "
                         "choose another folder name") from None
    except OSError as exc:
        raise InputError(f"{field} = {shown}: cannot create or write the folder "
                         f"({exc.strerror}); fix: choose a shorter or writable path") from None
    return p


def read_csv_columns(path: str | Path, field: str, columns: tuple[str, ...], *,
                     max_rows: int, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """Named numeric columns of a CSV (a header row, then numbers), as float64 arrays.

    Column names match case-insensitively; extra columns are ignored; `optional` columns
    are read where the header has them (absent from the result otherwise); at most
    `max_rows` rows are read (more is an error, not a silent cut)."""
    import csv
    import io

    import numpy as np

    text = read_text(path, field, what="CSV")
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader, None)
        if header is None:
            raise InputError(f"{field} = {cut(str(path))!r}: empty; expected a header row "
                             f"{','.join(columns)} and rows of numbers; fix: add them")
        where = {h.strip().lower(): i for i, h in enumerate(header)}
        missing = [c for c in columns if c not in where]
        if missing:
            raise InputError(f"{field} = {cut(str(path))!r}: columns {cut(str(header), 120)}; "
                             f"expected {', '.join(columns)}; fix: name the columns "
                             f"{','.join(columns)} (missing: {', '.join(missing)})")
        columns = columns + tuple(c for c in optional if c in where)
        idx = [where[c] for c in columns]
        rows: list[list[float]] = []
        for n, row in enumerate(reader, start=2):
            if not row or all(not x.strip() for x in row):
                continue
            if len(rows) >= max_rows:
                raise InputError(f"{field} = {cut(str(path))!r}: more than {max_rows:,} rows; "
                                 "fix: keep a representative sample")
            try:
                rows.append([float(row[i]) for i in idx])
            except (ValueError, IndexError):
                raise InputError(f"{field} = {cut(str(path))!r}: line {n} is not "
                                 f"{len(columns)} numbers ({cut(','.join(row), 80)}); "
                                 "fix: correct or drop that line") from None
    except csv.Error as exc:
        raise InputError(f"{field} = {cut(str(path))!r}: not a CSV ({cut(str(exc), 80)}); "
                         "fix: save it as comma-separated text") from None
    arr = np.array(rows, dtype=np.float64).reshape(-1, len(columns))
    return {c: arr[:, k].copy() for k, c in enumerate(columns)}


def write_text(path: str | Path, text: str, field: str) -> None:
    """Write a file a user named, or an InputError naming the flag, the path and why."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise invalid(field, cut(str(path)), "a file servelab can write",
                      f"choose another path ({exc.strerror or exc})") from None
