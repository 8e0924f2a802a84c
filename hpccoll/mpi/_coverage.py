"""Which of mpi4py's collective methods the adapter runs on hpccoll: generated from the code.

``COLLECTIVES`` lists mpi4py's collective methods, as far as the installed mpi4py has them:
MPI's collective operations in their blocking, nonblocking (``I...``) and persistent
(``..._init``) forms, the neighbourhood collectives of topology communicators, and the
lowercase object methods.  A method is **native** when an adapter class or one of its
mixins (``_buffers.py``, ``_objects.py``, ``_rooted.py``) defines it; every other one is
mpi4py's own, inherited, and ``install_forwarders`` wraps it so that ``comm.stats`` counts
it as forwarded.  Nothing here is kept by hand beside the methods: define a method in a
mixin and it is native, in the table and in the counts.

``python -m hpccoll.mpi --coverage`` prints ``markdown()``; docs/mpi4py.md shows it.
"""
from __future__ import annotations

from ._types import MPI

# MPI's collective operations (MPI 4.1, chapter 6), spelled as mpi4py spells them
OPERATIONS = ("Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather",
              "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw", "Reduce", "Allreduce",
              "Reduce_scatter_block", "Reduce_scatter", "Scan", "Exscan")
# MPI 4.1, 8.6: on topology communicators only
NEIGHBOURHOOD = ("Neighbor_allgather", "Neighbor_allgatherv", "Neighbor_alltoall",
                 "Neighbor_alltoallv", "Neighbor_alltoallw")
# mpi4py's pickle-based methods (Python objects)
OBJECTS = ("barrier", "bcast", "gather", "scatter", "allgather", "alltoall", "reduce",
           "allreduce", "scan", "exscan", "neighbor_allgather", "neighbor_alltoall")
FORMS = ("blocking", "nonblocking", "persistent")

# mpi4py's methods that make communicators: the adapter's return adapters on its context
# where it defines them, the others return mpi4py's own communicators
CONSTRUCTORS = ("Clone", "Dup", "Dup_with_info", "Idup", "Idup_with_info", "Create",
                "Create_group", "Split", "Split_type", "Create_cart", "Create_graph",
                "Create_dist_graph", "Create_dist_graph_adjacent", "Sub",
                "Create_from_group", "Create_intercomm", "Spawn", "Spawn_multiple", "Accept",
                "Connect", "Shrink", "Ishrink")


def _forms(op: str) -> tuple:
    """(blocking, nonblocking, persistent) names of one operation."""
    if op[0].islower():
        return op, "i" + op, op + "_init"
    return op, "I" + op[0].lower() + op[1:], op + "_init"


def _has(name: str) -> bool:
    # Topocomm has every method of Intracomm and the neighbourhood ones
    return hasattr(MPI.Topocomm, name)


COLLECTIVES = tuple(name for op in OPERATIONS + NEIGHBOURHOOD + OBJECTS
                    for name in _forms(op) if _has(name))


def _owner(cls, name: str):
    """The class whose attribute ``name`` instances of ``cls`` get."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _ours(klass) -> bool:
    return klass is not None and klass.__module__.startswith("hpccoll.")


def native(cls, name: str) -> bool:
    """Whether adapters of class ``cls`` run ``name`` on hpccoll (some calls of a native
    method may still be forwarded: a datatype, op or device buffer hpccoll leaves to MPI)."""
    klass = _owner(cls, name)
    return _ours(klass) and not getattr(vars(klass)[name], "forwarded", False)


def _forwarder(name: str, impl):
    def forwarded(self, *args, **kwargs):
        self._stats[name]["forwarded"] += 1
        return impl(self, *args, **kwargs)
    forwarded.__name__ = forwarded.__qualname__ = name
    forwarded.__doc__ = impl.__doc__
    forwarded.forwarded = True
    return forwarded


def install_forwarders(cls) -> None:
    """Wrap every collective ``cls`` inherits from mpi4py in a counting forwarder."""
    for name in COLLECTIVES:
        klass = _owner(cls, name)
        if klass is not None and not _ours(klass):
            setattr(cls, name, _forwarder(name, vars(klass)[name]))


def native_methods(*classes) -> set:
    """The collective methods of ``classes`` that run natively."""
    return {name for cls in classes for name in COLLECTIVES if native(cls, name)}


def markdown(comm_cls, topo_cls) -> str:
    """The coverage tables: each operation's forms, native or forwarded, on ``comm_cls``
    (the neighbourhood ones on ``topo_cls``); then the constructors."""
    def cell(cls, name):
        if not hasattr(cls, name):
            return "-"
        return "**native**" if native(cls, name) else "forwarded"

    lines = ["| operation | " + " | ".join(FORMS) + " |", "|---" * (len(FORMS) + 1) + "|"]
    count = total = 0
    for op in OPERATIONS + NEIGHBOURHOOD + OBJECTS:
        cls = topo_cls if op in NEIGHBOURHOOD or op.startswith("neighbor") else comm_cls
        names = _forms(op)
        if not any(_has(n) for n in names):
            continue
        cells = [cell(cls, n) for n in names]
        count += sum(c == "**native**" for c in cells)
        total += sum(c != "-" for c in cells)
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    lines += ["", f"{count} of mpi4py's {total} collective methods run natively.", "",
              "| constructor | returns |", "|---|---|"]
    for name in CONSTRUCTORS:
        cls = topo_cls if name == "Sub" else comm_cls
        if not hasattr(cls, name):
            continue
        made = "an adapter on the same context" if native(cls, name) \
            else "mpi4py's own communicator"
        lines.append(f"| `{name}` | {made} |")
    return "\n".join(lines) + "\n"
