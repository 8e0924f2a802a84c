"""Byte counts as users write and read them (nccl-tests' K/M/G suffixes, powers of 1024)."""
from __future__ import annotations


def parse_size(text: str) -> int:
    """Byte counts accept K/M/G suffixes (powers of 1024), like nccl-tests."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    if t and t[-1] in "KMG":
        mult = 1024 ** ("KMG".index(t[-1]) + 1)
        t = t[:-1]
    return int(float(t) * mult)


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
