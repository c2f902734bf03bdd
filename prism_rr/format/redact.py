"""Redact a bundle for a public bug report: no payloads, no host names, no paths, no secrets.

Every rank's chunks are decoded, cleaned and written again as fresh spools, which `pack`
turns into the new bundle; shapes, dtypes, timings, groups and digests stay, so the
redacted bundle still diagnoses and still drives a replay without payloads.

What goes: payload blobs (and the blob ids in records); host names and IP addresses
(replaced by stable placeholders such as `<host0>`, `<ip0>`); directories of paths
(`<path0>/train.py`; a path that names no source file becomes `<path1>`); every rank-info
key outside an allow-list; environment variables outside an allow-list, and values that
are neither numbers nor well-known words; argv values other than numbers and flags;
stack frames beyond the file's base name and line (or all frames, with `stacks=False`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from prism_rr.format import layout
from prism_rr.format.facts import crash_reason
from prism_rr.format.reader import open_bundle
from prism_rr.format.records import Collective, GroupInfo, Marker, PointToPoint
from prism_rr.format.rewrite import Rewrite, new_output

__all__ = ["redact"]

# Rank-info keys kept as they are (their values are numbers, versions or options).
_INFO_KEEP = frozenset({
    "rank", "world_size", "local_rank", "backend", "device", "device_name", "versions", "payload",
    "steps", "ranks", "ops", "memory", "clock", "clock_offset", "mesh", "synthetic", "attempt", "incarnation", "cpu",
    "device_time",
})
_RUN_KEEP = frozenset({"prism_rr_version", "started_wall_ns", "ended_wall_ns", "exit_code", "timed_out", "interrupted",
                       "options"})
_ENV_NAMES = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
})
_ENV_PREFIXES = ("NCCL_", "TORCH_", "GLOO_", "PYTORCH_", "CUDA_")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
_HOST_ENV = frozenset({"MASTER_ADDR"})
# Values of allowed variables kept as they are: numbers, device lists, and these words.
_PLAIN_VALUE = re.compile(r"^[0-9][0-9.,:x+-]*$|^$")
_WORDS = frozenset(w.lower() for w in (
    "0", "1", "true", "false", "yes", "no", "on", "off", "info", "warn", "warning", "debug", "trace",
    "error", "version", "detail", "off", "init", "coll", "p2p", "net", "all", "graph", "env", "none",
))
_SOURCE_EXT = frozenset({
    ".py", ".pyx", ".pyi", ".ipynb", ".so", ".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp",
    ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini", ".txt", ".sh",
})
_PATH = re.compile(r"(?:^|(?<=[\s=\"'(\[,:@]))(?:~|[A-Za-z]:)?[/\\][^\s\"'()\[\],;:<>|]*")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
# Launchers and interpreters kept in a command line.
_ARGV_WORDS = frozenset({"torchrun", "python", "python3", "-m", "torch.distributed.run", "srun", "mpirun"})
_FLAG = re.compile(r"^--?[A-Za-z][\w.-]*$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_FRAME = re.compile(r"^(?P<file>.*?):(?P<line>\d+)")


class _Scrubber:
    """Stable placeholders for host names, addresses and paths, and the text cleaner."""

    def __init__(self):
        self.hosts: dict[str, str] = {}
        self.ips: dict[str, str] = {}
        self.dirs: dict[str, str] = {}
        self._host_re: re.Pattern | None = None

    def add_host(self, name: Any) -> None:
        if type(name) is not str or not name or name.startswith("<"):
            return
        if name not in self.hosts:
            self.hosts[name] = f"<host{len(self.hosts)}>"
            short = name.split(".")[0]
            if short != name and len(short) >= 3 and short not in self.hosts:
                self.hosts[short] = self.hosts[name]
            self._host_re = None

    def host(self, name: str) -> str:
        if _IPV4.fullmatch(name):
            return self.ip(name)
        self.add_host(name)
        return self.hosts.get(name, name)

    def ip(self, addr: str) -> str:
        if addr not in self.ips:
            self.ips[addr] = f"<ip{len(self.ips)}>"
        return self.ips[addr]

    def path(self, p: str) -> str:
        p = p.rstrip(".:")
        head, base = os.path.split(p.replace("\\", "/"))
        ext = os.path.splitext(base)[1].lower()
        if ext in _SOURCE_EXT and head:
            if head not in self.dirs:
                self.dirs[head] = f"<path{len(self.dirs)}>"
            return f"{self.dirs[head]}/{base}"
        if p not in self.dirs:
            self.dirs[p] = f"<path{len(self.dirs)}>"
        return self.dirs[p]

    def text(self, s: str) -> str:
        """A free text with paths, known hosts and IP addresses replaced."""
        if not s:
            return s
        if self.hosts:
            if self._host_re is None:
                names = sorted(self.hosts, key=len, reverse=True)
                self._host_re = re.compile("|".join(re.escape(n) for n in names))
            s = self._host_re.sub(lambda m: self.hosts[m.group(0)], s)
        s = _IPV4.sub(lambda m: self.ip(m.group(0)), s)
        s = _PATH.sub(lambda m: self.path(m.group(0)) if len(m.group(0)) > 1 else m.group(0), s)
        return s

    def value(self, v: Any) -> Any:
        """Any msgpack value with every string cleaned."""
        if type(v) is str:
            return self.text(v)
        if type(v) in (list, tuple):
            return [self.value(x) for x in v]
        if type(v) is dict:
            return {k if type(k) is not str else self.text(k): self.value(x) for k, x in v.items()}
        if type(v) in (bytes, bytearray):
            return None
        return v

    def arg(self, a: Any) -> str:
        a = str(a)
        if _FLAG.match(a) or _NUMBER.match(a) or a in _ARGV_WORDS:
            return a
        if "=" in a and _FLAG.match(a.split("=", 1)[0]):
            name, value = a.split("=", 1)
            return f"{name}={self.arg(value)}"
        if _PATH.fullmatch(a) or "/" in a or "\\" in a:
            return self.path(a)
        return "<arg>"

    def argv(self, argv: Any) -> list[str]:
        if type(argv) not in (list, tuple):
            return []
        return [self.arg(a) for a in argv]

    def env(self, env: Any) -> dict[str, str]:
        out = {}
        if type(env) is not dict:
            return out
        for name, value in env.items():
            if type(name) is not str or not (name in _ENV_NAMES or name.startswith(_ENV_PREFIXES)):
                continue
            if any(w in name.upper() for w in _SECRET_WORDS):
                continue
            value = str(value)
            if name in _HOST_ENV:
                out[name] = self.host(value)
            elif _PLAIN_VALUE.match(value) or value.lower() in _WORDS:
                out[name] = value
            else:
                out[name] = "<redacted>"
        return out


def _frame(frame: str) -> str:
    m = _FRAME.match(frame)
    if m is None:
        return "<frame>"
    return f"{os.path.basename(m.group('file').replace(chr(92), '/'))}:{m.group('line')}"


def _record(rec, scrub: _Scrubber, stacks: bool, counts: dict):
    cls = type(rec)
    changes: dict[str, Any] = {}
    if cls is Collective or cls is PointToPoint:
        if rec.stack is not None:
            changes["stack"] = tuple(_frame(f) for f in rec.stack) if stacks else None
        for name in ("blob_in", "blob_out") if cls is Collective else ("blob",):
            if getattr(rec, name) is not None:
                counts["blob_refs"] += len(getattr(rec, name))
                changes[name] = None
    elif cls is Marker:
        if rec.text:
            changes["text"] = scrub.text(rec.text)
    elif cls is GroupInfo:
        changes["name"] = scrub.text(rec.name)
        changes["text"] = scrub.text(rec.text)
    elif getattr(rec, "name", None):
        changes["name"] = scrub.text(rec.name)
    return dataclasses.replace(rec, **changes) if changes else rec


def _info(info: dict, scrub: _Scrubber, dropped: set) -> dict:
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key in _INFO_KEEP:
            out[key] = scrub.value(value)
        elif key == "hostname":
            out[key] = scrub.host(str(value))
        elif key in ("argv", "orig_argv"):
            out[key] = scrub.argv(value)
        elif key in ("cwd", "executable") and type(value) is str:
            out[key] = scrub.path(value)
        elif key == "env":
            out[key] = scrub.env(value)
        elif key == "exit" and type(value) is dict:
            # How the rank ended: its code and signal; of the words, what kind of end it was
            # (an exception's type, not its message, which may quote anything).
            end = {k: value[k] for k in ("code", "signal") if type(value.get(k)) in (int, str)}
            if type(value.get("how")) is str:
                end["how"] = scrub.text(value["how"].split(":", 1)[0][:200])
            out[key] = end
        elif key == "crash" and crash_reason(value) is not None:
            # The fatal error's name only (faulthandler's first line), not its stacks.
            out[key] = {"text": f"Fatal Python error: {crash_reason(value)}"}
            dropped.add("crash.stacks")
        else:
            dropped.add(str(key))
    return out


def redact(in_path: str | os.PathLike, out_path: str | os.PathLike, *, stacks: bool = True) -> dict:
    """Write a redacted copy of the bundle `in_path` to `out_path`; returns the `redacted`
    note stored in its manifest (what was removed, as counts and policies)."""
    in_path, out_path = new_output(in_path, out_path, "redaction")
    scrub = _Scrubber()
    counts = {"blob_refs": 0}
    dropped_keys: set[str] = set()
    with open_bundle(in_path) as bundle:
        manifest = bundle.manifest
        run = manifest.get("run", {})
        # Every attempt of a restarted job: each is read from its own view of the file.
        views = [bundle] + [type(bundle)(bundle.path, e["attempt"]) for e in bundle.attempts
                            if e["attempt"] != bundle.attempt]
        try:
            infos = {(v.attempt, r): v.raw_rank_info(r) for v in views for r in v.recorded_ranks}
            # Host names first, so that free text anywhere can be cleaned of them.
            _learn_hosts(scrub, run, infos.values())
            truncated = sorted({r for v in views for r in v.recorded_ranks
                                if v.summaries["ranks"].get(r, {}).get("truncated")})
            with Rewrite(out_path, prefix=".redact-") as rewrite:
                for view in views:
                    _write_view(rewrite, view, len(views) > 1, infos, scrub, stacks, counts, dropped_keys)
                new_run = _run(run, scrub, dropped_keys)
                blobs = layout.SEC_BLOB_INDEX in bundle.sections and bundle.sections[layout.SEC_BLOB_INDEX].length > 0
                note = _note(scrub, blobs, counts, stacks, dropped_keys, truncated)
                features = set(manifest.get("features_optional", ())) - {"blobs"}
                features |= {"summaries", "redacted"}
                extra = {"redacted": note, "features_optional": sorted(features)}
                flight = _flight(manifest.get("flight"))
                if flight is not None:  # what fired, where and when: numbers; no host, no text
                    extra["flight"] = flight
                rewrite.pack(new_run, manifest_extra=extra)
        finally:
            for view in views[1:]:
                view.close()
    return note


def _learn_hosts(scrub: _Scrubber, run: dict, infos) -> None:
    """Teach `scrub` the run's and every rank's host names, and each MASTER_ADDR."""
    scrub.add_host(run.get("hostname"))
    for info in infos:
        scrub.add_host(info.get("hostname"))
        env = info.get("env")
        if type(env) is dict and type(env.get("MASTER_ADDR")) is str:
            scrub.host(env["MASTER_ADDR"])


def _write_view(rewrite: Rewrite, view, several: bool, infos: dict, scrub: _Scrubber, stacks: bool,
                counts: dict, dropped_keys: set[str]) -> None:
    """Write every rank of one attempt's view, its rank info and records scrubbed."""
    summaries = view.summaries["ranks"]
    for rank in view.recorded_ranks:
        info = _info(infos[view.attempt, rank], scrub, dropped_keys)
        info.setdefault("world_size", view.world_size)
        info.setdefault("rank", rank)
        if several:
            info["attempt"] = view.attempt
        chunks = ([_record(r, scrub, stacks, counts) for r in view.read_chunk(ref)]
                  for ref in view.chunks(rank))
        rewrite.write_rank(rank, info, chunks, torn=bool(summaries.get(rank, {}).get("truncated")),
                           attempt=view.attempt if several else 0)


def _run(run: dict, scrub: _Scrubber, dropped_keys: set[str]) -> dict:
    """The manifest's `run`, its allowed keys scrubbed; the others named in `dropped_keys`."""
    new_run = {k: scrub.value(v) for k, v in run.items() if k in _RUN_KEEP}
    if "command" in run:
        new_run["command"] = scrub.argv(run["command"])
    if "cwd" in run and type(run["cwd"]) is str:
        new_run["cwd"] = scrub.path(run["cwd"])
    if "hostname" in run:
        new_run["hostname"] = scrub.host(str(run["hostname"]))
    dropped_keys |= {f"run.{k}" for k in run if k not in _RUN_KEEP | {"command", "cwd", "hostname"}}
    return new_run


def _note(scrub: _Scrubber, blobs: bool, counts: dict, stacks: bool, dropped_keys: set[str],
          truncated: list[int]) -> dict:
    """The manifest's `redacted`: what was removed, as counts and policies."""
    return {
        "payload_blobs": "removed" if blobs or counts["blob_refs"] else "none recorded",
        "blob_refs_removed": counts["blob_refs"],
        "stacks": "base name and line" if stacks else "removed",
        "hosts": len(set(scrub.hosts.values())),
        "ip_addresses": len(scrub.ips),
        "paths": len(scrub.dirs),
        "rank_info": "allow-list",
        "environment": "allow-list; other values replaced by <redacted>",
        "argv": "flags and numbers kept; paths as placeholders; other values <arg>",
        "dropped_keys": sorted(dropped_keys),
        "truncated_ranks": truncated,
    }


def _flight(v) -> dict | None:
    """A flight dump's manifest entry with only its numbers and the trigger's name."""
    if type(v) is not dict:
        return None
    out = {k: v[k] for k in ("rank", "step", "first_step", "steps_kept", "dump") if type(v.get(k)) is int}
    if v.get("trigger") in ("hang", "exception", "SIGUSR1", "file", "slow_step", "exit", "crash", "unpacked"):
        out["trigger"] = v["trigger"]
    for k in ("ranks_dumped", "ranks_from_ring", "ranks_missing"):
        if isinstance(v.get(k), (list, tuple)):
            out[k] = [r for r in v[k] if type(r) is int]
    return out
