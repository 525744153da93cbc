"""Join-key values typed once, the same way for the offline join and the online read.

A key declared int32/int64 takes whole numbers: Python or NumPy integers, a float that
is a whole number (2.0, as pandas makes an int column with a gap), or text of one ("5",
as typed on a command line); never a fraction (2.9 used to read key 2 online while the
offline join found nothing), never a boolean (True read key 1). A string key takes text,
or a whole number written as text. Anything else is one line naming the key, the value
and the fix, on both paths.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from servelab.errors import InputError, cut

RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _bad(key: str, dtype: str, value: Any, why: str = "") -> InputError:
    whole = dtype in RANGES
    want = "a whole number" if whole else "text (or a whole number)"
    fix = "a whole number (no fraction, not true/false)" if whole else "text"
    return InputError(f"entity {key} = {cut(repr(value), 60)}: expected {want} (join key type "
                      f"{dtype}){why}; fix: give {key} as {fix}")


def typed_key(key: str, dtype: str, value: Any) -> Any:
    """One key value in its declared type, or InputError."""
    if dtype in RANGES:
        lo, hi = RANGES[dtype]
        if isinstance(value, bool | np.bool_):
            raise _bad(key, dtype, value)
        if isinstance(value, int | np.integer):
            n = int(value)
        elif isinstance(value, float | np.floating):
            if not (math.isfinite(value) and float(value).is_integer()):
                raise _bad(key, dtype, value)
            n = int(value)
        elif isinstance(value, str):
            try:
                n = int(value.strip())
            except ValueError:
                raise _bad(key, dtype, value) from None
        else:
            raise _bad(key, dtype, value)
        if not lo <= n <= hi:
            raise _bad(key, dtype, value, f" in {lo} to {hi}")
        return n
    if isinstance(value, str):
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return str(int(value))
    raise _bad(key, dtype, value)


def typed_key_column(key: str, dtype: str, col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column of key values in the declared type (nulls kept: such a row matches
    nothing), refused as `typed_key` refuses a value."""
    t = col.type
    if dtype in RANGES:
        target = pa.int32() if dtype == "int32" else pa.int64()
        if pa.types.is_integer(t) or pa.types.is_null(t):
            try:
                return col.cast(target)
            except (pa.ArrowInvalid, OverflowError):
                lo, hi = RANGES[dtype]
                bad = next(v for v in col.to_pylist() if v is not None and not lo <= v <= hi)
                raise _bad(key, dtype, bad, f" in {lo} to {hi}") from None
        if pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            # value by value for the few that need it; a float column of whole numbers
            # (pandas' int column with a gap) casts in one go after the check
            if pa.types.is_floating(t):
                x = col.to_numpy(zero_copy_only=False)
                x = x[~np.isnan(x)]
                ok = np.isfinite(x) & (x == np.floor(x))
                if not ok.all():
                    raise _bad(key, dtype, float(x[~ok][0]))
                lo, hi = RANGES[dtype]
                if x.size and not (lo <= x.min() and x.max() <= hi):
                    raise _bad(key, dtype, float(x.max() if x.max() > hi else x.min()),
                               f" in {lo} to {hi}")
                return pc.cast(col, target, safe=False)
            return pa.chunked_array([pa.array(
                [None if v is None else typed_key(key, dtype, v) for v in col.to_pylist()],
                target)])
        sample = next((v for v in col.to_pylist() if v is not None), None)
        raise _bad(key, dtype, sample, f" (the column is {t})")
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return col.cast(pa.string())
    if pa.types.is_integer(t):
        return col.cast(pa.string())
    sample = next((v for v in col.to_pylist() if v is not None), None)
    raise _bad(key, dtype, sample, f" (the column is {t})")
