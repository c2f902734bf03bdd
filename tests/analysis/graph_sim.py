"""A tiny simulator of a synchronised multi-rank run, written as real spools and packed.

Unlike `prism_rr.format.synthetic` (independent per-rank timelines), a collective here
completes on every member at the last arrival plus a transfer time, as on real hardware,
so waiting, skew and stragglers are what a real run would show. Problems are planted by
hand: a skipped call, another shape, a slow rank, a killed rank, dropped records.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from prism_rr.format import layout, pack
from prism_rr.format.records import Collective, Compute, GroupInfo, Marker, Memory, PointToPoint, Step
from prism_rr.format.spool import encode_frame, spool_header, spool_path

HOST = "gpu-node-17.corp.example.com"
HOME = "/home/alice.smith"
SECRET = "s3cr3t-t0ken-value-42"


class SimRun:
    def __init__(self, world: int, *, groups: list[tuple[int, ...]] | None = None, offsets=None,
                 stack_paths: bool = True):
        self.world = world
        self.groups = [tuple(range(world))] + list(groups or [])
        self.offsets = offsets or {r: 0 for r in range(world)}  # each rank's clock minus rank 0's
        self.t = {r: 1_000_000_000 for r in range(world)}  # true time, per rank
        self.recs: dict[int, list] = {r: [] for r in range(world)}
        self.seq: dict[tuple[int, int], int] = defaultdict(int)
        self.p2p_seq: dict[tuple[int, str, int], int] = defaultdict(int)
        self.step = 0
        self.step_start = dict(self.t)
        self.stuck: set[int] = set()
        self.dead: set[int] = set()
        self.mem = {r: 100 << 20 for r in range(world)}
        self.stack_paths = stack_paths
        for gid, ranks in enumerate(self.groups):
            for r in ranks:
                self._add(r, GroupInfo(start_ns=self._c(r), end_ns=self._c(r), step=0, group=gid, ranks=ranks,
                                       name=str(gid), text="default_pg" if gid == 0 else f"sub{gid}", backend="gloo"))

    # clock of rank r at its current true time
    def _c(self, r, t=None):
        return (self.t[r] if t is None else t) + self.offsets[r]

    def _add(self, r, rec):
        if r not in self.dead:
            self.recs[r].append(rec)

    def _stack(self, line: int):
        if self.stack_paths:
            return (f"{HOME}/project/train.py:{line} in train_step", f"{HOME}/project/model.py:41 in forward")
        return (f"train.py:{line} train_step",)

    def active(self):
        return [r for r in range(self.world) if r not in self.stuck and r not in self.dead]

    def compute(self, dur: int | dict, ranks=None):
        for r in ranks if ranks is not None else self.active():
            if r in self.stuck or r in self.dead:
                continue
            d = dur[r] if isinstance(dur, dict) else dur + (r * 7919) % 3000
            self._add(r, Compute(start_ns=self._c(r), end_ns=self._c(r, self.t[r] + d), step=self.step,
                                 mem_alloc=self.mem[r], mem_peak=self.mem[r]))
            self.t[r] += d

    def collective(self, group: int = 0, op: str = "all_reduce", shape=(1024,), dtype="float32", *,
                   skip=(), transfer: int = 30_000, override=None, reduce_op="sum", root=None, line=88):
        """Members not in `skip` enter; if any member skips (or is stuck), the others hang."""
        members = list(self.groups[group])
        entering = [r for r in members if r not in skip and r not in self.stuck and r not in self.dead]
        hang = len(entering) < len(members)
        last = max(self.t[r] for r in entering) if entering else 0
        for r in entering:
            kw = dict(op=op, in_shapes=(shape,), in_dtypes=(dtype,), out_shapes=(shape,), out_dtypes=(dtype,),
                      reduce_op=reduce_op, root=root)
            kw.update((override or {}).get(r, {}))
            start = self.t[r]
            end = None if hang else last + transfer + (r * 131) % 500
            self._add(r, Collective(start_ns=self._c(r), end_ns=None if end is None else self._c(r, end),
                                    step=self.step, group=group, seq=self.seq[(r, group)], in_bytes=4096,
                                    out_bytes=4096, mem_alloc=self.mem[r], mem_peak=self.mem[r],
                                    stack=self._stack(line), **kw))
            if hang:
                self.stuck.add(r)
            else:
                self.t[r] = end
        for r in members:
            if r not in skip:
                self.seq[(r, group)] += 1

    def send(self, src: int, dst: int, shape=(16,), *, recv_shape=None, skip_recv=False):
        t = max(self.t[src], self.t[dst])
        end = t + 10_000
        s = self.p2p_seq[(src, "send", dst)]
        self.p2p_seq[(src, "send", dst)] += 1
        self._add(src, PointToPoint(start_ns=self._c(src), end_ns=self._c(src, end), step=self.step, op="send",
                                    group=0, seq=s, peer=dst, shapes=(shape,), dtypes=("float32",), nbytes=64))
        self.t[src] = end
        if skip_recv:
            return
        s = self.p2p_seq[(dst, "recv", src)]
        self.p2p_seq[(dst, "recv", src)] += 1
        self._add(dst, PointToPoint(start_ns=self._c(dst), end_ns=self._c(dst, end), step=self.step, op="recv",
                                    group=0, seq=s, peer=src, shapes=(recv_shape or shape,), dtypes=("float32",),
                                    nbytes=64))
        self.t[dst] = end

    def end_step(self):
        for r in self.active():
            self._add(r, Memory(start_ns=self._c(r), end_ns=self._c(r), step=self.step, mem_alloc=self.mem[r],
                                mem_peak=self.mem[r] + (8 << 20), name="cpu-tracker"))
            self._add(r, Step(start_ns=self._c(r, self.step_start[r]), end_ns=self._c(r), step=self.step,
                              mem_peak=self.mem[r] + (8 << 20)))
        self.step += 1
        self.step_start = dict(self.t)

    def marker(self, r, name, value=None, text=None):
        self._add(r, Marker(start_ns=self._c(r), end_ns=self._c(r), step=self.step, name=name, value=value, text=text))

    def kill(self, r):
        """The process dies: nothing more is recorded and no end marker is written."""
        self.dead.add(r)

    def train(self, steps: int, *, slow: dict[int, int] | None = None, line=88):
        """A clean DDP-like loop: forward/backward compute, two all_reduces, a p2p, a step."""
        for _ in range(steps):
            self.compute(2_000_000)
            if slow:
                self.compute(slow, ranks=[r for r in slow if r in self.active()])
            self.collective(0, line=line)
            self.compute(500_000)
            self.collective(0, shape=(256, 4), line=line + 1)
            if self.world > 1 and {0, 1} <= set(self.active()):
                self.send(0, 1)
            self.end_step()

    def write(self, spool_dir: Path, *, info_extra=None, truncated=(), chunk_records=64) -> Path:
        spool_dir = Path(spool_dir)
        spool_dir.mkdir(parents=True, exist_ok=True)
        for r in range(self.world):
            if r not in self.dead:
                t = self._c(r)
                self.recs[r].append(Marker(start_ns=t, end_ns=t, step=self.step, name="recording_end",
                                           value=0, text="SIGTERM" if r in self.stuck else "exit"))
            # ranks on one host share a clock: a rank with its own clock has its own host
            host = HOST if self.offsets[r] == self.offsets[0] else f"n{r}-{HOST}"
            info = {"rank": r, "world_size": self.world, "backend": "gloo", "hostname": host,
                    "argv": [f"{HOME}/project/train.py", "--data", f"{HOME}/data/set", "--lr", "0.1"],
                    "cwd": f"{HOME}/project", "executable": f"{HOME}/venv/bin/python3",
                    "env": {"MASTER_ADDR": HOST, "MASTER_PORT": "29500", "RANK": str(r),
                            "TORCH_HOME": f"{HOME}/.cache/torch", "NCCL_SOCKET_IFNAME": SECRET},
                    "clock_offset": {"offset_ns": self.offsets[r], "error_ns": 1000, "reference_rank": 0},
                    "versions": {"torch": "2.13.0", "python": "3.12.1"}}
            info.update(info_extra or {})
            parts = [spool_header(r), encode_frame(layout.FRAME_RANK_INFO, r, 0, info=info)]
            recs = self.recs[r]
            for i in range(0, len(recs), chunk_records):
                parts.append(encode_frame(layout.FRAME_EVENTS, r, 1 + i // chunk_records, records=recs[i:i + chunk_records]))
            if r in truncated:
                parts.append(b"PRCK\0\0\1\0")  # a torn frame: the process died mid-write
            spool_path(spool_dir, r).write_bytes(b"".join(parts))
        return spool_dir

    def bundle(self, tmp_path: Path, name="run", **kw) -> Path:
        spools = self.write(tmp_path / f"{name}.prism.d", **kw)
        (spools / "run.json").write_text(
            '{"command": ["torchrun", "%s/project/train.py"], "cwd": "%s/project", "hostname": "%s", '
            '"options": {"spool_dir": "%s/runs/run.prism.d", "payload": "digest"}}' % (HOME, HOME, HOST, HOME))
        out = tmp_path / f"{name}.prism"
        pack(spools, out)
        return out
