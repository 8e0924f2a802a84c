"""A job of test_ordering_multinode.py: the ordered policy on two Slurm nodes, with every
collective of a multi-rank communicator taking the launch order (hpccoll's own
algorithms, one execution slot), ranks issuing in random interleavings over
communicators that span both nodes, one node, or every other rank.  Rank 0 checks what
every rank saw and prints one line per check; the exit status says whether all held.

    mpiexec -n 8 -ppn 4 python tests/slurm/ordered_job.py      # inside a 2-node allocation

HPCCOLL_NODE_SIZE must name the ranks per node: ranks of one host are one node to MPI,
and slurm-local's nodes share a host.
"""
import os
import random
import sys

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.chaos import interleave


def run_ranks(ctx):
    """Random interleavings, every result checked; this rank's launch log after them."""
    r = ctx.rank
    comms = [ctx.world.dup(name="all0"), ctx.world.dup(name="all1"),
             ctx.world.split(r % 2, name=f"alternate{r % 2}"),
             ctx.world.split(ctx._node_of[r], name=f"node{ctx._node_of[r]}")]
    policy = ctx._engine.policy
    start = len(policy.launch_log)
    rng = random.Random(99 + r)
    works = [(c, i, c.allreduce(np.full(3, i + 1, np.int64)))
             for _, c, i in interleave([(c.name, c, i) for c in comms for i in range(20)], rng)]
    for c, i, w in works:
        np.testing.assert_array_equal(w.wait(), np.full(3, (i + 1) * c.size))
    log = list(policy.launch_log)[start:]
    assert len(log) == len(works), (len(log), len(works))
    tree = policy._tree
    return {"log": log, "hops": policy.seq.hops, "tree_nodes": tree.nodes,
            "parent": tree.parent[r], "node": ctx._node_of[r]}


def check(seen, size) -> list:
    """(ok, what) per check, from every rank's view."""
    out = []
    slurm = [s["slurm_node"] for s in seen]
    out.append((len(set(slurm)) == 2 and slurm == sorted(slurm),
                f"ranks on Slurm nodes {slurm}"))
    out.append((all(s["tree_nodes"] == 2 for s in seen),
                "the tree has 2 nodes on every rank"))
    # node-local first: only the second node's leader has its parent on the other node
    across = [r for r, s in enumerate(seen) if s["parent"] is not None
              and slurm[s["parent"]] != slurm[r]]
    out.append((across == [size // 2], f"tree edges between the nodes: from ranks {across}"))
    out.append((all(s["hops"] > 0 for s in seen), "every rank took part in the order"))
    gseq_of, ok = {}, True
    for s in seen:
        gs = [g for g, _ in s["log"]]
        ok = ok and gs == sorted(gs) and all(gseq_of.setdefault(c, g) == g for g, c in s["log"])
    out.append((ok, "one gseq per collective, launched in gseq order on every rank"))
    agree = True
    for a in range(size):
        for b in range(a + 1, size):
            common = {c for _, c in seen[a]["log"]} & {c for _, c in seen[b]["log"]}
            agree = agree and ([c for _, c in seen[a]["log"] if c in common]
                               == [c for _, c in seen[b]["log"] if c in common])
    out.append((agree, "every two ranks launched their common collectives in one order"))
    return out


def main() -> int:
    world = MPI.COMM_WORLD
    with hpccoll.init(policy="ordered", max_active=1, mpi_coll_bytes=0, cell_bytes=0,
                      timeout=60) as ctx:
        mine = run_ranks(ctx)
    mine["slurm_node"] = os.environ.get("SLURMD_NODENAME", "?")
    seen = world.gather(mine, root=0)
    ok = True
    if world.rank == 0:
        for good, what in check(seen, world.size):
            print(f"{'ok' if good else 'FAILED'}: {what}", flush=True)
            ok = ok and good
        print(f"{sum(len(s['log']) for s in seen)} launches on {world.size} ranks", flush=True)
    return 0 if world.bcast(ok, root=0) else 1


if __name__ == "__main__":
    sys.exit(main())
