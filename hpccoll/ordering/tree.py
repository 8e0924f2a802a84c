"""The tree the launch order is negotiated over, and communicators' member sets on it.

Node-local first, then node leaders: the ranks of a node form a binomial tree rooted at
their lowest rank (the node's leader), and the leaders form a binomial tree over the
nodes, in the order of their lowest ranks, rooted at rank 0.  A binomial tree of k
members has depth ceil(log2 k), so the whole tree is ceil(log2 nodes) + ceil(log2 p)
deep for p ranks per node: a report climbs it and an answer descends it in about
log2(n) hops each, and the lowest levels stay inside a node.

Binomial: member i's parent is i - lowbit(i), so the root's children are 1, 2, 4, ...
and member i's subtree is i .. i + lowbit(i) - 1.  A leader lists its node's ranks
before its child leaders, so in preorder every subtree is one contiguous range of
*positions*; with ranks placed node by node (mpiexec's and srun's default block
placement) a rank's position is its rank.  A communicator's members are kept as runs of
positions, so that "does this child's subtree hold a member?" is a binary search,
whatever the communicator's size.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Hashable, Sequence


def _binomial(members: list, parent: list, children: list) -> None:
    for i in range(1, len(members)):
        p = members[i - (i & -i)]
        parent[members[i]] = p
        children[p].append(members[i])


class Tree:
    """``node_of[w]``: any hashable naming world rank w's node (ranks sharing a value
    share a node).  Attributes per world rank: ``parent`` (None at the root, rank 0),
    ``children`` (tuples), ``pos`` (preorder position) and ``end`` (one past the last
    position of its subtree)."""

    def __init__(self, node_of: Sequence[Hashable]):
        n = len(node_of)
        if n < 1:
            raise ValueError("a tree needs at least one rank")
        nodes: dict = {}
        for w, node in enumerate(node_of):
            nodes.setdefault(node, []).append(w)
        # dicts keep insertion order: nodes by lowest rank, rank 0's first
        groups = list(nodes.values())
        self.size = n
        self.nodes = len(groups)
        self.per_node = max(len(g) for g in groups)
        parent: list = [None] * n
        children: list = [[] for _ in range(n)]
        for ranks in groups:
            _binomial(ranks, parent, children)
        _binomial([g[0] for g in groups], parent, children)
        self.parent = parent
        self.children = [tuple(c) for c in children]
        pos = [0] * n
        end = [0] * n
        order = []
        stack = [0]
        while stack:                     # preorder; children in the order listed
            w = stack.pop()
            pos[w] = len(order)
            order.append(w)
            stack.extend(reversed(self.children[w]))
        for w in reversed(order):
            end[w] = pos[w] + 1 + sum(end[c] - pos[c] for c in self.children[w])
        self.pos, self.end = pos, end
        depth = [0] * n
        for w in order[1:]:
            depth[w] = depth[parent[w]] + 1
        self.depth = max(depth)

    def members(self, world_ranks) -> tuple:
        """A communicator's members as runs of positions: ((start, stop, step), ...),
        sorted, their spans disjoint.  A dup of the world is one run, a group of
        consecutive ranks one run, a strided one (every k-th rank) one run."""
        return runs_of(sorted(self.pos[w] for w in world_ranks))


def runs_of(positions: list) -> tuple:
    """Sorted distinct positions as arithmetic runs (start, stop, step), greedily."""
    out = []
    i, k = 0, len(positions)
    while i < k:
        start = positions[i]
        if i + 1 == k:
            out.append((start, start + 1, 1))
            break
        step = positions[i + 1] - start
        j = i + 1
        while j + 1 < k and positions[j + 1] - positions[j] == step:
            j += 1
        out.append((start, positions[j] + 1, step))
        i = j + 1
    return tuple(out)


class Members:
    """Runs of positions (Tree.members) with the search ``hits`` needs."""
    __slots__ = ("runs", "starts", "lasts", "count")

    def __init__(self, runs: tuple):
        self.runs = runs
        self.starts = [a for a, _, _ in runs]
        self.lasts = [a + (b - 1 - a) // s * s for a, b, s in runs]
        self.count = sum((b - 1 - a) // s + 1 for a, b, s in runs)

    def hits(self, lo: int, hi: int) -> bool:
        """Whether any member's position lies in [lo, hi)."""
        i0 = bisect_left(self.lasts, lo)          # first run not wholly below lo
        i1 = bisect_right(self.starts, hi - 1)    # runs starting before hi
        if i1 - i0 >= 3:
            return True                           # a middle run lies wholly inside
        for i in range(i0, i1):
            a, _, s = self.runs[i]
            first = a if a >= lo else a + -(-(lo - a) // s) * s
            if first < hi and first <= self.lasts[i]:
                return True
        return False
