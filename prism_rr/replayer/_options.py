"""What a replay is asked (`ReplayRequest`: from the command line, or a script, to the
launcher) and what a replaying rank needs to know (`ReplayOptions`: carried to it as JSON
in one environment variable)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from prism_rr.errors import UsageError
from prism_rr.specs import parse_slow_rank

__all__ = ["BACKEND", "ENV_VAR", "TIMINGS", "ReplayOptions", "ReplayRequest", "stats_path"]

ENV_VAR = "PRISM_RR_REPLAY"
BACKEND = "prism_rr_replay"  # the name a replayed rank's groups take, for torch and the policy
# live: a call completes when the modelled peers would let it, in real time; virtual: the
# same on a virtual clock, the real rank's compute calibrated against the recording on the
# first step (nobody waits); none: as soon as the data is there.
TIMINGS = ("live", "virtual", "none")


def stats_path(work_dir, rank: int) -> Path:
    """Where real rank `rank` writes what it saw (stats, divergences) for the launcher."""
    return Path(work_dir) / f"rank-{rank:05d}.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRequest:
    """One replay as asked: the one definition of the options that `prism-rr replay`,
    `prism_rr.api.replay` and `prism_rr.replayer.replay` take. What can be checked
    without the bundle is checked here, once; the launcher reads the bundle and makes
    each real rank's ReplayOptions of it. The fields are `prism_rr.replayer.replay`'s
    keywords (its docstring says what each does)."""

    bundle: str | Path
    ranks: object = (0,)  # "0,2-3", "all", an int or ints: the real ranks
    cmd: tuple[str, ...] | None = None  # what each real rank runs (None: see run_recorded_command, from_bundle)
    run_recorded_command: bool = False  # run the command the bundle names (the user has seen it)
    from_bundle: bool = False  # no program: each real rank makes its recorded calls (driver.py)
    launcher: bool | None = None  # cmd starts one worker per real rank (None: when cmd is torchrun)
    attempt: int | None = None  # of a restarted job (None: the bundle's default attempt)
    report: str | Path | None = None  # where the fidelity report (JSON) is written
    output: str | Path | None = None  # record the replay itself into this bundle
    output_payload: str | None = None  # its payload mode (None: what the recording kept)
    timing: str = "live"
    comm_scale: float = 1.0
    compute_scale: float = 1.0
    slow_rank: object = ()  # "R:F,R:F", {rank: factor} or pairs; kept as sorted pairs
    replace_rank: object = None  # "R@STEP", a list of those, pairs, or planned entries (_replace.py)
    replace_downtime: float | None = None
    continue_on_divergence: bool = False
    timeout: float | None = None
    cwd: str | Path | None = None  # where the real ranks run (default: here, or the recorded one)
    log_dir: str | Path | None = None  # each rank's stdout and stderr go to files here
    env: dict | None = None  # more environment for every real rank

    def __post_init__(self):
        put = object.__setattr__
        put(self, "cmd", tuple(self.cmd) if self.cmd else None)
        put(self, "slow_rank", parse_slow_rank(self.slow_rank))
        if self.timing not in TIMINGS:
            raise UsageError(f"--timing must be {', '.join(TIMINGS[:-1])} or {TIMINGS[-1]}, not {self.timing!r}")
        if self.cmd and self.run_recorded_command:
            raise UsageError("give either -- CMD or --run-recorded-command, not both")
        if self.from_bundle and (self.cmd or self.run_recorded_command or self.launcher):
            raise UsageError("a replay whose program is the bundle (--from-bundle) runs no command: give neither "
                             "-- CMD nor --run-recorded-command nor --launcher")
        for name in ("comm_scale", "compute_scale"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive, not {getattr(self, name)!r}")
        for rank, factor in self.slow_rank:
            if not factor > 0:
                raise UsageError(f"slow_rank factor for rank {rank} must be positive, not {factor!r}")

    @classmethod
    def of(cls, request, asks: dict) -> ReplayRequest:
        """`request` itself, or the request for the bundle `request` with the fields `asks`."""
        if not isinstance(request, cls):
            return cls(bundle=request, **asks)
        if asks:
            raise TypeError(f"give the request or its fields, not both: {sorted(asks)}")
        return request

    @property
    def names_no_program(self) -> bool:
        """Neither a command nor the bundle as the program: the command the bundle names
        would run, which it does only with `run_recorded_command` (show it first)."""
        return not self.cmd and not self.from_bundle

    def agreed(self) -> ReplayRequest:
        """This request once the user has seen the recorded command and agreed to run it."""
        return replace(self, run_recorded_command=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOptions:
    """One replay's settings, the same on every real rank."""

    bundle: str
    ranks: tuple[int, ...]  # the real ranks, sorted
    attempt: int | None = None  # the attempt of a restarted job replayed (None: the bundle's default)
    work_dir: str  # where each real rank writes rank-NNNNN.json (stats, divergences)
    timing: str = "live"
    continue_on_divergence: bool = False
    real_port: int = 0  # TCPStore of the real ranks among themselves (2+ real ranks)
    comm_scale: float = 1.0  # every transfer this many times as long
    compute_scale: float = 1.0  # every rank's compute this many times as long
    slow_rank: tuple[tuple[int, float], ...] = ()  # (virtual rank, factor on its compute)
    replace_rank: tuple[tuple[int, int, int], ...] = ()  # (virtual rank, step, downtime ns): _replace.py
    output: str | None = None  # spool directory of the replay's own recording (-o)
    payload: str = "none"  # what the replay's own recording keeps
    # Under a launcher (torchrun): worker RANK i of len(ranks) is recorded rank ranks[i] of
    # world_size; the real ranks meet on the launcher's store (_torchrun.py).
    launcher: bool = False
    world_size: int = 0  # the recorded world (launcher mode)
    # How the recording failed: diagnose's drifts and mismatches, each {"kind", "group",
    # "seq", "ranks", "reference", "step", "message"} (launch._recorded_endings)
    endings: tuple[dict, ...] = ()

    def __post_init__(self):
        # timing, the scales and the factors were checked once, in the ReplayRequest
        if not self.ranks:
            raise UsageError("a replay needs at least one real rank")
        for rank, _ in self.slow_rank:
            if rank in self.ranks:
                raise UsageError(f"slow_rank {rank} is a real rank; slow_rank applies to virtual ranks")
        for rank, step, down in self.replace_rank:
            if rank in self.ranks:
                raise UsageError(f"replace_rank {rank}@{step}: rank {rank} is a real rank; a replaced rank is a "
                                 f"virtual one")
            if down < 0:
                raise UsageError(f"replace_rank {rank}@{step}: a downtime is 0 s or more, not {down / 1e9!r} s")

    def slow_rank_map(self) -> dict[int, float]:
        return dict(self.slow_rank)

    def replaced_map(self) -> dict[int, list[tuple[int, int]]]:
        """Virtual rank -> [(step, downtime ns)]: the timing model's form."""
        out: dict[int, list[tuple[int, int]]] = {}
        for rank, step, down in self.replace_rank:
            out.setdefault(rank, []).append((step, down))
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReplayOptions:
        d = json.loads(text)
        if not isinstance(d, dict) or "bundle" not in d:
            raise UsageError(f"{ENV_VAR} must be a JSON object with a bundle")
        return cls(
            bundle=str(d["bundle"]),
            attempt=None if d.get("attempt") is None else int(d["attempt"]),
            ranks=tuple(sorted(int(r) for r in d.get("ranks", ()))),
            work_dir=str(d["work_dir"]),
            timing=str(d.get("timing", "live")),
            continue_on_divergence=bool(d.get("continue_on_divergence", False)),
            real_port=int(d.get("real_port", 0)),
            comm_scale=float(d.get("comm_scale", 1.0)),
            compute_scale=float(d.get("compute_scale", 1.0)),
            slow_rank=tuple((int(r), float(f)) for r, f in d.get("slow_rank", ())),
            replace_rank=tuple((int(r), int(s), int(n)) for r, s, n in d.get("replace_rank", ())),
            output=d.get("output"),
            payload=str(d.get("payload", "none")),
            launcher=bool(d.get("launcher", False)),
            world_size=int(d.get("world_size", 0)),
            endings=tuple(e for e in d.get("endings", ()) if isinstance(e, dict)),
        )
