"""The command palette's searches: ranks, groups and ops of the bundle.

Op names and group descriptions are the bundle's: a hit shows them as text, made safe
(`shown`), never as markup (textual's own `Matcher.highlight` reads its candidate as
markup: `_highlight` does what it does on plain text).
"""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.fuzzy import Matcher

from prism_rr.text import shown

__all__ = ["BundleCommands"]

MAX_GROUP_HITS = 40


def _highlight(matcher: Matcher, text: str) -> Content:
    """`text` as plain content, the letters the query matched in the match style."""
    content = Content(text)
    score, offsets = matcher.fuzzy_search.match(matcher.query, text)
    if score:
        for offset in offsets:
            if not text[offset].isspace():
                content = content.stylize(matcher.match_style, offset, offset + 1)
    return content


def _group_text(gid: int, g: dict) -> str:
    return f"group {gid} {shown(g.get('desc', ''), 120)} ({len(g['ranks'])} ranks)"


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
            yield DiscoveryHit(Content(f"op {shown(op, 60)}"), partial(app.next_op, op),
                               help="next call of this op on the cursor rank")
        for gid, g in list(app.model.groups.items())[:MAX_GROUP_HITS]:
            yield DiscoveryHit(Content(_group_text(gid, g)), partial(app.show_group, gid),
                               help="this group's collectives")

    async def search(self, query: str) -> Hits:
        app = self.app
        tm = app.model
        matcher = self.matcher(query)
        digits = "".join(ch for ch in query if ch.isdigit())
        if digits and int(digits) in tm.row_of:
            text = f"rank {int(digits)}"
            yield Hit(max(matcher.match(text), 0.5), _highlight(matcher, text),
                      partial(app.show_call, int(digits)), help="show this rank in the timeline")
        for op in self._ops():
            text = f"op {shown(op, 60)}"
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, _highlight(matcher, text), partial(app.next_op, op),
                          help="next call of this op on the cursor rank")
        hits = 0
        for gid, g in tm.groups.items():
            if digits and str(gid) != digits and len(tm.groups) > MAX_GROUP_HITS:
                continue  # in a large world a number names one group, not thousands
            text = _group_text(gid, g)
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, _highlight(matcher, text), partial(app.show_group, gid),
                          help="this group's collectives")
                hits += 1
                if hits >= MAX_GROUP_HITS:
                    break
