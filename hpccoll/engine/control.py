"""The control plane: small pickled messages on a private duplicate of the world
communicator, never on a data communicator.

Tags: report requests and replies (watchdog); the launch order's reports up the tree
and batches down it (ordered policy); failure notices (a collective failed on
one member: the others fail it at once instead of waiting for their watchdog); the
deferred mismatch check's notes, probes, rows, verdicts and what a member issued on a
communicator it frees.  Only whoever holds the engine sends or receives here; sends
are nonblocking and their requests are reaped later.
"""
from __future__ import annotations

import os
import socket

from mpi4py import MPI

TAG_REPORT_REQ = 11
TAG_REPORT = 12
TAG_ORDER_UP = 14      # one tag each way: MPI keeps one pair's messages of one tag in
TAG_ORDER_DOWN = 15    # order, which the launch order relies on (ordering/sequencer.py)
TAG_FAILED = 17
TAG_NOTE = 18       # the deferred mismatch check (engine/crosscheck.py)
TAG_PROBE = 19
TAG_ROWS = 20
TAG_VERDICT = 21
TAG_CLOSING = 22    # a rank closes its context: how far it got on each communicator
TAG_FINAL = 23      # a rank frees a communicator: how far it got there, digest, rows
TAG_GONE = 24       # a rank exits after an unhandled exception: as TAG_CLOSING, no close

HOST = socket.gethostname()
PID = os.getpid()


class Control:
    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._sends: list = []
        self._status = MPI.Status()

    def send(self, obj, dest: int, tag: int) -> None:
        self._sends.append(self.comm.isend(obj, dest, tag))
        if len(self._sends) > 32:
            self.reap()

    def broadcast(self, obj, dests, tag: int) -> None:
        for d in dests:
            if d != self.rank:
                self.send(obj, d, tag)

    def reap(self) -> None:
        self._sends = [r for r in self._sends if not r.Test()]

    def receive(self):
        """Every control message that has arrived: [(source, tag, obj), ...]."""
        out = []
        while True:
            msg = self.comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, self._status)
            if msg is None:
                return out
            src, tag = self._status.Get_source(), self._status.Get_tag()
            out.append((src, tag, msg.recv()))

    def cancel_all(self) -> None:
        for r in self._sends:
            try:
                r.Cancel()
            except MPI.Exception:
                pass
        self._sends = []
