"""The ``ordered`` policy's launch order, negotiated over a tree, as a pure state machine.

A **stream** is what one collective after another is issued on in the same order on
every member: a communicator's un-keyed collectives, or its collectives of one key.
The policy names a stream ``sid`` (communicator uid, key) and numbers its collectives
0, 1, 2, ... in issue order, so the i-th collective of a stream is the same one on
every member without any talking.

Issued counts flow up the tree (tree.py), answers flow down:

- **Up: a min-reduce of watermarks.**  A rank's watermark for a stream is how many of
  its collectives every member in its subtree has issued: the smallest of its own count
  (where it is a member) and its children's reported watermarks (for the children whose
  subtree holds a member; the member set travels up with a stream's first report, so
  each rank on the way knows whom to expect).  A rank reports what rose at its next
  flush(): its own issues and the reports that arrived since travel up as one.
- **At the root: the order.**  The root's watermark is how many of the stream's
  collectives *every member* issued; each one beyond those already placed gets the
  next global sequence number (gseq).  Everything that rose since the root's last
  flush is placed as one batch.
- **Down: the batch, along the reports' paths.**  The root sends the batch to each
  child whose subtree holds a member of some stream in it, and every rank forwards it
  the same way, unchanged; a member learns the gseqs of its collectives from it.

**The cache (Horovod's response cache).**  A stream's first batch gives it a small
integer *slot*, which travels with that batch along the stream's whole route; after
that a report or a batch names the stream by its slot, and a step that repeats the
last one's collectives travels as one vector over slots each way: a bit per stream
when each advanced by one (Horovod's bit vector), a byte per stream when some
advanced by more.  A stream not seen before travels by name with its member set (the
full negotiation), and the root gives it a slot.  Nothing else is exchanged: no token
circulates, nothing rests or wakes, and an idle job sends nothing.

Why the order is safe (docs/ordering.md says it in full): there is one sequencer, the
root, so every gseq is given once; it places a collective only once its watermark,
the minimum over every member's issued count, passed it; batches leave the root in
gseq order and every tree edge delivers them in order (MPI does not overtake between
one pair of ranks on one tag), so every rank learns its gseqs in increasing order and
launches in it.  A total order that every rank launches in, of collectives that all
their members issued, admits no circular wait.

Methods return (messages, learned): messages as (dest, kind, payload), learned as
(gseq, sid, index) in increasing gseq, for this rank's own collectives.
"""
from __future__ import annotations

from typing import Hashable

from .tree import Members, Tree

KIND_UP, KIND_DOWN = "up", "down"


class _Stream:
    """One stream as one rank sees it."""
    __slots__ = ("sid", "members", "member", "child_w", "own", "sent", "slot", "assigned",
                 "named")

    def __init__(self, sid, members: Members, me: int, spans: list):
        self.sid = sid
        self.members = members
        self.member = members.hits(me, me + 1)
        # a watermark per child whose subtree holds a member; -1: none there
        self.child_w = [0 if members.hits(lo, hi) else -1 for lo, hi in spans]
        self.own = 0          # collectives issued here
        self.sent = 0         # the watermark reported up (the root: placed)
        self.slot = None      # given by the root with the first batch
        self.assigned = 0     # collectives of the stream whose gseq arrived here
        self.named = False    # the parent has this stream's name and members

    def watermark(self) -> int:
        w = self.own if self.member else None
        for c in self.child_w:
            if c >= 0 and (w is None or c < w):
                w = c
        return 0 if w is None else w


class Sequencer:
    """One rank's side of the protocol (module docstring)."""

    def __init__(self, rank: int, tree: Tree):
        self.rank = rank
        self.root = tree.parent[rank] is None
        self.parent = tree.parent[rank]
        self.children = tree.children[rank]
        self._child_index = {c: i for i, c in enumerate(self.children)}
        self._spans = [(tree.pos[c], tree.end[c]) for c in self.children]
        self._me = tree.pos[rank]
        self.streams: dict = {}         # sid -> _Stream
        self.by_slot: dict = {}         # slot -> _Stream (streams routed through here)
        self.pending: dict = {}         # sid -> _Stream whose watermark may have risen
        #                                 (issued here, or reported) since the last flush
        self._members: dict = {}        # runs -> Members, shared by streams of equal sets
        self.next_gseq = 0              # the root's counters
        self.next_slot = 0
        self.hops = 0                   # messages handled and flushes with news (statistics)

    # -- local events ---------------------------------------------------------------------
    def issue(self, sid: Hashable, runs: tuple) -> None:
        """This rank issued the next collective of stream ``sid``, whose members are
        ``runs`` (Tree.members).  Nothing is sent before flush(), so a burst of issues
        travels as one report."""
        st = self.streams.get(sid)
        if st is None:
            st = self._stream(sid, runs)
        st.own += 1
        self.pending[sid] = st

    def flush(self) -> tuple[list, list]:
        """Report what rose since the last flush, issued here or reported from below,
        as one message (the root: place it, as one batch).  A rank that handles several
        reports before it flushes sends one where it would have sent several."""
        if not self.pending:
            return [], []
        self.hops += 1
        risen = [st for st in self.pending.values() if st.watermark() > st.sent]
        self.pending.clear()
        return self._rise(risen)

    # -- messages -------------------------------------------------------------------------
    def on_message(self, src: int, kind: str, payload) -> tuple[list, list]:
        """A batch is passed on at once; a report waits for flush()."""
        self.hops += 1
        if kind == KIND_UP:
            self._on_report(src, payload)
            return [], []
        if kind == KIND_DOWN:
            return self._on_batch(payload)
        raise ValueError(kind)

    def _on_report(self, src: int, payload) -> None:
        named, packed = payload
        ci = self._child_index[src]
        pending = self.pending
        for sid, runs, advance in named:
            st = self.streams.get(sid)
            if st is None:
                st = self._stream(sid, runs)
            st.child_w[ci] += advance
            pending[sid] = st
        for slot, advance in unpack(packed):
            st = self.by_slot[slot]
            st.child_w[ci] += advance
            pending[st.sid] = st

    def _on_batch(self, payload) -> tuple[list, list]:
        gseq, new_slots, packed = payload
        for slot, sid in new_slots:
            st = self.streams.get(sid)
            if st is not None:
                st.slot = slot
                self.by_slot[slot] = st
        learned = []
        onward = set()
        for slot, count in unpack(packed):
            st = self.by_slot.get(slot)
            if st is not None:         # else: a stream of other ranks in the same batch
                if st.member:
                    learned.extend((gseq + k, st.sid, st.assigned + k) for k in range(count))
                st.assigned += count
                onward.update(i for i, w in enumerate(st.child_w) if w >= 0)
            gseq += count
        return [(self.children[i], KIND_DOWN, payload) for i in sorted(onward)], learned

    # -- watermarks that rose -------------------------------------------------------------
    def _rise(self, risen: list) -> tuple[list, list]:
        if not risen:
            return [], []
        if self.root:
            return self._place(risen)
        named, slotted = [], {}
        for st in risen:
            w = st.watermark()
            advance, st.sent = w - st.sent, w
            if st.slot is not None:
                slotted[st.slot] = advance
            else:
                named.append((st.sid, None if st.named else st.members.runs, advance))
                st.named = True
        return [(self.parent, KIND_UP, (tuple(named), pack(slotted)))], []

    def _place(self, risen: list) -> tuple[list, list]:
        """The root: give the next gseqs to every collective that all members issued,
        in slot order; a stream seen for the first time gets the next slot."""
        new_slots = []
        for st in risen:
            if st.slot is None:
                st.slot = self.next_slot
                self.next_slot += 1
                self.by_slot[st.slot] = st
                new_slots.append((st.slot, st.sid))
        batch = {}
        for st in risen:
            w = st.watermark()
            batch[st.slot], st.sent = w - st.sent, w
        payload = (self.next_gseq, tuple(new_slots), pack(batch))
        self.next_gseq += sum(batch.values())
        return self._on_batch(payload)

    def _stream(self, sid, runs: tuple) -> _Stream:
        members = self._members.get(runs)
        if members is None:
            members = self._members[runs] = Members(runs)
        st = self.streams[sid] = _Stream(sid, members, self._me, self._spans)
        return st


# -- the vector over slots ---------------------------------------------------------------
# (lo, x): x an int is a bit vector (every stream advanced by one: bit i is slot lo + i);
# bytes: one count per slot from lo; a tuple: (slot - lo, count) pairs, flattened.  The
# smallest for the batch at hand; None: nothing.

def pack(advances: dict):
    if not advances:
        return None
    slots = sorted(advances)
    lo, span = slots[0], slots[-1] - slots[0] + 1
    counts = [advances[s] for s in slots]
    sparse = 4 * len(slots)                 # about what pickle spends on a pair of ints
    if all(c == 1 for c in counts) and span // 8 <= sparse:
        bits = 0
        for s in slots:
            bits |= 1 << (s - lo)
        return (lo, bits)
    if max(counts) < 256 and span <= sparse:
        dense = bytearray(span)
        for s, c in zip(slots, counts):
            dense[s - lo] = c
        return (lo, bytes(dense))
    flat = []
    for s, c in zip(slots, counts):
        flat += (s - lo, c)
    return (lo, tuple(flat))


def unpack(packed):
    """(slot, count) pairs of a packed vector, in increasing slot order."""
    if packed is None:
        return
    lo, x = packed
    if isinstance(x, int):
        while x:
            low = x & -x
            yield lo + low.bit_length() - 1, 1
            x ^= low
    elif isinstance(x, bytes):
        for i, c in enumerate(x):
            if c:
                yield lo + i, c
    else:
        for i in range(0, len(x), 2):
            yield lo + x[i], x[i + 1]
