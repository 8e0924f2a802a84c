"""``hpccoll.mpi.Comm``: an mpi4py intracommunicator whose collectives run on hpccoll.

    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD)      # the one changed line
    comm.Allreduce(x, y, op=MPI.SUM)              # runs on hpccoll
    isinstance(comm, MPI.Intracomm)               # True: it is one

The adapter classes subclass mpi4py's (``Comm`` is an ``MPI.Intracomm``, ``Cartcomm`` an
``MPI.Cartcomm``, ...) and share the wrapped communicator's MPI handle, so everything they
do not run natively is mpi4py's own method, inherited.  Their native collectives come from
three mixins, one place each for every adapter class: ``BufferCalls`` (``_buffers.py``),
``ObjectCalls`` (``_objects.py``), ``RootedCalls`` (``_rooted.py``).  The collectives
inherited from mpi4py are wrapped so that ``stats`` counts them as forwarded
(``_coverage.py``: the table of what is native, generated from these classes).

Constructors (``Dup``, ``Split``, ``Create_cart``, ...) return adapters on the same hpccoll
context; ``Free`` frees the MPI communicator and the hpccoll one.
"""
from __future__ import annotations

import ctypes
from collections import defaultdict

from ..core.context import init
from ..errors import ArgumentError
from . import _calls as calls
from . import _coverage as coverage
from ._buffers import BufferCalls
from ._objects import ObjectCalls
from ._request import Request
from ._rooted import RootedCalls
from ._types import MPI

_HANDLE_BYTES = MPI._sizeof(MPI.Comm)


def _copy_handle(dst, src) -> None:
    """dst's MPI handle := src's.  mpi4py offers no setter; this is what it does itself when
    MPI_Comm_free nulls the object it was called on, and keeps two objects that share one
    handle from freeing it twice.  (Collecting either object frees nothing: mpi4py 4 frees
    no communicator on garbage collection.)"""
    ctypes.memmove(MPI._addressof(dst), MPI._addressof(src), _HANDLE_BYTES)


class Comm(BufferCalls, ObjectCalls, RootedCalls, MPI.Intracomm):
    """mpi4py's ``Intracomm`` with hpccoll under its collectives.

    ``Comm(comm, **init_options)`` starts an hpccoll context on ``comm`` (collective,
    like ``hpccoll.init(comm, **init_options)``: policy, timeout, engine knobs).
    ``Comm(comm, context=ctx)`` runs on an existing context instead.  A topology
    communicator gets the adapter of its kind (``Cartcomm``, ``Graphcomm``,
    ``Distgraphcomm``).  Constructors return adapters on the same context, so collectives
    of all of them share one engine (and its deadlock-free scheduling)."""

    _kind = MPI.Intracomm     # the mpi4py class this adapter class is one of

    @staticmethod   # (what Python makes of a __new__; said, for the compiled form)
    def __new__(cls, comm=None, context=None, **init_options):
        # Intracomm's, for the topology adapters too: Python takes the layout of every
        # adapter class from its first base, Comm, whose static base is Intracomm
        if comm is None:   # mpi4py's own constructors make bare objects: a null handle
            return MPI.Intracomm.__new__(cls)
        mpi_comm = comm._mpi if isinstance(comm, Comm) else comm
        if cls is Comm:
            cls = _adapter_class(mpi_comm)
        else:   # mpi4py's TypeError for a communicator of another kind
            cls._kind(mpi_comm)
        # mpi4py's TypeError for what is not an intracommunicator
        return MPI.Intracomm.__new__(cls, mpi_comm)

    def __init__(self, comm, context=None, **init_options):
        if isinstance(comm, Comm):
            comm = comm._mpi
        if comm == MPI.COMM_NULL:
            raise ArgumentError("comm: expected a communicator this rank belongs to, got COMM_NULL")
        if context is None:
            ctx = init(comm, **init_options)
            hc = ctx.world
        else:
            if init_options:
                raise ArgumentError(f"{', '.join(init_options)}: with context= the context's "
                                    "settings apply; pass options to hpccoll.init instead")
            ctx, hc = context, context.wrap(comm)
        self._setup(comm, ctx, hc)

    def _setup(self, mpi_comm, ctx, hc) -> None:
        self._mpi = mpi_comm
        self._ctx = ctx
        self._hc = hc
        self._st, self._blocks = hc._state, hc._blocks
        self._freed = False
        self._stats = defaultdict(lambda: {"native": 0, "forwarded": 0})
        self._run = calls.Runner(hc, mpi_comm, self._stats)
        # the Call of the last small plain arrays of Bcast and Allreduce (calls.RECENT_BYTES),
        # with their counters (_buffers.py); Free empties them
        self._last_bcast = [None] * 7
        self._last_allreduce = [None] * 9
        self._heads: dict = {}     # the lowercase methods' header buffers (_objects._headers)

    def __repr__(self) -> str:
        if "_mpi" not in self.__dict__:
            return f"<hpccoll.mpi.{type(self).__name__} (not constructed)>"
        state = " freed" if self._freed else ""
        return (f"<hpccoll.mpi.{type(self).__name__} rank {self._hc.rank} of {self._hc.size}"
                f"{state} over {self._mpi!r}>")

    def __reduce__(self):
        # mpi4py pickles predefined communicators by name; an adapter carries this
        # process's hpccoll context, which no other process has
        raise ValueError(f"cannot serialize 'hpccoll.mpi.{type(self).__name__}' instance "
                         "(it runs on this process's hpccoll context; pickle comm.mpi_comm)")

    # -- what it wraps ------------------------------------------------------------------
    @property
    def mpi_comm(self):
        """The wrapped mpi4py communicator (it shares this adapter's MPI handle)."""
        return self._mpi

    @property
    def communicator(self):
        """The hpccoll Communicator native calls run on."""
        return self._hc

    @property
    def context(self):
        """The hpccoll Context (its engine serves this communicator and the ones made from
        it; ``context.close()`` is collective)."""
        return self._ctx

    @property
    def stats(self) -> dict:
        """{method: {"native": calls run on hpccoll, "forwarded": calls run by mpi4py}}."""
        return {name: dict(counts) for name, counts in self._stats.items()}

    # -- the engine of every native method ---------------------------------------------
    # (calls.Runner: the buffer and rooted methods call self._run.blocking themselves)
    def _blocking(self, name: str, read, *args):
        """Run natively, waiting on the calling thread, and return the Call that ran; or
        forward (None).  ``read`` checks the arguments once and returns the call the
        pipeline issues."""
        return self._run.blocking(name, read, args)

    def _nonblocking(self, name: str, read, *args):
        work, request = self._run.start(name, read, args)
        return Request(work) if work is not None else request

    # -- constructors: adapters on this context -------------------------------------------
    def _adopt(self, name: str, made):
        """An adapter over ``made``, what mpi4py's ``name`` returned (collective over it);
        MPI's null communicator, for ranks outside the new one, as mpi4py returned it."""
        self._stats[name]["native"] += 1
        if made == MPI.COMM_NULL:
            return made
        cls = _adapter_class(made)
        child = cls.__new__(cls, made)
        child._setup(made, self._ctx, self._ctx.wrap(made))
        return child

    def Clone(self):
        return self._adopt("Clone", self._mpi.Clone())

    def Dup(self, *args, **kwargs):
        return self._adopt("Dup", self._mpi.Dup(*args, **kwargs))

    def Dup_with_info(self, *args, **kwargs):
        return self._adopt("Dup_with_info", self._mpi.Dup_with_info(*args, **kwargs))

    def Idup(self, *args, **kwargs):
        """mpi4py's (communicator, request): the communicator is mpi4py's own (it is not
        usable before the request completes; wrap it then, with ``context=``)."""
        self._stats["Idup"]["forwarded"] += 1
        return self._mpi.Idup(*args, **kwargs)

    def Idup_with_info(self, *args, **kwargs):
        self._stats["Idup_with_info"]["forwarded"] += 1
        return self._mpi.Idup_with_info(*args, **kwargs)

    Idup.forwarded = Idup_with_info.forwarded = True   # (in the coverage table)

    def Create(self, *args, **kwargs):
        return self._adopt("Create", self._mpi.Create(*args, **kwargs))

    def Create_group(self, *args, **kwargs):
        return self._adopt("Create_group", self._mpi.Create_group(*args, **kwargs))

    def Split(self, *args, **kwargs):
        """An adapter for this rank's part, or MPI's null communicator for MPI.UNDEFINED."""
        return self._adopt("Split", self._mpi.Split(*args, **kwargs))

    def Split_type(self, *args, **kwargs):
        return self._adopt("Split_type", self._mpi.Split_type(*args, **kwargs))

    def Create_cart(self, *args, **kwargs):
        """A ``Cartcomm`` adapter (MPI's null communicator off the grid)."""
        return self._adopt("Create_cart", self._mpi.Create_cart(*args, **kwargs))

    def Create_graph(self, *args, **kwargs):
        return self._adopt("Create_graph", self._mpi.Create_graph(*args, **kwargs))

    def Create_dist_graph(self, *args, **kwargs):
        return self._adopt("Create_dist_graph", self._mpi.Create_dist_graph(*args, **kwargs))

    def Create_dist_graph_adjacent(self, *args, **kwargs):
        return self._adopt("Create_dist_graph_adjacent",
                           self._mpi.Create_dist_graph_adjacent(*args, **kwargs))

    # -- destructors ----------------------------------------------------------------------
    def Free(self) -> None:
        """Free the MPI communicator (as mpi4py does: MPI.COMM_WORLD raises) and the hpccoll
        communicator over it, whose ``free()`` compares the members' last collectives (it
        waits for the other members' Free, as a collective may) and raises the
        CollectiveMismatch it finds on every member.  The hpccoll context stays up for the
        other adapters on it, until ``context.close()`` or the end of the program.
        Afterwards this adapter and the wrapped communicator both equal MPI.COMM_NULL; if
        the wrapped one was freed first, the handle is not freed again."""
        self._release(self._mpi.Free, "Free")

    def Disconnect(self) -> None:
        self._release(self._mpi.Disconnect, "Disconnect")

    def _release(self, free, name: str) -> None:
        if self._freed or self._mpi != self:
            # freed already, through this adapter (MPI's own error, from the null handle)
            # or through the wrapped communicator (only this object's copy is left)
            if self._freed:
                getattr(MPI.Intracomm, name)(self)
            _copy_handle(self, self._mpi)
        else:
            free()     # MPI's errors (COMM_WORLD) raise here, before anything changes
            _copy_handle(self, self._mpi)
        self._stats[name]["native"] += 1
        self._freed = self._run.freed = True
        for last in (self._last_bcast, self._last_allreduce):
            last[:] = [None] * len(last)        # (a kept call would skip the _freed check)
        self._run.kept.clear()
        self._hc.free()


class Cartcomm(Comm, MPI.Cartcomm):
    """mpi4py's ``Cartcomm`` with hpccoll under its collectives (``Create_cart``, ``Sub``);
    the topology queries are mpi4py's."""

    _kind = MPI.Cartcomm

    def Sub(self, *args, **kwargs):
        return self._adopt("Sub", self._mpi.Sub(*args, **kwargs))


class Graphcomm(Comm, MPI.Graphcomm):
    """mpi4py's ``Graphcomm`` with hpccoll under its collectives (``Create_graph``)."""

    _kind = MPI.Graphcomm


class Distgraphcomm(Comm, MPI.Distgraphcomm):
    """mpi4py's ``Distgraphcomm`` with hpccoll under its collectives
    (``Create_dist_graph``, ``Create_dist_graph_adjacent``)."""

    _kind = MPI.Distgraphcomm


_TOPOLOGIES = {MPI.CART: Cartcomm, MPI.GRAPH: Graphcomm, MPI.DIST_GRAPH: Distgraphcomm}


def _adapter_class(mpi_comm):
    """The adapter class for a communicator, by its handle's topology (as mpi4py's own
    constructors judge it, not by its Python class)."""
    if isinstance(mpi_comm, MPI.Comm) and mpi_comm != MPI.COMM_NULL and not mpi_comm.Is_inter():
        return _TOPOLOGIES.get(mpi_comm.Get_topology(), Comm)
    return Comm   # mpi4py's constructor raises its TypeError for anything else


for _cls in (Comm, Cartcomm, Graphcomm, Distgraphcomm):
    coverage.install_forwarders(_cls)
