"""The reduction operators, as plain Python functions that Numba compiles for both
targets (CUDA device functions and CPU njit functions), and the accumulation rule.

float16 is accumulated in float32: every source is widened, combined in float32, and
the result rounded to float16 once.  For two sources this equals the correctly rounded
float16 result (the float32 sum of two float16 values is exact), which is what NumPy and
MPI implementations compute; for k > 2 sources it is more accurate than pairwise float16
rounding.
"""
from __future__ import annotations

import numpy as np


def _sum(a, b):
    return a + b


def _prod(a, b):
    return a * b


def _min(a, b):
    return a if a <= b else b


def _max(a, b):
    return a if a >= b else b


# "avg" is "sum" followed by a scale kernel (every rank divides the same sum).
COMBINE = {"sum": _sum, "prod": _prod, "min": _min, "max": _max, "avg": _sum}
OPS = tuple(COMBINE)
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64")


def accumulator(dtype) -> np.dtype:
    """The type sources are combined in: float32 for float16, the dtype itself otherwise."""
    dt = np.dtype(dtype)
    return np.dtype(np.float32) if dt == np.float16 else dt
