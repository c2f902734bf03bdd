"""Strings from a bundle, made safe to put before a person: the one rule, in one place.

A bundle arrives attached to a bug report, so every string in it is a stranger's: a tool
line, an argv, a group description or a stack frame may carry terminal escape sequences
(`ESC ] 0 ; title BEL` retitles the window, `ESC [ 2 J` clears the screen, the 8-bit CSI
`\\x9b` does both on some terminals), bidi overrides that make a line read other than it
is, or a megabyte where a word belongs. `shown` is what every line for people, every error
message that quotes a bundle and every screen of the terminal UI passes such a string
through, to be cut to its place. The escaping itself is applied where format/ hands a
string out (`safe`: the reader's manifest, rank info and groups, every record's text
fields), so nothing downstream sees a raw one; `--json` gives those escaped strings whole.

It stands on the lowest floor, beside `errors` (whose messages it makes one printable
line), below `format/` and everything that shows a bundle's strings.
"""

from __future__ import annotations

__all__ = ["LIMIT", "human_bytes", "quoted", "safe", "shown"]

LIMIT = 200  # characters of one value shown before it is cut


def shown(value: object, limit: int | None = LIMIT) -> str:
    """`value` as text safe for a terminal and for people: every character that is not
    printable (C0 and C1 controls, DEL, bidi overrides, isolates and marks, zero-width
    and other format characters, line and paragraph separators, unassigned code points)
    escaped as `\\x1b`, `\\u202e`, ...; what comes past `limit` characters of that
    cut off, with a marker saying how much of the value was left out (None: never cut,
    for a line whose values were cut already). Anything not a string is shown as `str()`
    shows it. Text it returned, shown again with no limit, comes back unchanged."""
    text = value if type(value) is str else str(value)
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text  # what nearly every string is: no copy
    if limit is None:
        return "".join(c if c.isprintable() else _escaped(c) for c in text)
    out: list[str] = []
    size = 0
    for i, c in enumerate(text):
        piece = c if c.isprintable() else _escaped(c)
        if size + len(piece) > limit:
            return "".join(out) + f"...[{len(text) - i:,} more characters]"
        out.append(piece)
        size += len(piece)
    return "".join(out)


def quoted(value: object, limit: int | None = LIMIT) -> str:
    """`value` shown (see `shown`) between single quotes: how an error message names a
    bundle's string, so that an empty or blank one is still seen."""
    return f"'{shown(value, limit)}'"


def safe(value):
    """`value` as `format/` hands it to the rest of the code: every string in it (a
    container's items, keys and values too) with its unprintable characters escaped as
    `shown` escapes them, never cut, but for line breaks and tabs: a crash report's lines
    stay lines for what reads them line by line, and `shown` escapes them where a value is
    put on one line. What holds no such character comes back as it is, the same object,
    so a bundle of plain strings costs one `isprintable()` a string. The raw value stays
    reachable by name only where a command needs it (`Bundle.raw_rank_info`: a replay's
    argument vector and environment)."""
    kind = type(value)
    if kind is str:
        if value.isprintable():
            return value
        return "".join(c if c.isprintable() or c in "\n\t" else _escaped(c) for c in value)
    if kind is tuple or kind is list:
        items = [safe(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else kind(items)
    if kind is dict:
        pairs = [(safe(k), safe(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items())):
            return value
        return dict(pairs)
    return value


def _escaped(c: str) -> str:
    n = ord(c)
    if n < 0x100:
        return {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(c, f"\\x{n:02x}")
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def human_bytes(n) -> str:
    """8388608 -> 8.0 MiB; small sizes in bytes."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
