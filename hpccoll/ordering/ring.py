"""The previous protocol of the ``ordered`` policy, a token ring, as a pure state machine.

Not used by the policy any more (sequencer.py replaced it: its latency grows with the
number of ranks, 2n hops per burst).  It stays as the baseline that
scripts/token_model.py simulates beside the tree, and tests/unit/test_ordering_ring.py
still checks it, so that the comparison is with a protocol that works.

A token circulates over all ranks of the control communicator, in ring order.
It carries:

- ``entries``: collectives issued by some but not all of their members, each with
  the bit mask of its members and of the members that issued it so far;
- ``log``: global sequence numbers (gseq) assigned during the last round, each
  tagged with the rank that assigned it;
- ``next_gseq`` and ``quiet`` (hops since anything changed).

The holder (1) drops the log entries it assigned itself (they have been all the
way round, so every rank has seen them) and learns the others, (2) adds its newly
issued collectives, (3) assigns the next gseq to every entry that all members
have now issued, in the order the entries entered the token, (4) passes the token
on, or keeps it ("rests") once a whole round went by with nothing new and the
log is empty, telling everyone where it rests.  A rank that issues while the
token rests sends that holder a wake-up.

Every rank launches its own collectives strictly in gseq order.  See
docs/ordering.md for why this order is consistent, why no circular wait can
form, and why every issued collective is eventually launched.

Caching (Horovod's response cache, adapted): a collective is named on the token
by a small integer *slot* for its (communicator, members) pair plus its sequence
number or key instance; the communicator's name and member mask travel once, the
first time the slot appears, and every rank keeps the slot table.  A repeated
pattern therefore costs a few integers per collective per round, and one round
orders a whole burst of collectives at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

KIND_TOKEN, KIND_REST, KIND_WAKE = "token", "rest", "wake"


@dataclass
class Token:
    next_gseq: int = 0
    next_slot: int = 0
    quiet: int = 0
    entries: dict = field(default_factory=dict)   # (slot, ident) -> [members, issuers]
    log: list = field(default_factory=list)       # [(gseq, slot, ident, origin)]
    slots: list = field(default_factory=list)     # [(slot, comm_uid, members, origin)]


class TokenRing:
    """One rank's side of the protocol.  Methods return the messages to send as
    (dest, kind, payload) tuples, and the (gseq, cid) assignments this rank learned,
    where cid = (comm_uid, ident)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.bit = 1 << rank
        self.token = Token() if rank == 0 else None   # rank 0 starts holding it, at rest
        self.resting = rank == 0
        self.rest_at = 0                  # where the token rests, as last heard (None: moving)
        self.woke = False                 # a wake-up was sent for the current rest
        self.unannounced: dict = {}       # cid -> members mask, issued here, not on the token yet
        self.seen_gseq = -1
        self.slot_of: dict = {}           # (comm_uid, members) -> slot
        self.slot_info: dict = {}         # slot -> (comm_uid, members)
        self.hops = 0                     # tokens handled here (statistics)

    # -- local events ---------------------------------------------------------------------
    def issue(self, cid: tuple, members: int) -> None:
        """A collective was issued here; members is the bit mask of its world ranks.
        Nothing is sent until flush(), so a burst of issues rides one token visit."""
        self.unannounced[cid] = members

    def flush(self) -> tuple[list, list]:
        """Announce what was issued since the last flush: on the token if it rests here,
        else by waking the rank where it rests."""
        if not self.unannounced:
            return [], []
        if self.token is not None:
            self.resting = False
            self.token.quiet = 0
            return self._hop()
        return self._wake(), []

    def _wake(self) -> list:
        if self.rest_at is not None and not self.woke and self.rest_at != self.rank:
            self.woke = True
            return [(self.rest_at, KIND_WAKE, self.rank)]
        return []

    # -- messages -------------------------------------------------------------------------
    def on_message(self, src: int, kind: str, payload) -> tuple[list, list]:
        if kind == KIND_TOKEN:
            self.token = payload
            self.rest_at = None
            self.woke = False
            return self._hop()
        if kind == KIND_REST:
            self.rest_at = payload
            self.woke = False
            return self.flush()
        if kind == KIND_WAKE:
            if self.token is not None and self.resting:
                self.resting = False
                self.token.quiet = 0
                return self._hop()
            return [], []
        raise ValueError(kind)

    # -- holding the token ---------------------------------------------------------------------
    def _slot(self, tok: Token, comm_uid: Hashable, members: int) -> int:
        """The slot of a (communicator, members) pair; new ones are numbered by the token
        holder and travel on the token for one round, so every rank learns them."""
        key = (comm_uid, members)
        slot = self.slot_of.get(key)
        if slot is None:
            slot = tok.next_slot
            tok.next_slot += 1
            self.slot_of[key] = slot
            self.slot_info[slot] = key
            tok.slots.append((slot, comm_uid, members, self.rank))
        return slot

    def _hop(self) -> tuple[list, list]:
        tok = self.token
        self.hops += 1
        learned = []
        changed = False
        # 1. slots and assignments made elsewhere; drop what this rank put there a round ago
        tok.slots = [s for s in tok.slots if s[3] != self.rank]
        for slot, uid, members, _ in tok.slots:
            self.slot_info[slot] = (uid, members)
            self.slot_of[(uid, members)] = slot
        tok.log = [e for e in tok.log if e[3] != self.rank]
        for gseq, slot, ident, _ in tok.log:
            if gseq > self.seen_gseq:
                self.seen_gseq = gseq
                learned.append((gseq, (self.slot_info[slot][0], ident)))
        # 2. announce what was issued here
        for (uid, ident), members in self.unannounced.items():
            key = (self._slot(tok, uid, members), ident)
            entry = tok.entries.get(key)
            if entry is None:
                tok.entries[key] = [members, self.bit]
            else:
                entry[1] |= self.bit
            changed = True
        self.unannounced.clear()
        # 3. order every collective that all its members have issued
        for key in [k for k, (m, iss) in tok.entries.items() if iss == m]:
            del tok.entries[key]
            gseq = tok.next_gseq
            tok.next_gseq += 1
            tok.log.append((gseq, key[0], key[1], self.rank))
            self.seen_gseq = gseq
            learned.append((gseq, (self.slot_info[key[0]][0], key[1])))
            changed = True
        # 4. pass it on, or rest once a full round saw nothing new
        tok.quiet = 0 if changed else tok.quiet + 1
        if tok.quiet >= self.size and not tok.log and not tok.slots:
            self.resting = True
            self.rest_at = self.rank
            return [(d, KIND_REST, self.rank) for d in range(self.size) if d != self.rank], learned
        self.resting = False
        self.token = None
        return [((self.rank + 1) % self.size, KIND_TOKEN, tok)], learned
