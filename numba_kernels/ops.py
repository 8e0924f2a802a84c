"""The reduction ops the kernels compile, from hpccoll's one op table
(hpccoll/core/ops.py): its scalar combine functions and its accumulation rule (float16
and bfloat16 accumulate in float32 and round once; avg divides each source first)."""
from __future__ import annotations

from hpccoll.base.ops import CONTRACT_DTYPES, KERNEL_OPS, LOW_PRECISION, OPS, accumulator

COMBINE = {name: OPS[name].combine for name in KERNEL_OPS}
DTYPES = CONTRACT_DTYPES

__all__ = ["COMBINE", "DTYPES", "KERNEL_OPS", "LOW_PRECISION", "accumulator"]
