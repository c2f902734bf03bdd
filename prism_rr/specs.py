"""The small specs users write: ranks "0,2,4-7", steps "A:B", bandwidth "50GB/s", slow ranks "R:F",
replaced ranks "R@STEP".

One parser each, shared by the recorder, the replayer, the API and the CLI; torch-free.
"""

from __future__ import annotations

import re

from prism_rr.errors import UsageError

__all__ = ["format_ranks", "named_ranks", "parse_bandwidth", "parse_ranks", "parse_replace_rank", "parse_slow_rank",
           "parse_steps", "step_window"]


def parse_steps(spec) -> tuple[int | None, int | None] | None:
    """"A:B" (B excluded, either side may be empty), "A" (one step), or a pair."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, (tuple, list)):
        lo, hi = spec
    elif isinstance(spec, int):
        lo, hi = spec, spec + 1
    else:
        text = str(spec).strip()
        try:
            if ":" in text:
                a, b = text.split(":", 1)
                lo = int(a) if a.strip() else None
                hi = int(b) if b.strip() else None
            else:
                lo = int(text)
                hi = lo + 1
        except ValueError:
            raise UsageError(f"steps must look like A:B, not {spec!r}") from None
    if lo is not None and lo < 0 or hi is not None and hi < 0:
        raise UsageError(f"steps must not be negative: {spec!r}")
    if lo is not None and hi is not None and hi <= lo:
        raise UsageError(f"empty step window {spec!r}")
    return (lo, hi)



def step_window(spec) -> tuple[int, int] | None:
    """parse_steps's "A:B" (B excluded) as the steps a..b both included that the analysis
    functions take (an open end: from step 0, or to the last)."""
    window = parse_steps(spec)
    if window is None:
        return None
    lo, hi = window
    return (lo or 0, (hi - 1) if hi is not None else 2**31 - 1)

def parse_ranks(spec) -> tuple[int, ...] | None:
    """"0,2,4-7", an int, or an iterable of ints -> sorted ranks; None (or "") means every rank."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, int):
        return (spec,)
    if not isinstance(spec, str):
        return tuple(sorted({int(r) for r in spec}))
    ranks: set[int] = set()
    try:
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                ranks.update(range(int(a), int(b) + 1))
            else:
                ranks.add(int(part))
    except ValueError:
        raise UsageError(f"ranks must look like 0,2,4-7, not {spec!r}") from None
    if any(r < 0 for r in ranks):
        raise UsageError(f"ranks must not be negative: {spec!r}")
    return tuple(sorted(ranks))


def format_ranks(values) -> str:
    """The inverse of parse_ranks: [0,1,2,3,7] -> '0-3,7'."""
    out: list[list[int]] = []
    for v in sorted(values):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def named_ranks(values) -> str:
    """'rank 0', 'ranks 0-3,7': ranks in words, never a count that reads as a rank."""
    values = sorted(values)
    return f"rank {values[0]}" if len(values) == 1 else f"ranks {format_ranks(values)}"


def parse_slow_rank(spec) -> tuple[tuple[int, float], ...]:
    """{rank: factor}, pairs, or "R:F,R:F" -> sorted (rank, factor) pairs."""
    if not spec:
        return ()
    if isinstance(spec, str):
        pairs = []
        for part in spec.split(","):
            if not part.strip():
                continue
            try:
                r, f = part.split(":")
                pairs.append((int(r), float(f)))
            except ValueError:
                raise UsageError(f"slow_rank must look like R:F[,R:F], not {spec!r}") from None
    elif isinstance(spec, dict):
        pairs = [(int(r), float(f)) for r, f in spec.items()]
    else:
        pairs = [(int(r), float(f)) for r, f in spec]
    return tuple(sorted(pairs))


def parse_replace_rank(spec) -> tuple[tuple[int, int], ...]:
    """"R@STEP[,R@STEP]", a list of those (a repeated option), {rank: step}, or pairs ->
    sorted (rank, step) pairs, each once."""
    if not spec:
        return ()
    if isinstance(spec, dict):
        items = list(spec.items())
    elif isinstance(spec, str):
        items = [spec]
    else:
        items = list(spec)
    pairs = set()
    for item in items:
        if isinstance(item, str):
            for part in item.split(","):
                if not part.strip():
                    continue
                try:
                    r, s = part.split("@")
                    pairs.add((int(r), int(s)))
                except ValueError:
                    raise UsageError(f"replace_rank must look like R@STEP (rank R replaced at step STEP), "
                                     f"not {part.strip()!r}") from None
        else:
            try:
                r, s = item
                pairs.add((int(r), int(s)))
            except (TypeError, ValueError):
                raise UsageError(f"replace_rank takes R@STEP or (rank, step) pairs, not {item!r}") from None
    negative = [p for p in sorted(pairs) if p[0] < 0 or p[1] < 0]
    if negative:
        raise UsageError(f"replace_rank must not be negative: {negative[0][0]}@{negative[0][1]}")
    return tuple(sorted(pairs))


def parse_bandwidth(text: str) -> float:
    """'50GB/s', '400Gb/s', '25e9', '1.5G' -> bytes per second (b: bits; K, M, G, T: 10^3k)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)([bB]?)(?:/s|ps)?\s*", text)
    if not m:
        raise UsageError(f"a bandwidth looks like 50GB/s, 400Gb/s or 25e9, not {text!r}")
    value = float(m.group(1)) * 1000 ** " KMGT".index(m.group(2).upper() or " ")
    if m.group(3) == "b":
        value /= 8
    if value <= 0:
        raise UsageError(f"bandwidth must be positive, not {text!r}")
    return value
