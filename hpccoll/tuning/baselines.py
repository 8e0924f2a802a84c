"""The allocations Libra is compared with, as plans the simulator can replay.

(a) ``ddp``: PyTorch DDP's bucketing (fill buckets in backward order, close one once it
    holds ``cap`` bytes, 25 MiB by default) with the most blocks for every bucket, as
    NCCL gives a large message all its channels;
(b) ``size_rule``: the same buckets, blocks by message size alone as NCCL's tuner does
    (drop blocks until each keeps ``bytes_per_block``: 512 threads x 64 bytes);
(c) ``fusion_only``: bucket boundaries tuned by the planner, blocks fixed at the most.
"""
from __future__ import annotations

from .model import Plan, Workload
from .planner import plan as _plan
from .profile import Profile

DDP_CAP = 25 << 20
NCCL_BYTES_PER_BLOCK = 512 * 64


def ddp_ends(work: Workload, cap: int = DDP_CAP) -> tuple:
    ends, held = [], 0
    for i, b in enumerate(work.nbytes):
        held += int(b)
        if held >= cap:
            ends.append(i + 1)
            held = 0
    if not ends or ends[-1] != work.n:
        ends.append(work.n)
    return tuple(ends)


def usable_blocks(profile: Profile) -> list:
    """Explicit block counts (0, the library's own choice, is not one)."""
    return [b for b in profile.block_list if b > 0] or list(profile.block_list)


def ddp(work: Workload, profile: Profile, cap: int = DDP_CAP) -> Plan:
    ends = ddp_ends(work, cap)
    return Plan(ends, (max(usable_blocks(profile)),) * len(ends))


def nccl_blocks(nbytes: int, allowed, bytes_per_block: int = NCCL_BYTES_PER_BLOCK) -> int:
    fits = [b for b in allowed if nbytes >= b * bytes_per_block]
    return max(fits) if fits else min(allowed)


def size_rule(work: Workload, profile: Profile, cap: int = DDP_CAP) -> Plan:
    ends = ddp_ends(work, cap)
    allowed = usable_blocks(profile)
    starts = (0,) + ends[:-1]
    return Plan(ends, tuple(nccl_blocks(int(work.nbytes[a:e].sum()), allowed)
                            for a, e in zip(starts, ends)))


def fusion_only(work: Workload, profile: Profile) -> Plan:
    return _plan(work, profile, blocks=[max(usable_blocks(profile))]).plan


METHODS = {
    "planned": "Libra: buckets and blocks by the DP",
    "ddp": "(a) 25 MiB buckets, most blocks",
    "size_rule": "(b) 25 MiB buckets, NCCL-like blocks by size",
    "fusion_only": "(c) buckets by the DP, most blocks",
}


def plans(work: Workload, profile: Profile) -> dict:
    """Every method's plan, keyed like METHODS."""
    return {"planned": _plan(work, profile).plan,
            "ddp": ddp(work, profile), "size_rule": size_rule(work, profile),
            "fusion_only": fusion_only(work, profile)}
