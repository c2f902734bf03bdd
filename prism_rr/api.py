"""The library's face for whole jobs: record a command into a bundle, pack, repair, verify,
export, replay and scale. The CLI and the demo call these; none of them prints or exits.

    result = record(["python", "train.py"], "run.prism", nproc=4, steps="1:4")
    if result.packed is None:  # a full disk: the spools wait in result.spool_dir
        ...

Errors are `prism_rr.errors` exceptions; what a user should hear about comes back as data
(or, where it must be heard before the work goes on, through a `warn` callback).
Importing this module is cheap: each function loads what it needs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from prism_rr.errors import UsageError
from prism_rr.localrun import describe_exit
from prism_rr.recorder.launch import spool_dir_for
from prism_rr.specs import parse_bandwidth, parse_ranks, step_window

if TYPE_CHECKING:
    from prism_rr.format import PackResult, VerifyReport
    from prism_rr.format.spool import SpoolScan
    from prism_rr.replayer import ReplayResult

__all__ = [
    "RecordResult",
    "check_replayable",
    "export",
    "pack",
    "record",
    "recorded_commands",
    "repair",
    "replay",
    "scale",
    "spool_dir_for",
    "verify",
]

Progress = Callable[[int, int], None]  # (done, total)
Warn = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordResult:
    """How a recording ended: the program's exit code, and the bundle or where the spools wait."""

    output: Path
    spool_dir: Path
    exit_code: int | None  # the program's (128+N: killed by signal N); None: the recording itself failed
    packed: PackResult | None = None  # None: no bundle was written (see `error`)
    error: OSError | None = None  # what stopped the recording (exit_code None) or the packing
    spools_left: bool = False  # rank spools wait in spool_dir, for `prism-rr pack` elsewhere
    recorder_failures: tuple[dict, ...] = ()  # ranks whose recorder turned itself off: {rank, step, reason}
    readback_error: str | None = None  # the bundle was written but could not be read back
    warnings: tuple[str, ...] = ()  # every warning also passed to `warn`, in order
    node: str | None = None  # one node of a multi-node job: its spools are in spool_dir, not packed
    pack_command: str | None = None  # what packs every node's spools, once they are in one place
    flight: tuple[Path, ...] | None = None  # flight mode: the bundles its triggers wrote (None: not flight)


def record(
    cmd: Sequence[str],
    output,
    *,
    steps=None,
    ranks=None,
    payload: str | None = None,
    ops: bool = False,
    memory: bool = False,
    nproc: int = 0,
    slice: str | None = None,
    mesh: str | None = None,
    timeout: float | None = None,
    node: str | None = None,
    warn: Warn | None = None,
    progress: Progress | None = None,
    **options,
) -> RecordResult:
    """Run `cmd` with every rank recording into `<output>.d/`, then pack the spools into `output`.

    `nproc` > 0 starts that many local ranks with torchrun's environment around `cmd`.
    `options` are more recorder settings (`RecordOptions.make`'s), passed on to the ranks.
    One node of a multi-node job (`cmd` a torchrun launch of more than one node, or
    `node` given; see `prism_rr.recorder.launch.launch_node`) records into
    `<output>.d/node-<name>/` and packs nothing: this node cannot know when the others
    are done. The result's `pack_command` packs them all once every node has finished and
    the node directories are in one place (at once, on a shared file system).
    A failing program still yields a bundle (its code is in the result). A failed write
    (a full or read-only disk) yields a result without `packed`, naming where the spools
    are; the half-written files are removed. Raises UsageError when nothing was recorded.
    `warn` hears, as they happen, the warnings that come before packing.
    """
    from prism_rr.format import open_bundle
    from prism_rr.format import pack as pack_spools
    from prism_rr.recorder.launch import launch_node, node_spool_dir, record_command

    if not cmd:
        raise UsageError("give the training command after --, e.g. prism-rr record -o run.prism -- torchrun ...")
    if nproc < 0:
        raise UsageError("--nproc must be 0 or more")
    if slice is not None and nproc:
        from prism_rr.topology.roles import parse_mesh

        parse_mesh(mesh or "", nproc)  # a wrong layout fails now, not in every rank
    cmd = list(cmd)
    if nproc:
        cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(nproc), "--", *cmd]
    output = Path(output)
    name = launch_node(cmd, node)
    spool_dir = node_spool_dir(output, name)
    flight = options.get("flight") is not None
    if flight:
        options["output"] = str(output.resolve())  # where rank 0 packs a dump
    warnings: list[str] = []

    def warning(message: str) -> None:
        warnings.append(message)
        if warn is not None:
            warn(message)

    def spools_left() -> bool:
        return any(spool_dir.glob("rank-*.spool"))

    try:
        code = record_command(cmd, output, steps=steps, ranks=ranks, payload=payload, ops=ops,
                              memory=memory, slice=slice, mesh=mesh, timeout=timeout, node=node, **options)
    except OSError as exc:
        _remove_half_written(spool_dir, output)
        return RecordResult(output=output, spool_dir=spool_dir, exit_code=None, error=exc,
                            spools_left=spools_left(), warnings=tuple(warnings))
    if code != 0:
        warning(f"the command exited with code {describe_exit(code)}"
                + ("; packing what was recorded" if name is None else ""))
    if flight:
        return _flight_result(output, spool_dir, code, warnings, options["flight"])
    if not spools_left():
        raise UsageError(
            f"nothing was recorded: no rank called torch.distributed.init_process_group "
            f"(is CMD a PyTorch distributed program? exit code {code})"
        )
    if name is not None:
        import shlex

        command = f"prism-rr pack {shlex.quote(str(spool_dir_for(output)))} -o {shlex.quote(str(output))}"
        return RecordResult(output=output, spool_dir=spool_dir, exit_code=code, spools_left=True,
                            warnings=tuple(warnings), node=name, pack_command=command)
    try:
        extra = None
        if slice is not None:
            from prism_rr.topology.roles import spool_roles

            roles = spool_roles(spool_dir, mesh, extra=parse_ranks(ranks) or ())
            extra = {"roles": roles} if roles is not None else None
            if roles is None:
                warning("--slice roles: no layout was found (no DeviceMesh, and the groups form no mesh); "
                        "every rank was recorded")
        packed = pack_spools(spool_dir, output, manifest_extra=extra, progress=progress)
    except OSError as exc:
        # A full disk (or a read-only one): the training's outcome and the spools are what
        # matter now; the caller says where the spools are and how to pack them elsewhere.
        _remove_half_written(spool_dir, output)
        return RecordResult(output=output, spool_dir=spool_dir, exit_code=code, error=exc,
                            spools_left=True, warnings=tuple(warnings))
    failures: list[dict] = []
    readback_error = None
    try:
        with open_bundle(output) as b:
            failures = b.facts()["recorder_failures"]
    except Exception as exc:  # the bundle is written; what it says of failures is a bonus
        readback_error = str(exc)
    return RecordResult(output=output, spool_dir=spool_dir, exit_code=code, packed=packed,
                        spools_left=True, recorder_failures=tuple(failures),
                        readback_error=readback_error, warnings=tuple(warnings))


def _flight_result(output: Path, spool_dir: Path, code: int, warnings: list[str], steps: int) -> RecordResult:
    """After a flight run: the dumps' bundles (those the triggers left unpacked packed now)."""
    from prism_rr.recorder import finish_flight

    if not any(any(spool_dir.glob(pattern)) for pattern in ("rank-*.ring", "rank-*.crash", "flight-*")):
        raise UsageError(
            f"nothing was recorded: no rank called torch.distributed.init_process_group "
            f"(is CMD a PyTorch distributed program? exit code {code})"
        )
    bundles = finish_flight(spool_dir, output, steps)
    return RecordResult(output=output, spool_dir=spool_dir, exit_code=code, warnings=tuple(warnings),
                        flight=tuple(bundles))


def _remove_half_written(spool_dir: Path, output: Path) -> None:
    """Remove the half-written files a failed write leaves: the bundle's `.partial`, and
    `.tmp` files in the spool directory (the spools and whole blobs stay)."""
    for path in [output.with_name(output.name + ".partial"), *spool_dir.glob("*.tmp"),
                 *spool_dir.glob("blobs/*/*.tmp")]:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def pack(spool_dir, output, *, redact: bool = False, stacks: bool = True,
         progress: Progress | None = None) -> PackResult:
    """Pack a directory of spools, or several (one per node of a multi-node job; a
    directory of `node-*/` directories stands for them), into one bundle; with `redact`,
    a copy safe to make public (see `prism_rr.format.redact`), its `bytes` the redacted
    file's size."""
    from prism_rr.format import pack as pack_spools

    output = Path(output)
    target = output.with_name(output.name + ".unredacted") if redact else output
    dirs = spool_dir if isinstance(spool_dir, (list, tuple)) else Path(spool_dir)
    result = pack_spools(dirs, target, progress=progress)
    if not redact:
        return result
    from prism_rr.format.redact import redact as redact_bundle

    try:
        redact_bundle(target, output, stacks=stacks)
    finally:
        target.unlink(missing_ok=True)
    return replace(result, path=output, bytes=output.stat().st_size)


def repair(spool_dir) -> list[tuple[Path, SpoolScan]]:
    """Cut torn or corrupt tails off every rank-*.spool in `spool_dir` (or in its node-*/
    directories, as `pack` finds them; the cut bytes are kept beside each as <name>.torn);
    each spool with what its scan found."""
    from prism_rr.format import repair_spool
    from prism_rr.format.pack import spool_dirs

    paths = [path for d in spool_dirs(Path(spool_dir)) for path in sorted(d.glob("rank-*.spool"))]
    return [(path, repair_spool(path)) for path in paths]


def verify(bundle) -> VerifyReport:
    """Check every checksum, index entry, record and blob of a bundle; raises FormatError."""
    from prism_rr.format import open_bundle
    from prism_rr.format import verify as verify_bundle

    with open_bundle(bundle) as b:
        return verify_bundle(b)


def export(bundle, output, *, fmt: str = "chrome", ranks=None, steps=None, gzip: bool | None = None) -> dict:
    """Write `bundle` in format `fmt`, only `ranks` ("0,2,4-7") and `steps` ("A:B", B
    excluded) if given; returns what was written. chrome: a trace file for Perfetto
    ({events, ranks, flows}; gzipped if `gzip`, or if None when `output` ends in .gz).
    chakra: `output`.<rank>.et and `output`.comm_groups.json ({files, nodes, comp, comm,
    unmapped}). parquet: tables in the directory `output` (rows per table)."""
    from prism_rr.analysis import export_chakra, export_chrome, export_parquet
    from prism_rr.format import open_bundle

    if fmt not in ("chrome", "chakra", "parquet"):
        raise UsageError(f"--format must be chrome, chakra or parquet, not {fmt!r}")
    window = step_window(steps)
    rank_list = list(parse_ranks(ranks)) if ranks else None
    with open_bundle(bundle) as b:
        if fmt == "chrome":
            return export_chrome(b, output, ranks=rank_list, steps=window, gzip=gzip)
        writer = export_chakra if fmt == "chakra" else export_parquet
        return writer(b, output, ranks=rank_list, steps=window)


def replay(bundle, **options) -> ReplayResult:
    """Replay `bundle`: some ranks for real, the others as virtual peers; the options are
    `prism_rr.replayer.replay`'s. Never raises on a divergence: see the result's exit_code."""
    from prism_rr.replayer import replay as run_replay

    check_replayable(bundle)
    return run_replay(bundle, **options)


def recorded_commands(bundle, ranks=(0,)) -> dict[int, tuple[list[str], str]]:
    """What a replay with run_recorded_command=True would run for each rank: (argv, cwd),
    for showing to a user before they agree to run it."""
    from prism_rr.replayer.launch import recorded_commands as commands

    check_replayable(bundle)
    return commands(bundle, ranks)


def check_replayable(bundle) -> None:
    """UsageError for a bundle replay cannot run: one imported from another tool's dumps
    (`prism-rr import fr`) holds no command, payloads or steps to replay."""
    from prism_rr.format import open_bundle

    with open_bundle(bundle) as b:
        imported = b.manifest.get("imported")
    if isinstance(imported, dict):
        raise UsageError(f"{Path(bundle).name} was imported from PyTorch Flight Recorder dumps, which hold no "
                         f"command, payloads or steps: replay cannot run it (info, diagnose, export, tui and "
                         f"diff read it)")


def scale(bundle, output, *, dp: int, tp: int | None = None, pp: int | None = None, mesh=None,
          latency: str = "constant", bandwidth: float | str | None = None, compare=None,
          progress: Progress | None = None) -> dict:
    """Write the bundle of a larger job built from a recorded slice (see
    `prism_rr.topology.scale.scale`); `bandwidth` may be a spec such as "50GB/s". With
    `compare` (a real recording at the target size) the note gains `compare`: how far the
    scaled transfer times are from that recording's. Returns the note of what was done."""
    from prism_rr.topology.scale import scale as scale_bundle

    if compare is not None:
        from prism_rr.format import open_bundle

        open_bundle(compare).close()  # a bad path fails before the work
    if isinstance(bandwidth, str):
        bandwidth = parse_bandwidth(bandwidth)
    note = scale_bundle(bundle, output, dp=dp, tp=tp, pp=pp, mesh=mesh, latency=latency,
                        bandwidth=bandwidth, progress=progress)
    if compare is not None:
        from prism_rr.topology.scale import compare_transfers

        note["compare"] = dict(compare_transfers(output, compare), against=str(compare))
    return note
