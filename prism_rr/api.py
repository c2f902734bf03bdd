"""The library's face for whole jobs: every `prism-rr` command's work, returning data.

Record a command into a bundle, pack, repair, verify, describe, diagnose, analyze, diff,
export, redact, import, scale, replay and browse. The CLI and the demo call these; none
of them prints or exits, so a script gets what the command line gets:

    result = record(["python", "train.py"], "run.prism", nproc=4, steps="1:4")
    if result.packed is None:  # a full disk: the spools wait in result.spool_dir
        ...
    found = diagnose("run.prism")
    print(json.dumps(found.json()))  # what `prism-rr diagnose --json` prints
    print("\n".join(found.lines()))  # what `prism-rr diagnose` prints

Where a command has something to say to people, its result's `lines()` says it, every
string from a bundle made safe for a terminal (`prism_rr.text.shown`); its
`json()` (and the results' fields) hold the bundle's strings whole, escaped as the reader
hands them out (`prism_rr.text.safe`). Errors are
`prism_rr.errors` exceptions; what a user should hear about comes back as data (or,
where it must be heard before the work goes on, through a `warn` callback). Importing
this module loads neither torch, numpy nor a UI library (see its deferred imports).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prism_rr import demo
from prism_rr.errors import FormatError, PrismError, RecorderError, UsageError
from prism_rr.format import open_bundle, repair_spool
from prism_rr.format import pack as pack_spools
from prism_rr.format import verify as verify_bundle
from prism_rr.format.facts import flight_line, info_lines
from prism_rr.format.fr import import_fr as read_dumps
from prism_rr.format.pack import spool_dirs
from prism_rr.format.redact import redact as redact_bundle
from prism_rr.text import shown
from prism_rr.localrun import describe_exit
from prism_rr.recorder import RecordOptions, finish_flight, launch
from prism_rr.recorder.launch import hook_env, spool_dir_for
from prism_rr.specs import format_ranks, parse_bandwidth, parse_ranks, step_window
from prism_rr.topology.roles import spool_roles
from prism_rr.topology.scale import compare_transfers
from prism_rr.topology.scale import scale as scale_bundle

# Deferred imports: prism_rr.analysis (numpy), the replay launcher (numpy, through the
# analysis it runs) and the terminal UI (textual), each in the functions that use them,
# so that `prism-rr info`, `verify` and `record` start without them.

if TYPE_CHECKING:
    from prism_rr.analysis import BundleDiff, Finding, StepAttribution
    from prism_rr.format import PackResult, VerifyReport
    from prism_rr.format.spool import SpoolScan
    from prism_rr.replayer import ReplayResult
    from prism_rr.replayer.launch import ReplayRequest

__all__ = [
    "BundleInfo",
    "Diagnosis",
    "Imported",
    "RecordOptions",
    "RecordResult",
    "ReplayRequest",
    "analysis_json_text",
    "analysis_lines",
    "analysis_output",
    "analyze",
    "browse",
    "check_replayable",
    "demo_plan",
    "diagnose",
    "diff",
    "export",
    "flight_lines",
    "import_fr",
    "info",
    "pack",
    "record",
    "record_demo",
    "record_env",
    "recorded_command_lines",
    "recorded_commands",
    "redact",
    "repair",
    "replay",
    "replay_demo",
    "scale",
    "scale_lines",
    "spool_dir_for",
    "verify",
]

def __getattr__(name: str):
    # The replay's request is the replayer's; its launcher loads on first use (numpy, analysis).
    if name == "ReplayRequest":
        from prism_rr.replayer.launch import ReplayRequest

        return ReplayRequest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Progress = Callable[[int, int], None]  # (done, total)
Warn = Callable[[str], None]
Consent = Callable[[list[str], bool], bool]  # (the recorded command's lines, asked for) -> run it?


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordResult:
    """How a recording ended: the program's exit code, and the bundle or where the spools wait."""

    output: Path
    spool_dir: Path
    exit_code: int | None  # the program's (128+N: killed by signal N); None: the recording itself failed
    packed: PackResult | None = None  # None: no bundle was written (see `error`)
    error: OSError | None = None  # what stopped the recording (exit_code None) or the packing
    spools_left: bool = False  # rank spools wait in spool_dir, for `prism-rr pack` elsewhere
    spools_removed: bool = False  # the bundle checked out and the recording's files in spool_dir were removed
    recorder_failures: tuple[dict, ...] = ()  # ranks whose recorder turned itself off: {rank, step, reason}
    readback_error: str | None = None  # the bundle was written but could not be read back
    warnings: tuple[str, ...] = ()  # every warning also passed to `warn`, in order
    node: str | None = None  # one node of a multi-node job: its spools are in spool_dir, not packed
    pack_command: str | None = None  # what packs every node's spools, once they are in one place
    flight: tuple[Path, ...] | None = None  # flight mode: the bundles its triggers wrote (None: not flight)

    @property
    def exit_status(self) -> int:
        """What `prism-rr record` exits with: the program's exit code (1 for death by a
        signal), and 1 where nothing was recorded or no bundle could be written although
        the program succeeded."""
        if self.exit_code is None:
            return 1
        status = self.exit_code if self.exit_code < 128 else 1
        if self.packed is None and self.flight is None and self.node is None:
            return status or 1
        return status

    def lines(self) -> list[str]:
        """What `prism-rr record` says of how the recording ended (on stderr): the bundle,
        the flight dumps, where a node's spools wait, or what failed and where the spools are."""
        output, spool_dir, code = self.output, self.spool_dir, self.exit_code
        if code is None:
            return [f"prism-rr: error: recording into {spool_dir}/ failed: {self.error}",
                    *(self._spools_elsewhere() if self.spools_left else [])]
        if self.flight is not None:
            return flight_lines(self)
        if self.node is not None:
            return [f"node {self.node}: the spools are in {spool_dir}/; once every node has finished and their "
                    f"node-* directories are in one place (a shared file system needs nothing more), pack them "
                    f"with:\n  {self.pack_command}"]
        if self.packed is None:
            outcome = f"the command exited with code {code}" if code != 0 else "the command succeeded (exit code 0)"
            return [f"prism-rr: error: could not write {output}: {self.error}; {outcome}, but no bundle was written",
                    *self._spools_elsewhere()]
        packed = self.packed
        out = [f"warning: rank {rank}: tail of its spool lost ({why})" for rank, why in sorted(packed.torn.items())]
        out.append(f"wrote {output}: {packed.ranks} ranks, {packed.events:,} records, {packed.bytes:,} bytes")
        if self.readback_error is not None:
            out.append(f"warning: could not read back {output}: {self.readback_error}")
        if self.spools_left:  # --keep-spools, or kept for what the bundle lacks (said above)
            out.append(f"the spools stay in {spool_dir}/" + (
                f"; pack them again with: prism-rr pack {spool_dir} -o {output}"
                if self.readback_error is not None else ""))
        return out + [f"warning: {line}" for line in self.failure_lines()]

    def _spools_elsewhere(self) -> list[str]:
        return [f"prism-rr: the spools are in {self.spool_dir}/; pack them elsewhere with:\n"
                f"  prism-rr pack {self.spool_dir} -o ELSEWHERE/{self.output.name}"]

    def failure_lines(self) -> list[str]:
        """A warning for each rank whose recorder turned itself off (the reason is the
        rank's words, made safe for a terminal)."""
        return [f"rank {f['rank']}: the recorder turned itself off at step {'?' if f['step'] is None else f['step']} "
                f"({shown(f['reason'])}); the training went on, the rank's records stop there"
                for f in self.recorder_failures]


def record(
    cmd: Sequence[str],
    output,
    options: RecordOptions | None = None,
    *,
    nproc: int = 0,
    node: str | None = None,
    timeout: float | None = None,
    keep_spools: bool = False,
    warn: Warn | None = None,
    progress: Progress | None = None,
    **fields,
) -> RecordResult:
    """Run `cmd` with every rank recording into `<output>.d/`, then pack the spools into `output`.

    Each rank records as `options` (a RecordOptions) or RecordOptions(**`fields`) say
    (`steps="1:4"`, `payload="full"`, `flight=8`, ...). `nproc` > 0 starts that many
    local ranks with torchrun's environment around `cmd`.
    One node of a multi-node job (`cmd` a torchrun launch of more than one node, or
    `node` given; see `prism_rr.recorder.launch.launch_node`) records into
    `<output>.d/node-<name>/` and packs nothing: this node cannot know when the others
    are done. The result's `pack_command` packs them all once every node has finished and
    the node directories are in one place (at once, on a shared file system).
    A failing program still yields a bundle (its code is in the result). Once `output` is
    written and checked (`prism_rr.format.verify` with decode=False: its bytes are what
    pack read, with as many ranks, chunks, records and blobs as the spools held), what
    the recording wrote into `<output>.d/` is removed, so a recording leaves one file
    (`spools_removed`); the spools stay with `keep_spools`, where a rank's spool could not
    be packed whole (`packed.torn`: what was lost is only there), or where the check
    failed (`readback_error`). A failed write (a full or read-only disk) yields a result
    without `packed`, naming where the spools are; the half-written files are removed.
    Raises UsageError when nothing was recorded.
    A SIGINT or SIGTERM to this process stops the program within a few seconds and packs
    what was recorded (the bundle says it was interrupted; RecorderError where no rank
    had finished init_process_group yet).
    `warn` hears the warnings before packing as they come, and one that the spools could
    not all be removed. The result's `lines()` and `exit_status`: what `record` says and exits with.
    """
    request = launch.RecordRequest.make(cmd, output, options, nproc=nproc, node=node, timeout=timeout, **fields)
    said = _Warnings(warn)
    interrupts: list[dict] = []  # {signal, after_s} of a SIGINT or SIGTERM to this process
    try:
        code = launch.record_command(request.cmd, request.output, request=request,
                                     interrupted=_on_interrupt(said, interrupts))
    except OSError as exc:
        _remove_half_written(request.spool_dir, request.output)
        return RecordResult(output=request.output, spool_dir=request.spool_dir, exit_code=None, error=exc,
                            spools_left=_spools_left(request.spool_dir), warnings=said.all)
    if code != 0:  # "packing" only where there is something this node packs
        packs = request.node is None and not request.flight and _spools_left(request.spool_dir)
        said(f"the command exited with code {describe_exit(code)}" + ("; packing what was recorded" if packs else ""))
    if request.flight:
        return _flight_result(request.output, request.spool_dir, code, said.all, request.options.flight, interrupts)
    if not _spools_left(request.spool_dir):
        raise _nothing_recorded(code, interrupts)
    if request.node is not None:
        return _node_result(request, code, said)
    return _packed_result(request, code, said, keep_spools=keep_spools, progress=progress)


class _Warnings:
    """The warnings of one recording: kept in order, and each told to `warn` as it comes."""

    def __init__(self, warn: Warn | None):
        self._warn, self._said = warn, []

    def __call__(self, message: str) -> None:
        self._said.append(message)
        if self._warn is not None:
            self._warn(message)

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(self._said)


def _on_interrupt(said: _Warnings, interrupts: list[dict]) -> Callable[[dict], None]:
    """What the launcher calls at the first SIGINT or SIGTERM to this process."""

    def interrupted(facts: dict) -> None:
        interrupts.append(facts)
        said(f"interrupted by {facts['signal']}: stopping the command (a few seconds to end, then SIGTERM "
             f"and SIGKILL)")

    return interrupted


def _spools_left(spool_dir: Path) -> bool:
    return any(spool_dir.glob("rank-*.spool"))


def _node_result(request, code: int, said: _Warnings) -> RecordResult:
    """One node of many: its spools wait for the others', and the command that packs them all."""

    command = (f"prism-rr pack {shlex.quote(str(spool_dir_for(request.output)))} "
               f"-o {shlex.quote(str(request.output))}")
    return RecordResult(output=request.output, spool_dir=request.spool_dir, exit_code=code, spools_left=True,
                        warnings=said.all, node=request.node, pack_command=command)


def _packed_result(request, code: int, said: _Warnings, *, keep_spools: bool,
                   progress: Progress | None) -> RecordResult:
    """Pack the spools into the bundle, read it back, and remove the spools where the
    bundle holds all they held. A failed write (a full or read-only disk) keeps them: the
    training's outcome and the spools are what matter then, and the result says where."""
    output, spool_dir = request.output, request.spool_dir
    try:
        packed = _pack_spools(request, said, progress)
    except OSError as exc:
        _remove_half_written(spool_dir, output)
        return RecordResult(output=output, spool_dir=spool_dir, exit_code=code, error=exc,
                            spools_left=True, warnings=said.all)
    remove = not keep_spools and not packed.torn
    failures, readback_error = _read_back(output, packed, check=remove)
    removed = False
    if remove and readback_error is None:
        problem = _remove_spools(spool_dir)
        removed = problem is None
        if problem is not None:
            said(f"could not remove the spools in {spool_dir}/ ({problem}); {output} holds all they held")
    return RecordResult(output=output, spool_dir=spool_dir, exit_code=code, packed=packed,
                        spools_left=_spools_left(spool_dir), spools_removed=removed,
                        recorder_failures=tuple(failures), readback_error=readback_error, warnings=said.all)


def _pack_spools(request, said: _Warnings, progress: Progress | None) -> PackResult:
    """The spools packed into the bundle, with the roles found (--slice roles)."""

    extra = None
    options = request.options
    if options.slice is not None:

        roles = spool_roles(request.spool_dir, options.mesh, extra=options.ranks or ())
        extra = {"roles": roles} if roles is not None else None
        if roles is None:
            said("--slice roles: no layout was found (no DeviceMesh, and the groups form no mesh); "
                 "every rank was recorded")
    return pack_spools(request.spool_dir, request.output, manifest_extra=extra, progress=progress)


def _read_back(output: Path, packed: PackResult, *, check: bool) -> tuple[list[dict], str | None]:
    """The recorder failures the bundle notes, and why it could not be read back (None:
    it could); with `check`, every record the spools held must be in it (_check_packed)."""

    try:
        with open_bundle(output) as b:
            if check:
                _check_packed(b, packed)
            return b.facts()["recorder_failures"], None
    except Exception as exc:  # the bundle is written; what it says of failures is a bonus
        return [], str(exc)


def _check_packed(bundle, packed: PackResult) -> None:
    """FormatError unless the bundle just written reads back whole (verify, decode=False)
    with every attempt's ranks, chunks, records and blobs as pack counted them in the spools."""
    report = verify_bundle(bundle, decode=False)
    found = (len(bundle.recorded_ranks), report.chunks, report.events, report.blobs)
    expected = (packed.ranks, packed.chunks, packed.events, packed.blobs)
    if found != expected:
        raise FormatError(f"{bundle.path.name} holds {found[0]} ranks, {found[1]} chunks, {found[2]} records and "
                          f"{found[3]} blobs; the spools held {expected[0]}, {expected[1]}, {expected[2]} and "
                          f"{expected[3]}")


def _remove_spools(spool_dir: Path) -> OSError | None:
    """Remove what a recording wrote into `spool_dir` (its ranks' spools, call logs and
    crash files, blobs, run.json, half-written files), then the directories that leaves
    empty; a file of anyone else's there stays, and so does the directory. The first
    error, or None: one that cannot be removed does not stop the others."""
    blobs = spool_dir / "blobs"
    paths = [p for pattern in ("rank-*.spool", "rank-*.log", "rank-*.crash", "run.json", "*.tmp")
             for p in spool_dir.glob(pattern)]
    paths += [*blobs.glob("*/*.zst"), *blobs.glob("*/*.tmp"), *blobs.glob("*.pack")]
    first = None
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            first = first or exc
    for d in [*(d for d in blobs.glob("*") if d.is_dir()), blobs, spool_dir]:
        try:
            d.rmdir()
        except OSError:  # gone, or not empty: a file that is not the recording's (or one that would not go)
            pass
    return first


def _nothing_recorded(code: int, interrupts: list[dict]) -> PrismError:
    """Why no rank left a record: the run was interrupted before any rank had made its
    process group, or no rank ever asked for one."""
    if interrupts:
        i = interrupts[0]
        return RecorderError(f"interrupted by {i['signal']} {i['after_s']:.1f} s into the run, before any rank had "
                             f"finished torch.distributed.init_process_group: there is nothing to pack (exit code "
                             f"{describe_exit(code)})")
    return UsageError(f"nothing was recorded: no rank called torch.distributed.init_process_group "
                      f"(is CMD a PyTorch distributed program? exit code {code})")


def _flight_result(output: Path, spool_dir: Path, code: int, warnings: list[str], steps: int,
                   interrupts: list[dict] = ()) -> RecordResult:
    """After a flight run: the dumps' bundles (those the triggers left unpacked packed now)."""
    if not any(any(spool_dir.glob(pattern)) for pattern in ("rank-*.log", "rank-*.crash", "flight-*")):
        raise _nothing_recorded(code, interrupts)
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
    output = Path(output)
    target = output.with_name(output.name + ".unredacted") if redact else output
    dirs = spool_dir if isinstance(spool_dir, (list, tuple)) else Path(spool_dir)
    result = pack_spools(dirs, target, progress=progress)
    if not redact:
        return result

    try:
        redact_bundle(target, output, stacks=stacks)
    finally:
        target.unlink(missing_ok=True)
    return replace(result, path=output, bytes=output.stat().st_size)


def repair(spool_dir) -> list[tuple[Path, SpoolScan]]:
    """Cut torn or corrupt tails off every rank-*.spool in `spool_dir` (or in its node-*/
    directories, as `pack` finds them; the cut bytes are kept beside each as <name>.torn);
    each spool with what its scan found."""
    paths = [path for d in spool_dirs(Path(spool_dir)) for path in sorted(d.glob("rank-*.spool"))]
    return [(path, repair_spool(path)) for path in paths]


def verify(bundle) -> VerifyReport:
    """Check every checksum, index entry, record and blob of a bundle; raises FormatError."""
    with open_bundle(bundle) as b:
        return verify_bundle(b)


def export(bundle, output, *, fmt: str = "chrome", ranks=None, steps=None, gzip: bool | None = None,
           attempt: int | str | None = None, progress=None) -> dict:
    """Write `bundle` in format `fmt`, only `ranks` ("0,2,4-7") and `steps` ("A:B", B
    excluded) if given; returns what was written. chrome: a trace file for Perfetto
    ({events, ranks, flows}; gzipped if `gzip`, or if None when `output` ends in .gz).
    chakra: `output`.<rank>.et and `output`.comm_groups.json ({files, nodes, comp, comm,
    unmapped}). parquet: tables in the directory `output` (rows per table). `attempt`: of a
    restarted job's bundle, that attempt (default: its default one), or "all" (chrome: every
    attempt on one timeline, a process per attempt and rank). `progress(done, total)`: called
    as chakra and parquet write the ranks."""
    from prism_rr.analysis import export_chakra, export_chrome, export_parquet

    if fmt not in ("chrome", "chakra", "parquet"):
        raise UsageError(f"--format must be chrome, chakra or parquet, not {fmt!r}")
    window = step_window(steps)
    rank_list = list(parse_ranks(ranks)) if ranks else None
    every = attempt == "all"
    if every and fmt != "chrome":
        raise UsageError("--attempt all is for --format chrome; chakra and parquet take one attempt at a time")
    if isinstance(attempt, str) and not every:
        try:
            attempt = int(attempt)
        except ValueError:
            raise UsageError(f"--attempt takes an attempt's number or all, not {attempt!r}") from None
    with open_bundle(bundle, None if every else attempt) as b:
        if fmt == "chrome":
            if not every:
                return export_chrome(b, output, ranks=rank_list, steps=window, gzip=gzip)
            others = [open_bundle(bundle, a["attempt"]) for a in b.attempts if a["attempt"] != b.attempt]
            try:
                return export_chrome(b, output, ranks=rank_list, steps=window, gzip=gzip, also=others)
            finally:
                for o in others:
                    o.close()
        writer = export_chakra if fmt == "chakra" else export_parquet
        return writer(b, output, ranks=rank_list, steps=window, progress=progress)


def replay(request, /, consent: Consent | None = None, **asks) -> ReplayResult:
    """Replay a bundle: some ranks for real, the others as virtual peers. `request` is a
    ReplayRequest (what `prism-rr replay` builds), or the bundle's path with the request's
    fields as keywords: `prism_rr.replayer.replay`'s (`ranks="0,1"`, `cmd=[...]`;
    `attempt=N`: an attempt of a restarted job; `replace_rank="R@STEP"`, with
    `replace_downtime=` seconds or the bundle's estimate: what a rank replaced mid-run
    costs; `slow_rank=`, `comm_scale=`, ...: other what-ifs). Never raises on a
    divergence or a recorded hang: see the result's exit_code (3, 7).

    A request with neither a command nor the bundle as the program runs the command the
    bundle names: its lines (`recorded_command_lines`) go to `consent(lines, asked)` first,
    asked being `run_recorded_command`; it runs only if that returns True (UsageError
    otherwise, or without `consent` where it was not asked for)."""
    from prism_rr.replayer.launch import ReplayRequest
    from prism_rr.replayer.launch import replay as run_replay

    request = ReplayRequest.of(request, asks)
    check_replayable(request.bundle, cmd=request.cmd, from_bundle=request.from_bundle)
    if request.names_no_program and consent is not None:
        lines = recorded_command_lines(request.bundle, request.ranks, attempt=request.attempt)
        if not consent(lines, request.run_recorded_command):
            bundle, ranks = Path(request.bundle), request.ranks
            spec = ranks if isinstance(ranks, str) else format_ranks([ranks] if isinstance(ranks, int) else ranks)
            raise UsageError(f"{bundle.name}: replay runs the command a bundle names only when asked: give the "
                             f"command after -- (prism-rr replay {bundle} --ranks {spec} -- python "
                             f"train.py), or pass --run-recorded-command")
        request = request.agreed()
    return run_replay(request)


def recorded_commands(bundle, ranks=(0,), *, attempt: int | None = None) -> dict[int, tuple[list[str], str]]:
    """What a replay with run_recorded_command=True would run for each rank: (argv, cwd),
    for showing to a user before they agree to run it."""
    from prism_rr.replayer.launch import recorded_commands as commands

    check_replayable(bundle)
    return commands(bundle, ranks, attempt=attempt)


def recorded_command_lines(bundle, ranks=(0,), *, attempt: int | None = None) -> list[str]:
    """`recorded_commands` for people to read before they agree to run them: each
    distinct command and directory once, with the ranks that run it. Shown whole (a
    command cut short would hide what runs), every character that could draw on the
    terminal escaped (`prism_rr.text.shown`)."""


    name = Path(bundle).name
    by_command: dict[tuple[str, str], list[int]] = {}
    for r, (argv, cwd) in recorded_commands(bundle, ranks, attempt=attempt).items():
        by_command.setdefault((shown(shlex.join(argv), None), shown(cwd, None)), []).append(r)
    return [f"{shown(name, None)} names this command for rank{'s' if len(rs) > 1 else ''} {format_ranks(rs)}:\n"
            f"  {argv}\n  in {cwd}" for (argv, cwd), rs in by_command.items()]


def check_replayable(bundle, *, cmd=None, from_bundle: bool = False) -> None:
    """UsageError for a replay that cannot run as asked: a bundle imported from PyTorch
    Flight Recorder dumps (`prism-rr import fr`) names no command, and a redacted copy
    (`prism-rr redact`) names placeholders in its place, so each replays only the program
    given (`cmd`), or the bundle as the program (`from_bundle`)."""
    with open_bundle(bundle) as b:
        imported, redacted = b.manifest.get("imported"), b.manifest.get("redacted")
    if cmd or from_bundle:
        return
    name = shown(Path(bundle).name)
    if isinstance(imported, dict):
        raise UsageError(f"{name} was imported from PyTorch Flight Recorder dumps, which name no command: give "
                         f"the program that made them after -- (prism-rr replay {name} --ranks 0 -- python train.py)")
    if isinstance(redacted, dict):
        raise UsageError(f"{name} is a redacted copy: its command was replaced by placeholders, which are not a "
                         f"command: give the program after -- (prism-rr replay {name} --ranks 0 -- python train.py)")


def scale(bundle, output, *, dp: int, tp: int | None = None, pp: int | None = None, mesh=None,
          latency: str = "constant", bandwidth: float | str | None = None, compare=None,
          progress: Progress | None = None) -> dict:
    """Write the bundle of a larger job built from a recorded slice (see
    `prism_rr.topology.scale.scale`); `bandwidth` may be a spec such as "50GB/s". With
    `compare` (a real recording at the target size) the note gains `compare`: how far the
    scaled transfer times are from that recording's. Returns the note of what was done."""
    if compare is not None:

        open_bundle(compare).close()  # a bad path fails before the work
    if isinstance(bandwidth, str):
        bandwidth = parse_bandwidth(bandwidth)
    note = scale_bundle(bundle, output, dp=dp, tp=tp, pp=pp, mesh=mesh, latency=latency,
                        bandwidth=bandwidth, progress=progress)
    if compare is not None:

        note["compare"] = dict(compare_transfers(output, compare), against=str(compare))
    return note


# --- reading a bundle: what info, diagnose, analyze and diff say ----------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BundleInfo:
    """What a bundle says of itself without reading a chunk (`prism-rr info`)."""

    facts: dict[str, Any]  # `info --json`: the bundle's values, type-checked, exact

    def json(self) -> dict[str, Any]:
        return self.facts

    def lines(self) -> list[str]:
        """`prism-rr info`'s lines, safe for a terminal."""
        return info_lines(self.facts)


def info(bundle, *, attempt: int | None = None) -> BundleInfo:
    """Format, world, ranks, groups, steps, events, size, losses and the manifest's notes
    (flight dump, nodes, clocks, import) of `bundle`, of `attempt` (default: the bundle's
    default one), and every attempt's ending; reads no chunk."""
    with open_bundle(bundle, attempt) as b:
        return BundleInfo(facts=b.facts())


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    """What `diagnose` found: findings, most serious first, and each straggler's cost."""

    findings: tuple[Finding, ...]
    # {rank, cost_ns, steps, late_calls} of each late rank a straggler finding names,
    # costliest first: how much sooner the steps would have ended had it been on time
    straggler_cost: tuple[dict[str, Any], ...] = ()

    @property
    def found(self) -> bool:
        return bool(self.findings)

    def cost_of(self, finding: Finding) -> int | None:
        """A straggler finding's cost (ns) over every step; None for other kinds."""
        if finding.kind != "straggler":
            return None
        costs = {e["rank"]: e["cost_ns"] for e in self.straggler_cost}
        return sum(costs.get(r, 0) for r in finding.ranks)

    def json(self) -> dict[str, Any]:
        """`diagnose --json`: {findings: [...], summary, straggler_cost}, values whole."""
        from prism_rr.analysis import diagnosis_json

        out = diagnosis_json(list(self.findings))
        for f, entry in zip(self.findings, out["findings"]):
            cost = self.cost_of(f)
            if cost is not None:
                entry["cost_ns"] = cost
        out["straggler_cost"] = list(self.straggler_cost)
        return out

    def lines(self) -> list[str]:
        """`prism-rr diagnose`'s lines, safe for a terminal."""
        from prism_rr.analysis import finding_lines, straggler_lines

        out = ["no problems found"] if not self.findings else []
        for i, f in enumerate(self.findings, 1):
            out += finding_lines(i, f, self.cost_of(f))
        # Below a millisecond a rank's cost is the jitter of any run.
        out += straggler_lines([e for e in self.straggler_cost if e["cost_ns"] >= 1_000_000])
        return out


WindowProgress = Callable[[int, int, tuple[int, int], bool], None]  # (done, total, steps, read again)
RetimeProgress = Callable[[int, int, int], None]  # (step, steps done, steps in all)


def diagnose(bundle, *, attempt: int | None = None, window_events: int | None = None,
             progress: WindowProgress | None = None, retimed: RetimeProgress | None = None) -> Diagnosis:
    """Crashes, hangs, mismatches, stragglers and lost records in `bundle`, and what each
    straggler cost. A bundle of more than `window_events` events is read in windows of
    steps (`progress` hears of each); a straggler's cost re-times every step on the
    execution graph, as `analyze` does, for the late ranks only (`retimed` hears of each
    step: on 8192 ranks a minute or more). Of `attempt` (default: the bundle's default
    one); a bundle of several attempts also says how each ended and what changed between
    them (findings of kind "attempt")."""
    from prism_rr.analysis import attempt_findings, attribute, straggler_totals
    from prism_rr.analysis import diagnose as find

    with open_bundle(bundle, attempt) as b:
        findings = attempt_findings(b) + find(b, window_events=window_events, progress=progress)
        late = {r for f in findings if f.kind == "straggler" for r in f.ranks}
        costs: list[dict] = []
        if late:
            steps = len(b.steps)

            def paced(attributions):
                for i, a in enumerate(attributions, 1):
                    if retimed is not None:
                        retimed(a.step, i, steps)
                    yield a

            costs = straggler_totals(paced(attribute(b, of=late)))
    return Diagnosis(findings=tuple(findings), straggler_cost=tuple(costs))


def attempts_of(bundle) -> list[int]:
    """The attempts a bundle holds (one, numbered 0, before format 1.2), in order."""
    with open_bundle(bundle) as b:
        return [a["attempt"] for a in b.attempts]


def analyze(bundle, *, steps=None, ranks=None, attempt: int | None = None,
            progress=None) -> Iterator[StepAttribution]:
    """Per step, where each rank's time went (compute, overlapped, exposed, waiting), the
    critical path and each late rank's straggler cost: one step at a time, as it is read
    (the bundle stays open until the iterator is done). `steps` "A:B" (B excluded) and
    `ranks` "0,2,4-7" narrow it; UsageError, at once, when none of `ranks` was recorded.
    `progress(batch, batches, (first step, last step))` as `analysis.attribute` calls it."""
    window = step_window(steps)
    chosen = list(parse_ranks(ranks)) if ranks else None
    b = open_bundle(bundle, attempt)
    try:
        if chosen is not None and not set(chosen) & set(b.recorded_ranks):
            raise UsageError(f"none of ranks {ranks} was recorded; recorded: {format_ranks(b.recorded_ranks)}")
    except BaseException:
        b.close()
        raise
    return _attributions(b, window, chosen, progress)


def _attributions(b, window, chosen, progress) -> Iterator[StepAttribution]:
    from prism_rr.analysis import attribute

    with b:
        yield from attribute(b, steps=window, ranks=chosen, progress=progress)


def analysis_lines(attributions) -> Iterator[str]:
    """`prism-rr analyze`'s lines for `analyze`'s steps, as they come."""
    from prism_rr.analysis import attribution_lines

    return attribution_lines(attributions)


def analysis_json_text(attributions) -> Iterator[str]:
    """`analyze --json`'s one JSON object, in pieces as the steps come."""
    from prism_rr.analysis import attribution_json_text

    return attribution_json_text(attributions)


def analysis_output(bundle, *, as_json: bool = False, steps=None, ranks=None,
                    attempt: int | str | None = None, progress=None) -> Iterator[str]:
    """What `prism-rr analyze` prints on stdout, in pieces as the steps come: `analyze`'s
    lines (`as_json`: its one JSON object) of `attempt`, or of every attempt one after
    the other (`attempt="all"`, each named; as JSON, {"attempts": [{attempt, analysis}]}).
    `progress` as `analyze` takes it."""
    attempts = attempts_of(bundle) if attempt == "all" else [_attempt_number(attempt)]
    several = len(attempts) > 1
    if as_json and several:
        yield '{"attempts": ['
    for i, k in enumerate(attempts):
        steps_read = analyze(bundle, steps=steps, ranks=ranks, attempt=k, progress=progress)
        if as_json:
            if several:
                yield ("" if i == 0 else ", ") + f'{{"attempt": {k}, "analysis": '
            yield from analysis_json_text(steps_read)
            yield "}" if several else "\n"
        else:
            if several:
                yield ("" if i == 0 else "\n") + f"attempt {k}\n"
            for line in analysis_lines(steps_read):
                yield line + "\n"
    if as_json and several:
        yield "]}\n"


def _attempt_number(text: int | str | None) -> int | None:
    if text is None or isinstance(text, int):
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--attempt takes an attempt's number or all, not {text!r}") from None


def diff(a, b, *, attempt: int | None = None, other_attempt: int | None = None, progress=None) -> BundleDiff:
    """Do two recordings issue the same collectives (`same`), where do they first part,
    and where did the time go, per step and rank? Its `lines()` and `json()` are what
    `prism-rr diff` prints. Calls are compared as replay compares a replayed call with
    its recording (`prism_rr.analysis.call_divergence`). `attempt` of `a`, `other_attempt`
    of `b` (default: each bundle's default one): two attempts of one restarted job are
    two recordings to compare. `progress(ranks done, ranks)` as the ranks are compared."""
    from prism_rr.analysis import diff_bundles

    with open_bundle(a, attempt) as ba, open_bundle(b, other_attempt) as bb:
        return diff_bundles(ba, bb, progress=progress)


# --- making bundles from bundles, and from other tools' dumps -------------------------


def redact(bundle, output, *, stacks: bool = True) -> dict[str, Any]:
    """Write a copy of `bundle` safe to make public (see `prism_rr.format.redact`);
    returns the note its manifest holds of what was removed."""
    return redact_bundle(bundle, output, stacks=stacks)


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    """What `import_fr` read and wrote."""

    output: Path
    note: dict[str, Any]  # the manifest's `imported`: ranks, entries, forms, versions, what was left out

    def json(self) -> dict[str, Any]:
        return self.note

    def lines(self) -> list[str]:
        """`prism-rr import fr`'s line, safe for a terminal (forms and versions are the dumps')."""
        n = self.note
        left = n["trimmed"] + n["coalesced"] + n["unplaced"] + n["unread"]
        forms = ", ".join(shown(f, 40) for f in n["forms"])
        versions = ", ".join(shown(v, 40) for v in n["versions"])
        return [f"wrote {shown(self.output, None)}: {n['ranks']} ranks, {n['entries']:,} Flight Recorder entries "
                f"({forms}, version {versions})"
                + (f", {left:,} left out (see --json)" if left else "")
                + f"; look further: prism-rr diagnose {shown(self.output, None)}"]


def import_fr(dumps, output, *, jobs: int | None = None, progress: Progress | None = None) -> Imported:
    """A bundle of PyTorch Flight Recorder dumps, one per rank (see `prism_rr.format.fr`)."""
    dumps = [dumps] if isinstance(dumps, (str, Path)) else list(dumps)
    return Imported(output=Path(output), note=read_dumps(dumps, output, jobs=jobs, progress=progress))


def flight_lines(result: RecordResult) -> list[str]:
    """What a flight recording says of the bundles its triggers wrote: for each, what
    fired, on which rank, at which step (read back from the bundle)."""
    if not result.flight:
        return ["flight: no trigger fired; nothing was written (the last steps stayed in memory)"]
    out = []
    for path in result.flight:
        try:
            with open_bundle(path) as b:
                out.append(flight_line(path, b.facts()["flight"], len(b.recorded_ranks)))
        except Exception as exc:  # the bundle is written; reading it back is a courtesy
            out.append(f"flight: {shown(path, None)}: cannot be read back ({shown(exc, None)})")
    return out


def record_env(output, options: RecordOptions | None = None, **fields) -> dict[str, str]:
    """The environment that makes every Python process of a job record as `record` would
    with `options` (or RecordOptions of `fields`): into OUTPUT.d/, or flight-mode dumps
    packed into OUTPUT, for launchers that cannot be wrapped: PRISM_RR_RECORD and
    PYTHONPATH (the hook's directory, to put first)."""
    output = Path(output).resolve()
    options = RecordOptions(**fields) if options is None else options
    env = hook_env(options.placed(spool_dir_for(output), output), base={})
    return {"PRISM_RR_RECORD": env["PRISM_RR_RECORD"], "PYTHONPATH": env["PYTHONPATH"]}


# --- the demo, and the terminal UI ------------------------------------------------------


def demo_plan(world: int = 4, pp: int = 1) -> demo.DemoPlan:
    """What `prism-rr demo` runs: the embedded GPT's command and layout (see `prism_rr.demo`)."""
    return demo.plan(world, pp)


def record_demo(output, plan: demo.DemoPlan, *, warn: Warn | None = None, progress: Progress | None = None) -> RecordResult:
    """Record the embedded demo (steps 1-3 after a warm-up, digests, memory) into `output`."""
    return record(plan.launch, output, steps=demo.STEPS, payload=demo.PAYLOAD, memory=True,
                  timeout=demo.RECORD_TIMEOUT_S, warn=warn, progress=progress)


def replay_demo(output, plan: demo.DemoPlan) -> ReplayResult:
    """Replay rank 0 of the demo's recording against virtual peers."""
    return replay(output, ranks="0", cmd=plan.train, timeout=demo.REPLAY_TIMEOUT_S)


def browse(bundle, compare=None, *, attempt: int | None = None) -> int:
    """Browse `bundle` in the terminal UI (with `compare`, a replay's bundle beside it)
    until the user quits; returns the app's exit code. A malformed bundle raises its
    FormatError before the terminal is taken over, or, found while browsing, once the app
    has given the terminal back."""
    from prism_rr.tui.app import PrismApp

    open_bundle(bundle, attempt).close()  # one line, exit 4 (or 2: no such attempt), before the screen changes
    if compare is not None:
        open_bundle(compare).close()
    app = PrismApp(bundle, compare, attempt=attempt)
    app.run()
    if app.bundle_error is not None:
        raise app.bundle_error
    return app.return_code or 0


def scale_lines(note: dict[str, Any], output, *, bandwidth_given: bool = False) -> list[str]:
    """What `prism-rr scale` says of `scale`'s note, safe for a terminal (an op this
    version does not know is a family of its own, named as the bundle names it)."""
    fit = note["model"]["fit_error"]
    roles = note["roles"]
    out = [f"wrote {shown(output, None)}: world {note['to']['world_size']} ({roles} role{'s' if roles != 1 else ''} "
           f"written), cost model fitted on {fit['samples']} calls, mean abs error {fit['mape_pct']:.0f}%"]
    unknown = note["model"].get("bandwidth_unidentified") or []
    if unknown and not bandwidth_given:
        pooled = "the pooled rate" if note["model"].get("pooled_bandwidth_identified") else "nothing"
        out.append(f"note: the recording does not tell the bandwidth of {', '.join(shown(f, 60) for f in unknown)} "
                   f"(message sizes too alike, or times too scattered): bytes there cost {pooled}; "
                   f"give the target's with --bandwidth")
    c = note.get("compare")
    if c is not None:
        against = shown(c.get("against", ""), None)
        if not c["calls"]:
            out.append(f"compared with {against}: no call of the one matches a call of the other (group, seq)")
        else:
            out.append(f"compared with {against}: {c['calls']} calls, total transfer time "
                       f"{c['total_error_pct']:+.1f}%, mean abs error per call {c['call_mape_pct']:.1f}%")
            for fam, row in c["ops"].items():
                out.append(f"  {shown(fam, 60):<15} {row['calls']:>5} calls  "
                           f"recorded {row['recorded_mean_us']:>10.1f} us  "
                           f"predicted {row['predicted_mean_us']:>10.1f} us  ({row['mean_error_pct']:+.1f}%)")
    return out
