"""The launch order of the ``ordered`` policy: pure state machines, no MPI inside.

- ``tree``: the tree the order is negotiated over (node-local first, then node leaders)
  and communicators' member sets on it;
- ``sequencer``: the protocol the policy runs (watermarks up, batches of global
  sequence numbers down, a vector over cached slots in steady state);
- ``ring``: the token ring it replaced, kept as scripts/token_model.py's baseline.

The policy around them is hpccoll/engine/policies/ordered.py; why the order is safe
and what it costs: docs/ordering.md.
"""
from .sequencer import KIND_DOWN, KIND_UP, Sequencer, pack, unpack
from .tree import Members, Tree, runs_of

__all__ = ["KIND_DOWN", "KIND_UP", "Members", "Sequencer", "Tree", "pack", "runs_of",
           "unpack"]
