"""What a replay whose program is the bundle (driver.py) says of this machine's backend.

Per kind of call (op, group size, bytes), the recorded transfer time against the replayed
one, over the calls on groups whose members are all real here (the backend's own time: a
call with virtual members takes the recorded time by construction); and how many calls'
outputs were compared with the recording. Each real rank keeps a `Transfers` and writes
its `facts()`; the launcher merges them (`merged`) into the report, and `card_lines` says
them. Torch-free.
"""

from __future__ import annotations

from statistics import median

from prism_rr.text import human_bytes, shown

__all__ = ["OUTPUT_FIELDS", "Transfers", "card_lines", "merged"]

OUTPUT_FIELDS = ("digest_out", "payload_out")  # a divergence's field where an output differs

_KINDS = 256  # kinds of call a rank keeps
_SAMPLES = 128  # calls of one kind whose times a rank keeps (the first ones)
_SHOWN = 6  # kinds the card shows (the ones that took longest in all)


class Transfers:
    """One real rank's calls on all-real groups, by kind, and its output comparisons."""

    def __init__(self):
        self.kinds: dict[tuple[str, int, int], list] = {}  # -> [calls, recorded ns list, replayed ns list]
        self.outputs_checked = 0

    def add(self, op: str, size: int, nbytes: int, recorded_ns: int, replayed_ns: int) -> None:
        key = (op, size, nbytes)
        row = self.kinds.get(key)
        if row is None:
            if len(self.kinds) >= _KINDS:
                return
            row = self.kinds[key] = [0, [], []]
        row[0] += 1
        if len(row[1]) < _SAMPLES:
            row[1].append(recorded_ns)
            row[2].append(replayed_ns)

    def facts(self) -> dict:
        return {"kinds": [[op, size, nbytes, *row] for (op, size, nbytes), row in self.kinds.items()],
                "outputs_checked": self.outputs_checked}


def _int(v) -> bool:
    return type(v) is int


def merged(stats: dict[int, dict]) -> dict | None:
    """The real ranks' `facts()` as one table, or None where no rank ran the bundle as its
    program. Rows: op, group size, bytes, calls, recorded and replayed median (us), their
    ratio; the longest in all first."""
    facts = [st["program"] for st in stats.values() if isinstance(st.get("program"), dict)]
    if not facts:
        return None
    kinds: dict[tuple, list] = {}
    checked = 0
    for f in facts:
        checked += f.get("outputs_checked", 0) if _int(f.get("outputs_checked")) else 0
        for row in f.get("kinds") or ():
            if not (isinstance(row, list) and len(row) == 6 and _int(row[1]) and _int(row[2]) and _int(row[3])):
                continue
            got = kinds.setdefault((str(row[0]), row[1], row[2]), [0, [], []])
            got[0] += row[3]
            got[1] += [v for v in row[4] if _int(v)]
            got[2] += [v for v in row[5] if _int(v)]
    rows = []
    for (op, size, nbytes), (calls, rec, rep) in kinds.items():
        a, b = (median(v) if v else None for v in (rec, rep))
        rows.append({"op": op, "group_size": size, "bytes": nbytes, "calls": calls,
                     "recorded_us": None if a is None else a / 1e3, "replayed_us": None if b is None else b / 1e3,
                     "ratio": None if not a or b is None else b / a})
    rows.sort(key=lambda r: -(r["replayed_us"] or 0) * r["calls"])
    return {"transfers": rows, "outputs_checked": checked}


def card_lines(program: dict | None, divergence: dict | None) -> list[str]:
    """The card's lines for a replay whose program was the bundle: the transfer table's
    longest kinds, and the outputs compared, with the torch recorded and here (a first
    `divergence` in an output: the backend computed it otherwise)."""
    if not program:
        return []
    was, now = shown(program.get("torch_recorded") or "unknown"), program.get("torch_here") or "unknown"
    lines = []
    rows = program.get("transfers") or []
    if rows:
        lines.append("  transfers on this machine's backend (groups of real ranks; median a call, recorded -> "
                     "replayed):")
        for r in rows[:_SHOWN]:
            ratio = f" (x{r['ratio']:.2f})" if r["ratio"] is not None else ""
            lines.append(f"    {shown(r['op'])} on {r['group_size']} ranks, {human_bytes(r['bytes'])}: "
                         f"{r['recorded_us']:.0f} -> {r['replayed_us']:.0f} us{ratio}, {r['calls']} calls")
        if len(rows) > _SHOWN:
            lines.append(f"    ... and {len(rows) - _SHOWN} more kinds (the report's bundle_program.transfers)")
    n = program.get("outputs_checked") or 0
    if divergence is not None and str(divergence.get("what")) in OUTPUT_FIELDS:
        lines.append(f"  an output differs where every input was the recorded one: this machine's backend "
                     f"computed it otherwise (torch {was} recorded, {now} here)")
    elif n:
        lines.append(f"  outputs of {n} calls among real ranks as recorded (torch {was} recorded, {now} here)")
    return lines
