"""The command palette's searches: ranks, groups and ops of the bundle."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

__all__ = ["BundleCommands"]

MAX_GROUP_HITS = 40


class BundleCommands(Provider):
    def _ops(self) -> list[str]:
        app = self.app
        tm = app.model
        ops: set[str] = set()
        for r in {tm.ranks[0], app.cursor_rank()} if tm.ranks else ():
            for rec in tm.load(r).records:
                op = getattr(rec, "op", None)
                if op:
                    ops.add(op)
        return sorted(ops)

    async def discover(self) -> Hits:
        app = self.app
        for op in self._ops():
            yield DiscoveryHit(f"op {op}", partial(app.next_op, op), help="next call of this op on the cursor rank")
        for gid, g in list(app.model.groups.items())[:MAX_GROUP_HITS]:
            yield DiscoveryHit(f"group {gid} {g.get('desc', '')} ({len(g['ranks'])} ranks)",
                               partial(app.show_group, gid), help="this group's collectives")

    async def search(self, query: str) -> Hits:
        app = self.app
        tm = app.model
        matcher = self.matcher(query)
        digits = "".join(ch for ch in query if ch.isdigit())
        if digits and int(digits) in tm.row_of:
            text = f"rank {int(digits)}"
            yield Hit(max(matcher.match(text), 0.5), matcher.highlight(text),
                      partial(app.show_call, int(digits)), help="show this rank in the timeline")
        for op in self._ops():
            text = f"op {op}"
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(app.next_op, op),
                          help="next call of this op on the cursor rank")
        hits = 0
        for gid, g in tm.groups.items():
            if digits and str(gid) != digits and len(tm.groups) > MAX_GROUP_HITS:
                continue  # in a large world a number names one group, not thousands
            text = f"group {gid} {g.get('desc', '')} ({len(g['ranks'])} ranks)"
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(app.show_group, gid),
                          help="this group's collectives")
                hits += 1
                if hits >= MAX_GROUP_HITS:
                    break
