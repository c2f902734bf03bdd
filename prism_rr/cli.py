"""The `prism-rr` command: parses arguments, calls the library, maps errors to exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from prism_rr._version import __version__
from prism_rr.errors import PrismError, UsageError, exit_code_for

EXIT_CODES = """\
Exit codes: 0 ok · 1 any other failure · 2 usage error · 3 replay diverged ·
4 bundle malformed or of an unsupported version · 5 diagnose found problems ·
6 replay: the program ended before making the recorded calls."""

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
    for f in facts["recorder_failures"]:
        lines.append(f"recorder off    rank {f['rank']} from step {f['step']}: {f['reason']}")
    print("\n".join(lines))


def bundle_facts(b) -> dict:
    """The facts `info --json` prints."""
    ranks = b.summaries["ranks"]
    failures = _recorder_failures(b)
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
        "recorder_failed_ranks": [f["rank"] for f in failures],
        "recorder_failures": failures,
    }


def _recorder_failures(b) -> list[dict]:
    """Ranks whose recorder turned itself off: {rank, step, reason}, from the rank info
    (a rank notes it there as well as in a `recorder_failed` marker), so no chunk is read."""
    out = []
    for rank in b.recorded_ranks:
        f = b.rank_info(rank).get("recorder_failed")
        if type(f) is not dict:
            continue
        step = f.get("step")
        reason = f.get("reason")
        out.append({
            "rank": rank,
            "step": step if type(step) is int else None,
            "reason": reason[:500] if type(reason) is str else "unknown",
        })
    return out


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
    redact: bool = typer.Option(False, "--redact", help="Make it safe for a public bug report (see `prism-rr redact --help`)."),
    stacks: bool = typer.Option(True, "--stacks/--no-stacks", help="With --redact: keep stack frames as file name and line, or drop them."),
) -> None:
    """Pack a directory of spools into one portable bundle.

    Chunks are copied as they are; a spool with a torn tail is packed up to its last
    complete frame and its rank is marked truncated.
    """
    from prism_rr.format import pack as pack_spools

    target = output.with_name(output.name + ".unredacted") if redact else output
    result = pack_spools(spool_dir, target, progress=_progress("packing ranks"))
    for rank, why in sorted(result.torn.items()):
        _say(f"warning: rank {rank}: tail dropped ({why})")
    if redact:
        from prism_rr.format.redact import redact as redact_bundle

        try:
            redact_bundle(target, output, stacks=stacks)
        finally:
            target.unlink(missing_ok=True)
        _say(f"wrote {output} (redacted): {result.ranks} ranks, {result.events:,} records, "
             f"{output.stat().st_size:,} bytes")
        return
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


@app.command(
    epilog="Example: prism-rr record -o run.prism --nproc 4 --steps 1:4 -- python train.py --lr 3e-4\n\n"
    + EXIT_CODES,
    context_settings={"allow_interspersed_args": False},
)
def record(
    cmd: list[str] = typer.Argument(..., metavar="-- CMD...", help="The training command, after --."),
    output: Path = typer.Option(..., "-o", "--output", help="The bundle to write; spools go to OUTPUT.d/."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Record only steps A:B (B excluded), e.g. 1:4."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Record only these ranks, e.g. 0,2,4-7."),
    payload: str = typer.Option("digest", "--payload", help="none: metadata only · digest: a hash of each tensor, and calls of at most 1 KiB whole (control data: sizes, flags, losses) · full: the tensors themselves."),
    ops: bool = typer.Option(False, "--ops", help="Also record every operator (name, shapes, duration)."),
    memory: bool = typer.Option(False, "--memory", help="Track live tensor memory on CPU (CUDA statistics are always read)."),
    nproc: int = typer.Option(0, "--nproc", help="Start this many local ranks with torchrun's environment (0: CMD starts its own ranks, e.g. torchrun)."),
    slice_: Optional[str] = typer.Option(None, "--slice", help="roles: record one representative rank per role (ranks doing the same work), plus --ranks. The layout comes from --mesh, else from the DeviceMesh the program builds, else from its groups at the first step."),
    mesh: Optional[str] = typer.Option(None, "--mesh", help="With --slice roles: the job's layout, e.g. dp=4,tp=2 (row-major, last dimension fastest, as init_device_mesh); ranks then decide before the program starts."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Stop the run after this many seconds (a hang still yields a bundle)."),
) -> None:
    """Record a training run into a bundle, without editing the training code.

    CMD is whatever starts the Python ranks: `torchrun ... train.py`, a cluster launcher,
    or `python train.py` with --nproc. Every rank records its collectives, point-to-point
    calls, compute gaps, steps and memory into OUTPUT.d/; when CMD ends (or crashes, or is
    interrupted) the spools are packed into OUTPUT.
    """
    _record_run(cmd, output, steps=steps, ranks=ranks, payload=payload, ops=ops, memory=memory,
                nproc=nproc, slice_=slice_, mesh=mesh, timeout=timeout)


def _record_run(cmd, output: Path, *, steps=None, ranks=None, payload="digest", ops=False,
                memory=False, nproc=0, slice_=None, mesh=None, timeout=None) -> None:
    from prism_rr.errors import UsageError
    from prism_rr.format import pack as pack_spools
    from prism_rr.recorder.launch import record_command
    from prism_rr.recorder._options import spool_dir_for

    if not cmd:
        raise UsageError("give the training command after --, e.g. prism-rr record -o run.prism -- torchrun ...")
    if nproc < 0:
        raise UsageError("--nproc must be 0 or more")
    if slice_ is not None and nproc:
        from prism_rr.topology.roles import parse_mesh

        parse_mesh(mesh or "", nproc)  # a wrong layout fails now, not in every rank
    if nproc:
        cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(nproc), "--", *cmd]
    spool_dir = spool_dir_for(output)
    try:
        code = record_command(cmd, output, steps=steps, ranks=ranks, payload=payload, ops=ops,
                              memory=memory, slice=slice_, mesh=mesh, timeout=timeout)
    except OSError as exc:
        _left_behind(spool_dir, output)
        _say(f"prism-rr: error: recording into {spool_dir}/ failed: {exc}")
        if any(spool_dir.glob("rank-*.spool")):
            _say_spools(spool_dir, output)
        raise typer.Exit(1)
    if code != 0:
        _say(f"warning: the command exited with code {code}; packing what was recorded")
    if not any(spool_dir.glob("rank-*.spool")):
        raise UsageError(
            f"nothing was recorded: no rank called torch.distributed.init_process_group "
            f"(is CMD a PyTorch distributed program? exit code {code})"
        )
    exit_code = code if code < 128 else 1
    try:
        extra = None
        if slice_ is not None:
            from prism_rr.topology.roles import spool_roles
            from prism_rr.recorder._options import parse_ranks

            roles = spool_roles(spool_dir, mesh, extra=parse_ranks(ranks) or ())
            extra = {"roles": roles} if roles is not None else None
            if roles is None:
                _say("warning: --slice roles: no layout was found (no DeviceMesh, and the groups form no mesh); "
                     "every rank was recorded")
        result = pack_spools(spool_dir, output, manifest_extra=extra, progress=_progress("packing ranks"))
    except OSError as exc:
        # A full disk (or a read-only one): the training's outcome and the spools are
        # what matter now; say where they are and how to pack them elsewhere.
        _left_behind(spool_dir, output)
        outcome = (f"the command exited with code {code}" if code != 0
                   else "the command succeeded (exit code 0)")
        _say(f"prism-rr: error: could not write {output}: {exc}; {outcome}, but no bundle was written")
        _say_spools(spool_dir, output)
        raise typer.Exit(exit_code or 1)
    for rank, why in sorted(result.torn.items()):
        _say(f"warning: rank {rank}: tail of its spool lost ({why})")
    _say(f"wrote {output}: {result.ranks} ranks, {result.events:,} records, {result.bytes:,} bytes")
    _say_recorder_failures(output)
    if code != 0:
        raise typer.Exit(exit_code)


def _say_spools(spool_dir: Path, output: Path) -> None:
    _say(f"prism-rr: the spools are in {spool_dir}/; pack them elsewhere with:\n"
         f"  prism-rr pack {spool_dir} -o ELSEWHERE/{output.name}")


def _left_behind(spool_dir: Path, output: Path) -> None:
    """Remove the half-written files a failed write leaves: the bundle's `.partial`, and
    `.tmp` files in the spool directory (the spools and whole blobs stay)."""
    for path in [output.with_name(output.name + ".partial"), *spool_dir.glob("*.tmp"),
                 *spool_dir.glob("blobs/*/*.tmp")]:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _say_recorder_failures(output: Path) -> None:
    """One line per rank whose recorder turned itself off (the training went on)."""
    from prism_rr.format import open_bundle

    try:
        with open_bundle(output) as b:
            failures = _recorder_failures(b)
    except Exception as exc:
        _say(f"warning: could not read back {output}: {exc}")
        return
    for f in failures:
        step = "?" if f["step"] is None else f["step"]
        _say(f"warning: rank {f['rank']}: the recorder turned itself off at step {step} ({f['reason']}); "
             f"the training went on, the rank's records stop there")


@app.command(
    epilog="Example: prism-rr replay run.prism --ranks 0 --report fidelity.json -- python train.py\n\n"
    + EXIT_CODES + "\nReplay also: 6 the program ended before making the recorded calls · 124 --timeout.",
)
def replay(
    bundle: Path = typer.Argument(..., help="The recorded .prism bundle."),
    cmd: Optional[list[str]] = typer.Argument(None, metavar="[-- CMD...]", help="The command each real rank runs (the training code, perhaps edited), in this directory."),
    run_recorded: bool = typer.Option(False, "--run-recorded-command", "--yes", help="Without -- CMD: run the command and working directory the bundle names (shown first). Without this or -- CMD, a terminal asks; anything else stops with exit 2. Bundles come from strangers: read the command first."),
    ranks: str = typer.Option("0", "--ranks", help="Ranks to run for real, e.g. 0 or 0,1; every other rank is a virtual peer."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the fidelity report (JSON) here."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Record the replay itself into this bundle, to compare with the recording."),
    output_payload: Optional[str] = typer.Option(None, "--output-payload", help="Payload mode of the replay's own recording (default: what the recording kept)."),
    timing: str = typer.Option("live", "--timing", help="live: virtual peers arrive and transfers take as long as recorded · virtual: a virtual clock calibrated on the first step, for replaying on other hardware (a CPU replay of a GPU run) · none: no waiting."),
    comm_scale: float = typer.Option(1.0, "--comm-scale", help="What if every transfer took X times as long?"),
    compute_scale: float = typer.Option(1.0, "--compute-scale", help="What if every virtual rank's compute took X times as long?"),
    slow_rank: Optional[str] = typer.Option(None, "--slow-rank", help="What if virtual rank R computed F times slower? R:F[,R:F]"),
    continue_on_divergence: bool = typer.Option(False, "--continue-on-divergence", help="Log a divergence and go on instead of stopping (exit 3)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Stop the replay after this many seconds."),
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
    """
    _replay_run(bundle, cmd=cmd, ranks=ranks, report=report, output=output,
                output_payload=output_payload, timing=timing, comm_scale=comm_scale,
                compute_scale=compute_scale, slow_rank=slow_rank,
                continue_on_divergence=continue_on_divergence, timeout=timeout,
                run_recorded_command=run_recorded)


def _replay_run(bundle: Path, *, cmd=None, ranks="0", report=None, output=None, output_payload=None,
                timing="live", comm_scale=1.0, compute_scale=1.0, slow_rank=None,
                continue_on_divergence=False, timeout=None, run_recorded_command=False) -> None:
    from prism_rr.errors import UsageError
    from prism_rr.replayer import replay as run_replay

    if timing not in ("live", "virtual", "none"):
        raise UsageError(f"--timing must be live, virtual or none, not {timing!r}")
    if cmd and run_recorded_command:
        raise UsageError("give either -- CMD or --run-recorded-command, not both")
    if not cmd:
        _consent_to_recorded_command(bundle, ranks, asked=run_recorded_command)
    result = run_replay(
        bundle, ranks=ranks, cmd=cmd or None, report=report, output=output,
        output_payload=output_payload, timing=timing, comm_scale=comm_scale,
        compute_scale=compute_scale, slow_rank=slow_rank,
        continue_on_divergence=continue_on_divergence, timeout=timeout,
        run_recorded_command=not cmd,
    )
    for warning in result.warnings:
        _say(f"warning: {warning}")
    _say(result.card)
    if report is not None:
        _say(f"wrote {report}")
    if result.output is not None:
        _say(f"wrote {result.output} (the replay, recorded)")
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _shown(text: str) -> str:
    """`text` with control characters escaped: a bundle must not draw on the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _consent_to_recorded_command(bundle: Path, ranks, *, asked: bool) -> None:
    """Show the command and directory the bundle names; go on only if the user asked for
    them (--run-recorded-command) or says yes on a terminal. A bundle never runs on its own."""
    import shlex

    from prism_rr.errors import UsageError
    from prism_rr.replayer.launch import recorded_commands

    refuse = _shown(f"{bundle.name}: replay runs the command a bundle names only when asked: give the command "
                    f"after -- (prism-rr replay {bundle} --ranks {ranks} -- python train.py), "
                    f"or pass --run-recorded-command")
    if not asked and not sys.stdin.isatty():
        raise UsageError(refuse)
    shown: dict[tuple[str, str], list[int]] = {}
    for r, (argv, cwd) in recorded_commands(bundle, ranks).items():
        shown.setdefault((_shown(shlex.join(argv)), _shown(cwd)), []).append(r)
    for (argv, cwd), rs in shown.items():
        _say(f"{bundle.name} names this command for rank{'s' if len(rs) > 1 else ''} {_ranges(rs)}:\n"
             f"  {argv}\n  in {cwd}")
    if asked:
        return
    print("run it? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise UsageError(refuse)


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
    from prism_rr.errors import UsageError

    if world < 1 or pp < 1 or world % pp:
        raise UsageError("--world must be a positive multiple of --pp")
    train = [sys.executable, "-m", "prism_rr.demo.train", "--steps", "4", "--quiet"]
    if pp > 1:
        train += ["--pp", str(pp)]
        layout = f"pp{pp} x dp{world // pp}"
    else:
        tp = 2 if world % 2 == 0 else 1
        train += ["--tp", str(tp)]
        layout = f"dp{world // tp} x tp{tp} (FSDP2 x DTensor TP)"
    _say(f"recording the demo GPT at world {world}, {layout}, steps 1-3 after 1 warm-up ...")
    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(world), "--timeout", "300", "--", *train]
    _record_run(cmd, output, steps="1:4", payload="digest", memory=True, timeout=600)
    from prism_rr.format import open_bundle

    with open_bundle(output) as b:
        facts = bundle_facts(b)
    _say(f"  {facts['event_count']:,} records from {len(facts['recorded_ranks'])} ranks, "
         f"{facts['groups']} groups, steps {_ranges(facts['steps'])}, {facts['bytes']:,} bytes")
    if replay_too:
        _say("replaying rank 0 against virtual peers ...")
        _replay_run(output, ranks="0", timeout=300, cmd=train)
    _say("\nlook further:")
    _say(f"  prism-rr info {output}")
    _say(f"  prism-rr replay {output} --ranks 0 --run-recorded-command --report fidelity.json")


DIAGNOSE_CODES = """\
Exit codes: 0 nothing found · 5 findings · 1 any other failure · 2 usage error ·
4 bundle malformed or of an unsupported version."""


@app.command(epilog=DIAGNOSE_CODES)
def diagnose(
    bundle: Path = typer.Argument(..., help="The .prism bundle to examine."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout: {findings: [...], summary}."),
) -> None:
    """Find crashes, hangs, mismatched calls, stragglers and lost records, and explain them.

    Each finding names the ranks, the group and sequence number of the call, what each
    rank was doing, and the Python stack where it was recorded. Crashes: a rank that died
    of SIGSEGV, SIGABRT, ... with the call, the line and every frame of its stack. Hangs:
    calls some members entered and others never did (or, where a rank's records end
    because it died, whose fate after its last record is unknown), or that never
    completed. Drifts: the first step where a rank made fewer calls of a group than
    another, after which its calls pair with the wrong ones. Mismatches: members of one call
    that disagree on op, shapes, dtypes, reduce op or root; sends nobody received.
    Stragglers: ranks that arrive last far more often than chance, with the time the
    others lost waiting. Also dropped records and truncated spools.
    """
    from prism_rr.format import open_bundle
    from prism_rr.analysis import diagnose as find, diagnosis_json

    with open_bundle(bundle) as b:
        findings = find(b)
    if as_json:
        print(json.dumps(diagnosis_json(findings)))
    elif not findings:
        print("no problems found")
    else:
        for i, f in enumerate(findings, 1):
            where = f"group {f.group} seq {f.seq}" if f.group is not None else ""
            print(f"{i}. [{f.kind}] ranks {_ranges(list(f.ranks))} {where}".rstrip())
            print(f"   {f.message}")
            if f.stack:
                print(f"   at {' <- '.join(f.stack)}")
    if findings:
        raise typer.Exit(5)


@app.command(epilog=EXIT_CODES)
def export(
    bundle: Path = typer.Argument(..., help="The .prism bundle to export."),
    output: Path = typer.Option(..., "-o", "--output", help="The trace file to write."),
    fmt: str = typer.Option("chrome", "--format", help="chrome: Chrome trace event JSON (open it in Perfetto or chrome://tracing)."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only these ranks, e.g. 0,2,4-7."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Only steps A:B (B excluded)."),
) -> None:
    """Export a bundle as a trace for Perfetto: a process per rank, compute and
    communication spans, arrows linking the members of each collective, memory counters.

    The trace is written as it is read, so large bundles never sit in memory whole.
    """
    from prism_rr.errors import UsageError
    from prism_rr.format import open_bundle
    from prism_rr.analysis import export_chrome
    from prism_rr.recorder._options import parse_ranks, parse_steps

    if fmt != "chrome":
        raise UsageError(f"--format must be chrome, not {fmt!r}")
    window = parse_steps(steps)
    if window is not None:
        lo, hi = window
        window = (lo or 0, (hi - 1) if hi is not None else 2**31 - 1)
    rank_list = list(parse_ranks(ranks)) if ranks else None
    with open_bundle(bundle) as b:
        stats = export_chrome(b, output, ranks=rank_list, steps=window)
    _say(f"wrote {output}: {stats['events']:,} trace events from {stats['ranks']} ranks, "
         f"{stats['flows']:,} flow arrows; open it at ui.perfetto.dev")


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
    from prism_rr.format.redact import redact as redact_bundle

    note = redact_bundle(bundle, output, stacks=stacks)
    _say(f"wrote {output} (redacted: {', '.join(sorted(k for k in note if k != 'version'))})")


@app.command(epilog=EXIT_CODES)
def tui(
    bundle: Path = typer.Argument(..., help="The .prism bundle to browse."),
    compare: Optional[Path] = typer.Option(None, "--compare", help="A replay's bundle to compare with the recording."),
) -> None:
    """Browse a bundle in the terminal: overview, rank timelines, collectives, diagnosis,
    and recorded-vs-replayed comparison.

    Keys: 1-4 switch screens · F1 help · ? keys of this screen · ctrl+p search ops,
    groups and ranks · q quit. Only what is on screen is read, so 8192 ranks scroll.
    """
    from prism_rr.format import open_bundle
    from prism_rr.tui.app import PrismApp

    # Fail with a one-line error before the terminal is taken over.
    for path in (bundle, compare):
        if path is not None:
            open_bundle(path).close()
    app = PrismApp(bundle, compare)
    app.run()
    if app.bundle_error is not None:  # found while browsing: one line, exit 4
        raise app.bundle_error
    if app.return_code:
        raise typer.Exit(app.return_code)


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
    from prism_rr.topology.scale import scale as scale_bundle

    if compare is not None:
        from prism_rr.format import open_bundle

        open_bundle(compare).close()  # a bad path fails before the work
    note = scale_bundle(bundle, output, dp=dp, tp=tp, pp=pp, mesh=mesh, latency=latency,
                        bandwidth=None if bandwidth is None else parse_bandwidth(bandwidth),
                        progress=_progress("writing ranks"))
    if compare is not None:
        from prism_rr.topology.scale import compare_transfers

        note["compare"] = dict(compare_transfers(output, compare), against=str(compare))
    if as_json:
        print(json.dumps(note, default=str))
    fit = note["model"]["fit_error"]
    _say(f"wrote {output}: world {note['to']['world_size']} ({note['roles']} role{'s' if note['roles'] != 1 else ''} written), "
         f"cost model fitted on {fit['samples']} calls, mean abs error {fit['mape_pct']:.0f}%")
    unknown = note["model"].get("bandwidth_unidentified") or []
    if unknown and bandwidth is None:
        _say(f"note: the recording does not tell the bandwidth of {', '.join(unknown)} (message sizes too alike, "
             f"or times too scattered): bytes there cost {'the pooled rate' if note['model'].get('pooled_bandwidth_identified') else 'nothing'}; "
             f"give the target's with --bandwidth")
    if compare is not None:
        c = note["compare"]
        if not c["calls"]:
            _say(f"compared with {compare}: no call of the one matches a call of the other (group, seq)")
        else:
            _say(f"compared with {compare}: {c['calls']} calls, total transfer time {c['total_error_pct']:+.1f}%, "
                 f"mean abs error per call {c['call_mape_pct']:.1f}%")
            for fam, row in c["ops"].items():
                _say(f"  {fam:<15} {row['calls']:>5} calls  recorded {row['recorded_mean_us']:>10.1f} us  "
                     f"predicted {row['predicted_mean_us']:>10.1f} us  ({row['mean_error_pct']:+.1f}%)")


def parse_bandwidth(text: str) -> float:
    """'50GB/s', '400Gb/s', '25e9', '1.5G' -> bytes per second (b: bits; K, M, G, T: 10^3k)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)([bB]?)(?:/s|ps)?\s*", text)
    if not m:
        raise UsageError(f"a bandwidth looks like 50GB/s, 400Gb/s or 25e9, not {text!r}")
    value = float(m.group(1)) * 1000 ** " KMGT".index(m.group(2).upper() or " ")
    if m.group(3) == "b":
        value /= 8
    if value <= 0:
        raise UsageError(f"bandwidth must be positive, not {text!r}")
    return value


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
    except MemoryError:
        _say("prism-rr: error: out of memory")
        sys.exit(1)


if __name__ == "__main__":
    main()
