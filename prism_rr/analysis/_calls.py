"""Every rank's calls in one table, matched across ranks by sorting, not by a dict of objects.

A `Member` and a `MatchedCall` are made only when asked for (`CallMap`, `P2PMap`): an
8192-rank bundle holds millions of members, and diagnosis needs objects for the few calls
that something is wrong with. The rest it reads from the columns here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from prism_rr.format import ops
from prism_rr.analysis._model import MatchedCall, Member, P2PMatch

__all__ = ["CallMap", "CallTable", "P2PMap", "P2PTable"]


class CallTable:
    """Collective members sorted by (group, seq, rank); one row per member.

    `first_seen` orders calls as reading the ranks one after another meets them (the
    order a dict filled while reading would have)."""

    def __init__(self, cols: dict[str, np.ndarray], values: list, expected: dict[int, tuple[int, ...]]):
        self.values = values
        self.expected = expected
        order = _by_call(cols["group"], cols["seq"], cols["rank"])
        for k in list(cols):
            setattr(self, k, cols.pop(k)[order])  # the caller's column goes as its sorted copy comes
        self.read_at = order  # place in reading order
        n = len(order)
        g, s = self.group, self.seq
        new = np.ones(n, bool)
        if n:
            new[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
        self.starts = np.flatnonzero(new)
        self.call_of = np.cumsum(new) - 1  # each member's call
        self.count = np.diff(np.append(self.starts, n))
        self.call_group = g[self.starts]
        self.call_seq = s[self.starts]
        self.first_seen = np.minimum.reduceat(order, self.starts) if n else np.zeros(0, np.int64)
        # a call is regular when its members are exactly its group's recorded ranks
        # the j-th member of a regular call (by rank) is the j-th of its group's ranks
        cg = self.call_group
        head = np.ones(len(cg), bool)
        head[1:] = cg[1:] != cg[:-1]
        gids = cg[head]
        g_of_call = np.cumsum(head) - 1
        want = [expected.get(gid, ()) for gid in gids.tolist()]
        distinct = [sorted(set(w)) for w in want]
        # a group that names a rank twice (a stranger's bundle) has no regular calls
        sizes = [len(w) if len(w) == len(d) else -1 for w, d in zip(want, distinct)]
        exp_len = np.array(sizes, np.int64)[g_of_call] if len(gids) else np.zeros(0, np.int64)
        flat = np.array([r for w in distinct for r in w] + [-1], np.int64)
        off = np.cumsum([0] + [len(w) for w in distinct])[:-1].astype(np.int64)
        j = np.arange(n) - self.starts[self.call_of] if n else np.zeros(0, np.int64)
        at = np.where(self.count[self.call_of] == exp_len[self.call_of],
                      off[g_of_call][self.call_of] + j, len(flat) - 1) if n else j
        self.regular = (self.count == exp_len) & ~_any(flat[at] != self.rank, self.starts)
        self.any_open = _any(self.open, self.starts)
        sig_lo = np.minimum.reduceat(self.sig, self.starts) if n else self.sig
        sig_hi = np.maximum.reduceat(self.sig, self.starts) if n else self.sig
        self.disagree = (sig_lo != sig_hi) & (self.count >= 2)
        self.last_enter = np.maximum.reduceat(self.start, self.starts) if n else self.start

    def __len__(self) -> int:
        return len(self.starts)

    def find(self, group: int, seq: int) -> int | None:
        """The index of call (group, seq), by bisection."""
        lo = int(np.searchsorted(self.call_group, group, "left"))
        hi = int(np.searchsorted(self.call_group, group, "right"))
        i = lo + int(np.searchsorted(self.call_seq[lo:hi], seq, "left"))
        if i < hi and self.call_seq[i] == seq:
            return i
        return None

    def member(self, row: int) -> Member:
        v = self.values
        return Member(rank=int(self.rank[row]), enter_ns=int(self.start[row]),
                      end_ns=None if self.open[row] else int(self.end[row]), step=int(self.step[row]),
                      op=v[self.op[row]], sig=v[self.sig[row]], stack=v[self.stack[row]],
                      async_op=bool(self.async_op[row]))

    def call(self, i: int) -> MatchedCall:
        a = int(self.starts[i])
        group = int(self.call_group[i])
        return MatchedCall(group=group, seq=int(self.call_seq[i]), expected=self.expected.get(group, ()),
                           members=[self.member(r) for r in range(a, a + int(self.count[i]))])

    def in_reading_order(self, calls: np.ndarray) -> list[int]:
        return calls[np.argsort(self.first_seen[calls], kind="stable")].tolist()

    def interesting(self) -> list[int]:
        """Calls a hang, an incomplete call or a mismatch may be about, in reading order."""
        return self.in_reading_order(np.flatnonzero(~self.regular | self.any_open | self.disagree))

    def waits(self) -> np.ndarray:
        """Each member's wait for the last to arrive (MatchedCall.wait_ns)."""
        w = self.last_enter[self.call_of] - self.start
        w = np.where(self.open, w, np.minimum(w, self.end - self.start))
        return np.maximum(w, 0)


class CallMap(Mapping):
    """{(group, seq): MatchedCall}, each made when asked for; iterates in reading order."""

    def __init__(self, table: CallTable):
        self._t = table

    def __getitem__(self, key) -> MatchedCall:
        try:
            group, seq = key
            i = self._t.find(group, seq)
        except (TypeError, ValueError, OverflowError):
            raise KeyError(key) from None
        if i is None:
            raise KeyError(key)
        return self._t.call(i)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        t = self._t
        for i in t.in_reading_order(np.arange(len(t))):
            yield (int(t.call_group[i]), int(t.call_seq[i]))

    def __len__(self) -> int:
        return len(self._t)

    def values(self):
        t = self._t
        return [t.call(i) for i in t.in_reading_order(np.arange(len(t)))]

    def items(self):
        return [(c.key, c) for c in self.values()]


class P2PTable:
    """Sends and receives by (group, src, dst, seq); `send`/`recv`: the row of the last one
    read on each side, -1 where none."""

    def __init__(self, cols: dict[str, np.ndarray], values: list):
        self.values = values
        sending = np.array([not ops.receives(v) if type(v) is str else True for v in values])
        send = sending[cols["op"]] if len(cols["op"]) else np.zeros(0, bool)
        rank, peer = cols["rank"], cols["peer"]
        src = np.where(send, rank, peer)
        dst = np.where(send, peer, rank)
        order = np.lexsort((cols["read_at"], cols["seq"], dst, src, cols["group"]))
        for k, v in cols.items():
            setattr(self, k, v[order])
        self.src, self.dst, self.sending = src[order], dst[order], send[order]
        n = len(order)
        new = np.ones(n, bool)
        if n:
            new[1:] = ((self.group[1:] != self.group[:-1]) | (self.src[1:] != self.src[:-1])
                       | (self.dst[1:] != self.dst[:-1]) | (self.seq[1:] != self.seq[:-1]))
        self.starts = np.flatnonzero(new)
        key_of = np.cumsum(new) - 1
        self.send_row = _last_row(key_of, self.sending, len(self.starts))
        self.recv_row = _last_row(key_of, ~self.sending, len(self.starts))
        self.first_seen = np.minimum.reduceat(self.read_at, self.starts) if n else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.starts)

    def key(self, i: int) -> tuple[int, int, int, int]:
        a = self.starts[i]
        return (int(self.group[a]), int(self.src[a]), int(self.dst[a]), int(self.seq[a]))

    def find(self, key) -> int | None:
        group, src, dst, seq = key
        rows = self.starts
        lo, hi = 0, len(rows)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.key(mid) < (group, src, dst, seq):
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(rows) and self.key(lo) == (group, src, dst, seq) else None

    def member(self, row: int) -> Member | None:
        if row < 0:
            return None
        v = self.values
        return Member(rank=int(self.rank[row]), enter_ns=int(self.start[row]),
                      end_ns=None if self.open[row] else int(self.end[row]), step=int(self.step[row]),
                      op=v[self.op[row]], sig=v[self.sig[row]], stack=v[self.stack[row]],
                      async_op=bool(self.async_op[row]))

    def match(self, i: int) -> P2PMatch:
        group, src, dst, seq = self.key(i)
        return P2PMatch(group=group, src=src, dst=dst, seq=seq, send=self.member(int(self.send_row[i])),
                        recv=self.member(int(self.recv_row[i])))

    def in_reading_order(self, idx: np.ndarray) -> list[int]:
        return idx[np.argsort(self.first_seen[idx], kind="stable")].tolist()

    def interesting(self) -> list[int]:
        """Pairs with one side only, a side left open, or sides that disagree on what is
        sent, in reading order."""
        s, r = self.send_row, self.recv_row
        both = (s >= 0) & (r >= 0)
        si, ri = np.maximum(s, 0), np.maximum(r, 0)
        shapes_dtypes = np.array([_shapes_dtypes(v) for v in self.values], dtype=object)
        ids = {sd: i for i, sd in enumerate(dict.fromkeys(shapes_dtypes.tolist()))}
        sd = np.array([ids[x] for x in shapes_dtypes.tolist()], np.int64)
        differ = both & (sd[self.sig[si]] != sd[self.sig[ri]]) if len(s) else both
        stuck = both & (self.open[si] | self.open[ri])
        return self.in_reading_order(np.flatnonzero(~both | differ | stuck))


def _shapes_dtypes(v):
    return (v[1], v[2]) if type(v) is tuple and len(v) == 5 else None


class P2PMap(Mapping):
    """{(group, src, dst, seq): P2PMatch}, each made when asked for; iterates in reading order."""

    def __init__(self, table: P2PTable):
        self._t = table

    def __getitem__(self, key) -> P2PMatch:
        try:
            i = self._t.find(tuple(key))
        except (TypeError, ValueError):
            raise KeyError(key) from None
        if i is None:
            raise KeyError(key)
        return self._t.match(i)

    def __iter__(self):
        t = self._t
        for i in t.in_reading_order(np.arange(len(t))):
            yield t.key(i)

    def __len__(self) -> int:
        return len(self._t)

    def values(self):
        t = self._t
        return [t.match(i) for i in t.in_reading_order(np.arange(len(t)))]

    def items(self):
        return [(p.key, p) for p in self.values()]


def _by_call(group: np.ndarray, seq: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The order sorting rows by (group, seq, rank), rows read earlier first among equals.
    One sort of an int64 key where the numbers allow it (rows come rank by rank)."""
    n = len(group)
    if n and (np.all(rank[1:] >= rank[:-1]) and int(group.min()) >= 0 and int(group.max()) < 1 << 22
              and int(seq.min()) >= 0 and int(seq.max()) < 1 << 40):
        return np.argsort((group << 40) | seq, kind="stable")
    return np.lexsort((rank, seq, group))


def _any(flags: np.ndarray, starts: np.ndarray) -> np.ndarray:
    if not len(flags):
        return np.zeros(len(starts), bool)
    return np.logical_or.reduceat(flags, starts)


def _last_row(key_of: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
    """For each key, the last row (in sorted order) where `mask` holds, else -1."""
    out = np.full(n, -1, np.int64)
    rows = np.flatnonzero(mask)
    out[key_of[rows]] = rows  # later rows overwrite earlier ones
    return out
