"""The `prism-rr` command: parses arguments, calls the library, maps errors to exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from prism_rr._version import __version__
from prism_rr.errors import PrismError, exit_code_for

EXIT_CODES = """\
Exit codes: 0 ok · 1 any other failure · 2 usage error · 3 replay diverged ·
4 bundle malformed or of an unsupported version."""

app = typer.Typer(
    name="prism-rr",
    help=(
        "Record a short window of a multi-rank PyTorch run into a portable bundle, "
        "and inspect it.\n\n"
        "A bundle (.prism) holds, per rank, every collective and point-to-point call "
        "with its group, sequence number, shapes and timing, the compute between them, "
        "step boundaries and memory.\n\n"
        "Start with:  prism-rr info run.prism   ·   prism-rr verify run.prism"
    ),
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _say(message: str) -> None:
    """People read stderr; stdout is kept for data."""
    print(message, file=sys.stderr)


def _version(value: bool) -> None:
    if value:
        print(f"prism-rr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_version, is_eager=True
    ),
) -> None:
    pass


@app.command(epilog=EXIT_CODES)
def info(
    bundle: Path = typer.Argument(..., help="The .prism bundle to describe."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Describe a bundle: format, world, ranks, steps, events, size (reads no chunks)."""
    from prism_rr.format import open_bundle

    with open_bundle(bundle) as b:
        facts = bundle_facts(b)
    if as_json:
        print(json.dumps(facts))
        return
    steps = facts["steps"]
    lines = [
        f"bundle          {bundle}",
        f"format          {facts['format_version']} ({facts['tool']})",
        f"world size      {facts['world_size']}",
        f"recorded ranks  {_ranges(facts['recorded_ranks'])} ({len(facts['recorded_ranks'])})",
        f"groups          {facts['groups']}",
        f"steps           {_ranges(steps) if steps else 'none'}",
        f"events          {facts['event_count']:,}",
        f"size            {facts['bytes']:,} bytes"
        + (f" ({facts['bytes'] / facts['event_count']:.1f} per event)" if facts["event_count"] else ""),
    ]
    if facts["dropped"]:
        lines.append(f"dropped         {facts['dropped']:,} records (the recorder fell behind)")
    if facts["truncated_ranks"]:
        lines.append(f"truncated       ranks {_ranges(facts['truncated_ranks'])} lost the tail of their spool")
    if facts["open_calls"]:
        lines.append(f"never completed {facts['open_calls']} calls (a hang or a kill)")
    print("\n".join(lines))


def bundle_facts(b) -> dict:
    """The facts `info --json` prints."""
    ranks = b.summaries["ranks"]
    return {
        "path": str(b.path),
        "format_version": b.format_version,
        "tool": b.manifest.get("tool", "unknown"),
        "world_size": b.world_size,
        "recorded_ranks": b.recorded_ranks,
        "groups": len(b.groups),
        "steps": b.steps,
        "event_count": b.event_count,
        "bytes": b.size,
        "dropped": sum(int(r.get("dropped", 0) or 0) for r in ranks.values()),
        "truncated_ranks": sorted(r for r, s in ranks.items() if s.get("truncated")),
        "open_calls": sum(int(r.get("open", 0) or 0) for r in ranks.values()),
    }


def _ranges(values: list[int]) -> str:
    """[0,1,2,3,7] -> '0-3,7'."""
    out = []
    for v in sorted(values):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


@app.command(epilog=EXIT_CODES)
def verify(bundle: Path = typer.Argument(..., help="The .prism bundle to check.")) -> None:
    """Check every checksum, index entry, record and blob of a bundle."""
    from prism_rr.format import open_bundle
    from prism_rr.format import verify as verify_bundle

    with open_bundle(bundle) as b:
        report = verify_bundle(b)
    _say(
        f"{bundle}: ok ({report.sections} sections, {report.chunks} chunks, "
        f"{report.events:,} records, {report.blobs} blobs)"
    )


@app.command(epilog=EXIT_CODES)
def pack(
    spool_dir: Path = typer.Argument(..., help="A directory of rank-*.spool files (run.prism.d/)."),
    output: Path = typer.Option(..., "-o", "--output", help="The bundle to write."),
) -> None:
    """Pack a directory of spools into one portable bundle.

    Chunks are copied as they are; a spool with a torn tail is packed up to its last
    complete frame and its rank is marked truncated.
    """
    from prism_rr.format import pack as pack_spools

    result = pack_spools(spool_dir, output, progress=_progress("packing ranks"))
    for rank, why in sorted(result.torn.items()):
        _say(f"warning: rank {rank}: tail dropped ({why})")
    _say(f"wrote {output}: {result.ranks} ranks, {result.events:,} records, {result.bytes:,} bytes")


@app.command(epilog=EXIT_CODES)
def repair(
    spool_dir: Path = typer.Argument(..., help="A directory of rank-*.spool files."),
) -> None:
    """Cut torn or corrupt tails off spools, keeping every complete frame.

    The removed bytes are kept beside each spool as <name>.torn.
    """
    from prism_rr.errors import UsageError
    from prism_rr.format import repair_spool

    if not spool_dir.is_dir():
        raise UsageError(f"{spool_dir} is not a directory of spools")
    paths = sorted(spool_dir.glob("rank-*.spool"))
    if not paths:
        raise UsageError(f"{spool_dir} holds no rank-*.spool files")
    repaired = 0
    for path in paths:
        scan = repair_spool(path)
        if scan.torn:
            repaired += 1
            _say(f"{path.name}: kept {len(scan.frames)} frames ({scan.good_bytes:,} bytes), "
                 f"cut {scan.size - scan.good_bytes:,} bytes: {scan.problem}")
    _say(f"{len(paths)} spools checked, {repaired} repaired")


def _progress(label: str):
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\r{label}: {done}/{total}", end=end, file=sys.stderr, flush=True)

    return show


def main() -> None:
    """Entry point: one line on stderr for a user error, never a traceback."""
    try:
        app()  # click's standalone mode prints usage errors and exits 2 itself
    except PrismError as exc:
        _say(f"prism-rr: error: {exc}")
        sys.exit(exit_code_for(exc))
    except OSError as exc:
        _say(f"prism-rr: error: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
