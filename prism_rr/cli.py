"""The `prism-rr` command: parses arguments, calls `prism_rr.api`, prints what it returns,
and maps errors to exit codes.

Every command's work is `api`'s, which returns data and never prints: a script gets what
the command line gets. What comes back for people (`lines()`) is already safe for a
terminal; what comes back as data goes out as JSON, exact.
"""

from __future__ import annotations

import inspect
import json
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from prism_rr import api
from prism_rr._version import __version__
from prism_rr.errors import PrismError, UsageError, exit_code_for
from prism_rr.specs import format_ranks

# Deferred imports: rich's progress bar, only where long work draws one on a terminal.

EXIT_CODES = """\
Exit codes: 0 ok · 1 any other failure · 2 usage error · 3 replay diverged ·
4 bundle malformed or of an unsupported version · 5 diagnose found problems ·
6 replay: the program ended before making the recorded calls ·
6 diff: the collective sequences of the two bundles differ ·
7 replay: the recorded hang or failure reproduced (a call a peer never joined, a program
that ended without the call its peers wait in, a drift, a shape mismatch, a call that
failed or never completed, a program that failed as it did)."""

HELP_OPTIONS = ["-h", "--help"]

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
    context_settings={"help_option_names": HELP_OPTIONS},
)


def _say(message: str) -> None:
    """People read stderr; stdout is kept for data."""
    print(message, file=sys.stderr)


def _warn(message: str) -> None:
    _say(f"warning: {message}")


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
    attempt: Optional[int] = typer.Option(None, "--attempt", metavar="N", help="Of a restarted job's bundle, attempt N (default: the last that failed, else the last; `info` lists them)."),
) -> None:
    """Describe a bundle: format, world, ranks, steps, events, size (reads no chunks), and,
    of a restarted job, every attempt and how each ended (exit codes, signals, who first)."""
    described = api.info(bundle, attempt=attempt)
    if as_json:
        print(json.dumps(described.json()))
    else:
        print("\n".join(described.lines()))


@app.command(epilog=EXIT_CODES)
def verify(bundle: Path = typer.Argument(..., help="The .prism bundle to check.")) -> None:
    """Check every checksum, index entry, record and blob of a bundle."""
    report = api.verify(bundle)
    _say(
        f"{bundle}: ok ({report.sections} sections, {report.chunks} chunks, "
        f"{report.events:,} records, {report.blobs} blobs)"
    )


@app.command(epilog=EXIT_CODES)
def pack(
    spool_dirs: list[Path] = typer.Argument(..., metavar="DIR...", help="Directories of rank-*.spool files (run.prism.d/; one per node of a multi-node recording, or the run.prism.d/ that holds their node-*/ directories)."),
    output: Path = typer.Option(..., "-o", "--output", help="The bundle to write."),
    redact: bool = typer.Option(False, "--redact", help="Make it safe for a public bug report (see `prism-rr redact --help`)."),
    stacks: bool = typer.Option(True, "--stacks/--no-stacks", help="With --redact: keep stack frames as file name and line, or drop them."),
) -> None:
    """Pack directories of spools into one portable bundle.

    Chunks are copied as they are; a spool with a torn tail is packed up to its last
    complete frame and its rank is marked truncated. The spools of every node of a
    multi-node job go into one bundle, each node's run facts kept; a rank found twice is
    an error.
    """
    with _progress("packing ranks") as progress:
        result = api.pack(list(spool_dirs), output, redact=redact, stacks=stacks, progress=progress)
    for rank, why in sorted(result.torn.items()):
        _say(f"warning: rank {rank}: tail dropped ({why})")
    if redact:
        _say(f"wrote {output} (redacted): {result.ranks} ranks, {result.events:,} records, "
             f"{result.bytes:,} bytes")
        return
    _say(f"wrote {output}: {result.ranks} ranks, {result.events:,} records, {result.bytes:,} bytes")


@app.command(epilog=EXIT_CODES)
def repair(
    spool_dir: Path = typer.Argument(..., help="A directory of rank-*.spool files."),
) -> None:
    """Cut torn or corrupt tails off spools, keeping every complete frame.

    The removed bytes are kept beside each spool as <name>.torn.
    """
    scans = api.repair(spool_dir)
    repaired = 0
    for path, scan in scans:
        if scan.torn:
            repaired += 1
            _say(f"{path.name}: kept {len(scan.frames)} frames ({scan.good_bytes:,} bytes), "
                 f"cut {scan.size - scan.good_bytes:,} bytes: {scan.problem}")
    _say(f"{len(scans)} spools checked, {repaired} repaired")


@app.command(
    epilog="Example: prism-rr record -o run.prism --nproc 4 --steps 1:4 -- python train.py --lr 3e-4\n\n"
    + EXIT_CODES,
    context_settings={"allow_interspersed_args": False},
)
def record(
    cmd: Optional[list[str]] = typer.Argument(None, metavar="-- CMD...", help="The training command, after --."),
    output: Path = typer.Option(..., "-o", "--output", help="The bundle to write; spools go to OUTPUT.d/, removed once OUTPUT is written and checked."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Record only steps A:B (B excluded), e.g. 1:4."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Record only these ranks, e.g. 0,2,4-7."),
    payload: Optional[str] = typer.Option(None, "--payload", help="none: metadata only · small: what calls of at most 1 KiB deliver, whole (control data: sizes, flags, losses), nothing of larger ones (the default with --flight) · digest: small calls whole, both ways, and a hash of every larger tensor (the default) · full: the tensors themselves."),
    ops: bool = typer.Option(False, "--ops", help="Also record every operator (name, shapes, duration)."),
    memory: bool = typer.Option(False, "--memory", help="Track live tensor memory on CPU (CUDA statistics are always read)."),
    nproc: int = typer.Option(0, "--nproc", help="Start this many local ranks with torchrun's environment (0: CMD starts its own ranks, e.g. torchrun)."),
    slice_: Optional[str] = typer.Option(None, "--slice", help="roles: record one representative rank per role (ranks doing the same work), plus --ranks. The layout comes from --mesh, else from the DeviceMesh the program builds, else from its groups at the first step."),
    mesh: Optional[str] = typer.Option(None, "--mesh", help="With --slice roles: the job's layout, e.g. dp=4,tp=2 (row-major, last dimension fastest, as init_device_mesh); ranks then decide before the program starts."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Stop the run after this many seconds (a hang still yields a bundle)."),
    keep_spools: bool = typer.Option(False, "--keep-spools", help="Keep the spools in OUTPUT.d/ once OUTPUT is written (to pack or repair them again later); without it a recording leaves one file. Spools that could not be packed whole, and a node's of many, always stay; --flight leaves its dumps' spools in OUTPUT.d/flight-*/ either way."),
    node: Optional[str] = typer.Option(None, "--node", help="This is one node of a multi-node job, named NAME: its ranks record into OUTPUT.d/node-NAME/ and nothing is packed (found by itself for torchrun --nnodes N --node-rank i)."),
    flight: Optional[int] = typer.Option(None, "--flight", metavar="K", help="Flight mode: keep only the last K steps of every rank, in memory, and write a bundle when a trigger fires (a hang, an unhandled exception, SIGUSR1 to any rank, the file OUTPUT.d/dump-now, a slow step): every rank dumps the same moment. Without a trigger nothing is written."),
    flight_hang: float = typer.Option(30.0, "--flight-hang", metavar="T", help="With --flight: a call pending T seconds is a hang (long before the backend's own timeout)."),
    flight_slow: Optional[float] = typer.Option(None, "--flight-slow", metavar="X", help="With --flight: a step X times slower than the median of the steps before it triggers a dump."),
    flight_budget: int = typer.Option(32, "--flight-budget", metavar="MiB", help="With --flight: memory for each rank's ring (records and payloads)."),
    flight_at_exit: bool = typer.Option(False, "--flight-at-exit", help="With --flight: also write the last K steps when the run ends."),
    print_env: bool = typer.Option(False, "--print-env", help="Print the environment lines that make a job record as this command would (for launchers that cannot be wrapped: SLURM, Kubernetes) and exit; no CMD."),
) -> None:
    """Record a training run into a bundle, without editing the training code.

    CMD is whatever starts the Python ranks: `torchrun ... train.py`, a cluster launcher,
    or `python train.py` with --nproc. Every rank records its collectives, point-to-point
    calls, compute gaps, steps and memory into OUTPUT.d/; when CMD ends (or crashes, or is
    interrupted) the spools are packed into OUTPUT, and OUTPUT.d/ is removed once OUTPUT
    reads back with every record the spools held (--keep-spools keeps it).

    Many nodes: run the same command on every node. Each node records into
    OUTPUT.d/node-<node rank>/ and clears only that directory; when every node has
    finished, `prism-rr pack OUTPUT.d -o OUTPUT` (on a shared file system, or after
    copying the node directories into one OUTPUT.d/) makes one bundle.

    Production: `--flight K` records always and writes only when something goes wrong
    (see docs/recording.md). Where the launcher cannot be
    wrapped, `--print-env` prints the two lines to put in the job script instead.
    """
    if not cmd and not print_env:
        raise UsageError("give the training command after --, e.g. prism-rr record -o run.prism -- torchrun ...")
    flight_args = {} if flight is None else dict(
        flight=flight, flight_hang=flight_hang, flight_slow=flight_slow, flight_budget=flight_budget << 20,
        flight_at_exit=flight_at_exit)
    options = api.RecordOptions(steps=steps, ranks=ranks, payload=payload, ops=ops, memory=memory, slice=slice_,
                                mesh=mesh, **flight_args)
    if print_env:
        _print_env(output, options)
        return
    with _progress("packing ranks") as progress:
        result = api.record(cmd, output, options, nproc=nproc, node=node, timeout=timeout, keep_spools=keep_spools,
                            warn=_warn, progress=progress)
    _report_record(result)


def _print_env(output: Path, options) -> None:
    """The environment that makes every Python process of a job record (into
    OUTPUT.d/, or flight-mode dumps packed into OUTPUT), as shell lines."""


    env = api.record_env(output, options)
    typer.echo(f"export PRISM_RR_RECORD={shlex.quote(env['PRISM_RR_RECORD'])}")
    typer.echo(f"export PYTHONPATH={shlex.quote(env['PYTHONPATH'])}${{PYTHONPATH:+:$PYTHONPATH}}")


def _report_record(result) -> None:
    """What `record` (and `demo`) say of an api.RecordResult; exits as `record` does."""
    for line in result.lines():
        _say(line)
    if result.exit_status:
        raise typer.Exit(result.exit_status)


@app.command(
    epilog="Example: prism-rr replay run.prism --ranks 0 --report fidelity.json -- python train.py\n\n"
    + EXIT_CODES + "\nReplay also: 6 the program ended before making the recorded calls · 7 the recorded hang or "
    "failure reproduced · 124 --timeout.",
)
def replay(
    bundle: Path = typer.Argument(..., help="The recorded .prism bundle."),
    cmd: Optional[list[str]] = typer.Argument(None, metavar="[-- CMD...]", help="The command each real rank runs (the training code, perhaps edited), in this directory; or a launcher (torchrun) that starts one worker per real rank, on one node or several."),
    run_recorded: bool = typer.Option(False, "--run-recorded-command", "--yes", help="Without -- CMD: run the command and working directory the bundle names (shown first). Without this or -- CMD, a terminal asks; anything else stops with exit 2. Bundles come from strangers: read the command first."),
    ranks: str = typer.Option("0", "--ranks", help="Ranks to run for real, e.g. 0 or 0,1, or all; every other rank is a virtual peer."),
    from_bundle: bool = typer.Option(False, "--from-bundle", help="No CMD: the bundle is the program. Each real rank makes its recorded calls through torch.distributed (groups, ops, shapes, dtypes, waits as recorded; the recorded bytes where the bundle has them, else seeded made-up data), holding the recorded compute between them; nothing the bundle names is run. For a stranger's (or redacted) bundle, without their code."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the fidelity report (JSON) here."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Record the replay itself into this bundle, to compare with the recording."),
    output_payload: Optional[str] = typer.Option(None, "--output-payload", help="Payload mode of the replay's own recording (default: what the recording kept)."),
    timing: str = typer.Option("live", "--timing", help="live: virtual peers arrive and transfers take as long as recorded · virtual: a virtual clock calibrated on the first step, for replaying on other hardware (a CPU replay of a GPU run) · none: no waiting."),
    comm_scale: float = typer.Option(1.0, "--comm-scale", help="What if every transfer took X times as long?"),
    compute_scale: float = typer.Option(1.0, "--compute-scale", help="What if every virtual rank's compute took X times as long?"),
    slow_rank: Optional[str] = typer.Option(None, "--slow-rank", help="What if virtual rank R computed F times slower? R:F[,R:F]"),
    replace_rank: Optional[list[str]] = typer.Option(None, "--replace-rank", metavar="R@STEP", help="What if virtual rank R failed and a new process took its place at step STEP? Its peers wait for it to start, rejoin and receive its state: a downtime estimated from the bundle (start-up as recorded, a world rendezvous and the state's transfer by the cost model; on a `scale`d bundle, at its world size), shown on the card with its parts. Repeatable."),
    replace_downtime: Optional[float] = typer.Option(None, "--replace-downtime", metavar="SECONDS", help="With --replace-rank: the downtime to emulate, instead of the estimate."),
    continue_on_divergence: bool = typer.Option(False, "--continue-on-divergence", help="Log a divergence and go on instead of stopping (exit 3)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Stop the replay after this many seconds."),
    launcher: Optional[bool] = typer.Option(None, "--launcher/--no-launcher", help="CMD is a launcher that starts one worker per real rank (torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT); default: when CMD is torchrun or python -m torch.distributed.run."),
    attempt: Optional[int] = typer.Option(None, "--attempt", metavar="N", help="Of a restarted job's bundle, replay attempt N, each rank with that attempt's restart count (default: the last that failed, else the last; `info` lists them)."),
) -> None:
    """Replay a recording: the selected ranks run the original training code for real,
    every other rank is a virtual peer driven from the bundle.

    Each real rank runs CMD (or, when asked, the recorded command) with the environment
    torchrun gave it (RANK, WORLD_SIZE of the recorded world, ...; of the recorded
    environment, only the allow-list in FORMAT.md) and sees the world it saw in production: the groups, the data
    its peers sent (bit for bit with --payload full recordings), and when they arrived.
    Each call is checked against the recording; the first mismatch stops the replay with
    exit code 3 and a report naming rank, group, sequence number and the call's stack.
    The fidelity card (recorded vs replayed iteration time and peak memory) goes to stderr;
    a program that ends before making the recorded calls fails, saying how far it got.

    Across nodes: when CMD is torchrun (or with --launcher), replay runs it once and each
    worker it starts is one real rank: worker RANK i replays the i-th rank of --ranks,
    with RANK and WORLD_SIZE of the recorded world (LOCAL_RANK stays the node's). Run the
    same replay on every node (same bundle, ranks and command; only --node-rank differs);
    nnodes x nproc-per-node must equal the number of real ranks. The real ranks meet on
    torchrun's store, through which every node's fidelity card covers every real rank.

    A hang: replay a recording of one (`prism-rr import fr` of Flight Recorder dumps, a
    flight dump, a windowed recording) with the program that made it. A real rank that
    reaches a call a peer never joined stops there, and the replay names the peers that
    never joined and the last call each made (exit 7); a rank whose program ends while a
    peer waits for a call it never made is named as the one they wait for (exit 7). A
    call that completes one every peer waits in resolves the hang, and the replay goes on.

    A failure: a recording that ended in one replays to it, with the verdict diagnose
    gives (exit 7). A drift (a rank made a call fewer in a step, and from there on calls
    paired with the wrong ones) stops each real rank at its first mispaired call; a shape
    mismatch, at its call; a call that ended in an error raises that error again in the
    program; a call that never completed (its peer killed in it) stops there; a call past
    the point where the rank's program failed or was killed stops there; a program that
    fails as it did is the failure reproduced. Exit 0 only where every recorded call
    completes (a drifting rank replayed with its fix pairs right and runs to the end);
    3 only where the program differs.

    Without the program (--from-bundle, no CMD): each real rank runs the bundle's record of
    it, its calls made through torch.distributed with its recorded compute between them,
    against the same virtual peers, checks and card (--ranks all: every rank real, the
    recorded communication run by this machine's backend; the card tables each kind of
    call's time here against the recorded, and an output that differs from the recorded
    one where every input was recorded bytes is a divergence, exit 3). A rank whose
    program failed in the recording ends as it did (its exit code or signal).
    """
    request = api.ReplayRequest(
        bundle=bundle, ranks=ranks, cmd=cmd or None, run_recorded_command=run_recorded, from_bundle=from_bundle,
        report=report, output=output, output_payload=output_payload, timing=timing, comm_scale=comm_scale,
        compute_scale=compute_scale, slow_rank=slow_rank, replace_rank=replace_rank,
        replace_downtime=replace_downtime, continue_on_divergence=continue_on_divergence, timeout=timeout,
        launcher=launcher, attempt=attempt)
    _report_replay(api.replay(request, consent=_consent), report)


def _report_replay(result, report: Path | None) -> None:
    """What `replay` (and `demo`) say of a ReplayResult; exits with its code."""
    for warning in result.warnings:
        _warn(warning)
    _say(result.card)
    if report is not None:
        _say(f"wrote {report}")
    if result.output is not None:
        _say(f"wrote {result.output} (the replay, recorded)")
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _consent(lines: list[str], asked: bool) -> bool:
    """Show the command and directory the bundle names, and say whether to run them: the
    user asked for them (--run-recorded-command), or says yes on a terminal. A bundle never
    runs on its own."""
    if not asked and not sys.stdin.isatty():
        return False
    for line in lines:
        _say(line)
    if asked:
        return True
    print("run it? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


@app.command(epilog=EXIT_CODES)
def demo(
    output: Path = typer.Option(Path("demo.prism"), "-o", "--output", help="The bundle to write."),
    world: int = typer.Option(4, "--world", help="Number of ranks (dp x tp, or dp x pp with --pp)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree; 1 runs FSDP2 x tensor parallel."),
    replay_too: bool = typer.Option(True, "--replay/--no-replay", help="Replay rank 0 against the recording afterwards."),
) -> None:
    """Record the embedded demo: a small GPT trained with FSDP2 x DTensor tensor parallel
    (or pipelining with --pp) on gloo, 3 steps after 1 warm-up, then replay rank 0.
    """
    plan = api.demo_plan(world, pp)
    _say(f"recording the demo GPT at world {world}, {plan.layout}, steps 1-3 after 1 warm-up ...")
    with _progress("packing ranks") as progress:
        recorded = api.record_demo(output, plan, warn=_warn, progress=progress)
    _report_record(recorded)
    facts = api.info(output).json()
    _say(f"  {facts['event_count']:,} records from {len(facts['recorded_ranks'])} ranks, "
         f"{facts['groups']} groups, steps {format_ranks(facts['steps'])}, {facts['bytes']:,} bytes")
    if replay_too:
        _say("replaying rank 0 against virtual peers ...")
        _report_replay(api.replay_demo(output, plan), None)
    _say("\nlook further:")
    _say(f"  prism-rr info {output}")
    _say(f"  prism-rr replay {output} --ranks 0 --run-recorded-command --report fidelity.json")


DIAGNOSE_CODES = """\
Exit codes: 0 nothing found · 5 findings · 1 any other failure · 2 usage error ·
4 bundle malformed or of an unsupported version."""


@app.command(epilog="Example: prism-rr diagnose run.prism --json > findings.json\n\n" + DIAGNOSE_CODES)
def diagnose(
    bundle: Path = typer.Argument(..., help="The .prism bundle to examine."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout: {findings: [...], summary}."),
    window: int = typer.Option(
        12_000_000, "--window", min=1, metavar="EVENTS",
        help="A bundle of more events than this is read in windows of consecutive steps of about this many "
             "events, one at a time, so memory follows the window, not the bundle (at most about 2 GiB at "
             "the default; lower it on a small machine). The findings are the same.",
    ),
    attempt: Optional[int] = typer.Option(None, "--attempt", metavar="N", help="Of a restarted job's bundle, attempt N (default: the last that failed, else the last; `info` lists them)."),
) -> None:
    """Find crashes, hangs, mismatched calls, stragglers and lost records, and explain them.

    Each finding names the ranks, the group and sequence number of the call, what each
    rank was doing, and the Python stack where it was recorded. Crashes: a rank that died
    of SIGSEGV, SIGABRT, ... with the call, the line and every frame of its stack. Killed:
    a rank whose process ended without a word (SIGKILL, the OOM killer, os._exit) while
    its peers waited for it, in a call it never made or died in. Hangs: calls some members
    entered and others never did (or, where a rank's records end because it died, whose
    fate after its last record is unknown), or that never completed. Drifts: the first
    step where a rank made fewer calls of a group than another, after which its calls pair with the wrong ones. Mismatches: members of one call
    that disagree on op, shapes, dtypes, reduce op or root; sends nobody received.
    Stragglers: ranks that arrive last far more often than chance, with the time the
    others lost waiting, and what each late rank cost: how much sooner the steps would
    have ended had it been on time, re-timed on the execution graph (see `prism-rr
    analyze --help`). Also dropped records and truncated spools. Of a restarted job's
    bundle: what ended each attempt (who first, how, in which step) and what changed from
    one attempt to the next (world, groups, hosts). A recording that Ctrl-C or SIGTERM to
    `record` stopped: which signal, when, and where each rank was (first of all).
    """


    def progress(done: int, total: int, steps: tuple[int, int], again: bool) -> None:
        what = "read again, the calls after a drift left out of the stragglers' counts:" if again else "read"
        _say(f"diagnose: {what} steps {steps[0]}-{steps[1]} (window {done} of {total})")

    said = [time.monotonic()]

    def retimed(step: int, done: int, total: int) -> None:
        # every few seconds: re-timing 8192 ranks takes a minute or more
        if time.monotonic() - said[0] >= 3.0:
            _say(f"diagnose: the stragglers' cost: step {step} re-timed ({done} of {total or '?'} steps)")
            said[0] = time.monotonic()

    found = api.diagnose(bundle, attempt=attempt, window_events=window, progress=progress, retimed=retimed)
    if as_json:
        print(json.dumps(found.json()))
    else:
        print("\n".join(found.lines()))
    if found.found:
        raise typer.Exit(5)


@app.command(epilog="Example: prism-rr analyze run.prism --steps 2:4\n\n" + EXIT_CODES)
def analyze(
    bundle: Path = typer.Argument(..., help="The .prism bundle to analyse (a recording, or an imported dump)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout: {steps: [{step, ranks, critical_path, stragglers}, ...], stragglers}."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Only steps A:B (B excluded)."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only these ranks, e.g. 0,2,4-7 (the others' calls are then unseen)."),
    attempt: Optional[str] = typer.Option(None, "--attempt", metavar="N|all", help="Of a restarted job's bundle, attempt N (default: the last that failed, else the last; `info` lists them), or all, one after the other."),
) -> None:
    """Where each rank's step time went, and who made each step slow, by how much.

    Per rank and step, four times that add up to the step. Waiting: inside a call (or
    with an async call in flight) before the call's last member arrived: waiting for a
    late peer. Exposed: inside a blocking call after its last member arrived: the
    transfer the rank sat through. Overlapped: between calls while an async call is in
    flight after its last member arrived: transfer hidden behind compute (or waited for
    in wait(), which the recording does not hold). Compute: between calls, nothing in
    flight.

    Per step, the critical path through the calls across ranks, and for each late rank
    on it its straggler cost: how much sooner the step would have ended had that rank
    never entered a call later than the latest of the others, computed by re-timing the
    step's execution graph (no replay) with the model `prism-rr replay` uses. Costs are
    one rank at a time: two equally late ranks each cost little alone. One step is in
    memory at a time.
    """
    def progress(done: int, total: int, steps: tuple[int, int]) -> None:
        _say(f"analyze: reading steps {steps[0]}-{steps[1]} (batch {done} of {total})")

    for piece in api.analysis_output(bundle, as_json=as_json, steps=steps, ranks=ranks, attempt=attempt,
                                     progress=progress):
        print(piece, end="", flush=True)


DIFF_CODES = """\
Exit codes: 0 the collective sequences match · 6 they differ (or a call one run never completed) ·
1 any other failure · 2 usage error ·
4 bundle malformed or of an unsupported version."""


@app.command(epilog="Example, in CI after every change: prism-rr diff reference.prism run.prism\n\n" + DIFF_CODES)
def diff(
    a: Path = typer.Argument(..., help="The reference bundle (A)."),
    b: Path = typer.Argument(..., help="The bundle to compare with it (B)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout: first_difference, times, ..."),
    attempt: Optional[int] = typer.Option(None, "--attempt", metavar="N", help="Attempt N of A (a restarted job's bundle; default: its default attempt)."),
    other_attempt: Optional[int] = typer.Option(None, "--other-attempt", metavar="M", help="Attempt M of B: `diff run.prism run.prism --attempt 0 --other-attempt 1` compares two attempts of one job."),
) -> None:
    """Do two recordings issue the same collectives, and where did the time go?

    For each rank and process group, the calls of B are compared with A's in order, by
    what the members of a call must agree on (op, shapes, dtypes, reduce op, root; peer
    and tag for send/recv), never by timing or data. The first call where they differ is
    shown from both runs, with its group, sequence number, step and both stacks; then,
    per step, the step time and the time inside calls, A against B, and the rank whose
    time changed most. A call one run entered and never completed where the other did not
    (a hang, a rank that died in it) is listed too, and counts as a difference. Exit 6
    when the sequences differ: record a short window after each change and diff it against
    a reference bundle in CI. Where the recorded steps differ, the steps both hold are
    compared, the step a failed run stopped in among them, up to where its records end.
    """
    said = [time.monotonic()]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - said[0] >= 3.0:  # every few seconds: 8192 ranks x 10,000 take minutes
            _say(f"diff: {done:,} of {total:,} ranks compared")
            said[0] = time.monotonic()

    result = api.diff(a, b, attempt=attempt, other_attempt=other_attempt, progress=progress)
    if as_json:
        print(json.dumps(result.json()))
    else:
        print("\n".join(result.lines()))
    if not result.same:
        raise typer.Exit(6)


@app.command(epilog="Examples: prism-rr export run.prism --format chrome -o trace.json.gz --ranks 0-7 --steps 2:3\n\n"
             "prism-rr export run.prism --format chakra -o et/run   (et/run.0.et, ..., et/run.comm_groups.json)\n\n"
             "prism-rr export run.prism --format parquet -o tables/\n\n" + EXIT_CODES)
def export(
    bundle: Path = typer.Argument(..., help="The .prism bundle to export."),
    output: Path = typer.Option(..., "-o", "--output", help="chrome: the trace file (.json, or .json.gz gzipped). "
                                "chakra: the prefix P of P.<rank>.et and P.comm_groups.json. parquet: the directory."),
    fmt: str = typer.Option("chrome", "--format", help="chrome: Chrome trace event JSON for Perfetto or chrome://tracing. "
                            "chakra: Chakra execution traces, one per rank, for ASTRA-sim. "
                            "parquet: tables of calls, compute, steps and groups for DuckDB and the like "
                            "(needs pip install 'prism-rr\\[parquet]')."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only these ranks, e.g. 0,2,4-7."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Only steps A:B (B excluded)."),
    gzip: bool = typer.Option(False, "--gzip", help="chrome: write it gzipped (as when OUTPUT ends in .gz)."),
    attempt: Optional[str] = typer.Option(None, "--attempt", metavar="N|all", help="Of a restarted job's bundle, attempt N (default: the last that failed, else the last; `info` lists them); chrome: all, every attempt on one timeline."),
) -> None:
    """Export a bundle for other tools, written as it is read (large bundles never sit in
    memory whole).

    chrome: a process per rank, compute and communication spans, arrows linking the
    members of each collective, memory counters; with --ranks, --steps and .gz, a trace of
    thousands of ranks stays small enough for Perfetto. chakra: per rank, a node per
    compute span (its measured duration) and per call (comm type, size, group; src, dst
    and tag for send/recv), each depending on the one before, plus the communicator-group
    file ASTRA-sim reads (--comm-group-configuration). parquet: calls/ (a row per call per
    rank: group, seq, op, bytes, times, step) and compute/, a file per 1024 ranks each,
    steps.parquet, groups.parquet: DuckDB, polars, Spark and Trino read them as they are.
    """
    with _progress("exporting ranks") as progress:
        stats = api.export(bundle, output, fmt=fmt, ranks=ranks, steps=steps, gzip=gzip or None, attempt=attempt,
                           progress=progress)
    if fmt == "chrome":
        _say(f"wrote {output}: {stats['events']:,} trace events from {stats['ranks']} ranks, "
             f"{stats['flows']:,} flow arrows; open it at ui.perfetto.dev")
    elif fmt == "chakra":
        _say(f"wrote {output}.<rank>.et for {stats['files']} ranks ({stats['nodes']:,} nodes: {stats['comp']:,} compute, "
             f"{stats['comm']:,} communication) and {output}.comm_groups.json"
             + (f"; {stats['unmapped']} calls of ops Chakra has no type for are compute nodes" if stats["unmapped"] else ""))
    else:
        _say(f"wrote {output}/: " + ", ".join(f"{name}{'/' if (output / name).is_dir() else '.parquet'} {rows:,} rows"
                                             for name, rows in stats.items()))


@app.command(name="redact", epilog=EXIT_CODES)
def redact_cmd(
    bundle: Path = typer.Argument(..., help="The .prism bundle to redact."),
    output: Path = typer.Option(..., "-o", "--output", help="The redacted bundle to write."),
    stacks: bool = typer.Option(True, "--stacks/--no-stacks", help="Keep stack frames as file name and line, or drop them."),
) -> None:
    """Write a copy safe to attach to a public bug report.

    Removed: payload blobs; host names and paths (replaced by stable placeholders); stack
    frames reduced to file name and line (or dropped); environment and argv reduced to an
    allow-list. Kept: shapes, timings, groups and digests, so the copy still diagnoses and
    still drives a replay without payloads. The manifest says what was removed.
    """
    note = api.redact(bundle, output, stacks=stacks)
    _say(f"wrote {output} (redacted: {', '.join(sorted(k for k in note if k != 'version'))})")


@app.command(epilog=EXIT_CODES)
def tui(
    bundle: Path = typer.Argument(..., help="The .prism bundle to browse."),
    compare: Optional[Path] = typer.Option(None, "--compare", help="A replay's bundle to compare with the recording."),
    attempt: Optional[int] = typer.Option(None, "--attempt", metavar="N", help="Of a restarted job's bundle, open attempt N first (the overview's attempt selector switches; default: the last that failed, else the last)."),
) -> None:
    """Browse a bundle in the terminal: overview, rank timelines, collectives, diagnosis,
    and recorded-vs-replayed comparison.

    Keys: 1-4 switch screens · F1 help · ? keys of this screen · ctrl+p search ops,
    groups and ranks · q quit. Only what is on screen is read, so 8192 ranks scroll.
    """
    code = api.browse(bundle, compare, attempt=attempt)  # a malformed bundle: one line, exit 4
    if code:
        raise typer.Exit(code)


@app.command(epilog="Example: prism-rr scale run.prism --dp 4096 -o big.prism\n\n" + EXIT_CODES)
def scale(
    bundle: Path = typer.Argument(..., help="A recording (or a --slice roles recording) of the job at small scale."),
    output: Path = typer.Option(..., "-o", "--output", help="The bundle of the larger job to write."),
    dp: int = typer.Option(..., "--dp", help="Data-parallel degree of the target job."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel degree (default: as recorded)."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline-parallel degree (default: as recorded)."),
    mesh: Optional[str] = typer.Option(None, "--mesh", help="The recorded layout, e.g. dp=2,tp=2, when the bundle holds no DeviceMesh."),
    latency: str = typer.Option("constant", "--latency", help="Cost model latency term: constant (alpha per call) or steps (alpha per algorithm step)."),
    bandwidth: Optional[str] = typer.Option(None, "--bandwidth", help="The target's bandwidth for every collective, e.g. 50GB/s or 400Gb/s (bytes or bits with B or b), instead of the one fitted to the recording (which a recording on other hardware, or with messages of one size, cannot tell)."),
    compare: Optional[Path] = typer.Option(None, "--compare", help="A real recording at the target size: print how far the scaled bundle's transfer times are from that recording's (the model's error out of sample)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was done (model, fitted parameters, fit error) as JSON on stdout."),
) -> None:
    """Build the execution graph of a larger job from a recorded slice.

    More data-parallel replicas, group memberships rewritten for the new mesh, and
    transfer times rescaled by a communication cost model (latency plus bytes over
    bandwidth, scaled by the collective algorithm's steps in the group size) fitted to the
    recording. One representative per role is written, so a world of 8192 is a small file;
    replay it with `prism-rr replay big.prism --ranks 0`.
    """
    with _progress("writing ranks") as progress:
        note = api.scale(bundle, output, dp=dp, tp=tp, pp=pp, mesh=mesh, latency=latency, bandwidth=bandwidth,
                         compare=compare, progress=progress)
    if as_json:
        print(json.dumps(note, default=str))
    for line in api.scale_lines(note, output, bandwidth_given=bandwidth is not None):
        _say(line)


import_app = typer.Typer(
    name="import",
    help="Make a bundle of another tool's recording, for info, diagnose, export, tui, diff and replay.",
    no_args_is_help=True,
    context_settings={"help_option_names": HELP_OPTIONS},
)
app.add_typer(import_app, name="import")


@import_app.command(name="fr", epilog="Example: prism-rr import fr /tmp/fr-dumps/ -o run.prism\n\n" + EXIT_CODES)
def import_fr(
    dumps: list[Path] = typer.Argument(..., help="PyTorch Flight Recorder dumps, one file per rank named <prefix><rank> (torch's pickle, e.g. nccl_trace_rank_0, or the JSON of _dump_fr_trace_json), or directories of them."),
    output: Path = typer.Option(..., "-o", "--output", help="The bundle to write."),
    as_json: bool = typer.Option(False, "--json", help="Print what was imported (ranks, entries, left out) as JSON on stdout."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Processes that read the dumps (default: one per CPU, up to 32, for 64 dumps or more on 4 CPUs or more)."),
) -> None:
    """Import PyTorch Flight Recorder dumps (one per rank) as a bundle that info, verify,
    diagnose, export, tui and diff read, and that replay runs the program that made them
    against (prism-rr replay fr.prism --ranks 0 -- python train.py): the hang reproduced.

    Each entry becomes a call: its process group (named as torch named it), sequence
    number, op, sizes, dtypes, when it was created and whether it completed, and the
    user's frames of its stack (pickle dumps only). A pickle is read by an interpreter
    that builds only plain containers and scalars: a dump that names or calls anything
    is refused (exit 4) before anything runs. Lost: payloads, step boundaries, compute,
    memory, the root of broadcasts and the reduce op; gloo dumps have no completion times
    and no sends or receives.
    """
    with _progress("reading dumps") as progress:
        imported = api.import_fr(dumps, output, jobs=jobs, progress=progress)
    if as_json:
        print(json.dumps(imported.json()))
    for line in imported.lines():
        _say(line)


@contextmanager
def _progress(label: str):
    """A `progress(done, total)` for long work: on a terminal, rich's bar with the count,
    the rate and the time left, drawn on stderr from the first call to the end of the
    block; elsewhere None (a program reading stderr hears nothing of it)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    unit = label.rsplit(" ", 1)[-1]
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=Console(stderr=True))
    task = None

    def show(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task(label, total=total, rate="")
        bar.update(task, completed=done, total=total)
        speed = bar.tasks[0].speed
        if speed:
            bar.update(task, rate=f"{speed:,.1f} {unit}/s")

    try:
        yield show
    finally:
        if task is not None:
            bar.stop()


_METAVARS = {"str": "TEXT", "int": "N", "float": "X", "Path": "PATH"}


def _prose(text: str) -> str:
    """Paragraphs as prose, whatever the terminal's width: the line breaks of a docstring
    inside a paragraph become spaces (typer's rich help keeps them, and a help read in 80
    columns broke mid sentence). A paragraph with an indented line (an example) keeps its
    lines."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") or any(line[:1].isspace() for line in p.splitlines())
                       else " ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _tidy(command, ctx_cls) -> None:
    """Every command's help as prose, and each option's value named as a word (a flag shows
    none) rather than typer's `<bool>` and `<str>`."""
    stack = [command]
    while stack:
        c = stack.pop()
        if c.help:
            c.help = _prose(c.help)
        if c.epilog:
            c.epilog = _prose(c.epilog)
        # the app's -h/--help, which a context made here would not inherit: click keeps the
        # help option it makes first, and the real invocation would then lack -h
        help_option = c.get_help_option(ctx_cls(c, info_name=c.name, help_option_names=HELP_OPTIONS))
        for p in [*c.params, *([help_option] if help_option is not None else [])]:
            if p.param_type_name != "option" or p.metavar is not None:
                continue
            if getattr(p, "is_flag", False) or getattr(p, "count", False):
                p.metavar = ""
            else:
                bare = getattr(p, "bare_type", None)
                p.metavar = _METAVARS.get(bare() if bare else "", "VALUE")
        stack.extend(getattr(c, "commands", {}).values())


def main() -> None:
    """Entry point: one line on stderr for a user error, never a traceback."""
    try:
        command = typer.main.get_command(app)
        _tidy(command, typer.Context)
        command()  # click's standalone mode prints usage errors and exits 2 itself
    except PrismError as exc:
        _say(f"prism-rr: error: {exc}")
        sys.exit(exit_code_for(exc))
    except OSError as exc:
        _say(f"prism-rr: error: {exc}")
        sys.exit(1)
    except MemoryError:
        _say("prism-rr: error: out of memory")
        sys.exit(1)


if __name__ == "__main__":
    main()
