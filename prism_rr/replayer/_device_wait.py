"""Waits that occupy the program's stream: how a virtual peer's call will take its time on a GPU.

On a GPU the host runs ahead of the device, so a virtual peer that completes its call by
blocking the host (what `_timing.sleep_until` does on CPU) shifts the device's timeline
in ways the recording never had (issue 27). A waiter makes the wait where NCCL's would
be: on the call's stream, in device time, with the host free to queue the work after it.

Times live in slots, one int64 of device time (ns) each, that only the device writes:

    stamp(slot)                 the moment the stream reaches this point (a step's start)
    occupy(slot, offset_ns,     the stream waits until the later of the moment it gets
           transfer_ns, into)   here and `slot + offset_ns` (the last peer's recorded
                                arrival, measured from a stamp the device made), then
                                `transfer_ns` more; the end goes into slot `into`
    occupy_aside(slot, offset_ns,
           transfer_ns, into)   the same wait on a stream of its own that starts where the
                                current one is, as NCCL's stream does; returns a Ticket
                                whose wait() makes the current stream (or the one given)
                                wait for it: an asynchronous call's work, waited for later
    read(slot), read_all()      a slot's value, every slot's, on the host (waits for the
                                device: for tests, benches and a replay's end, never inside
                                a replayed step)

Mechanisms, `waiter_for(device, mechanism)`:

    HostWaiter     the host's monotonic clock and `sleep_until` (CPU, where the program's
                   work is the host's): what the replayer does today, behind the same calls
    TritonWaiter   a one-thread Triton kernel that spins on %globaltimer (Triton ships with
                   CUDA builds of torch): absolute device times, so `occupy` waits only for
                   what is left when the stream arrives late
    SleepWaiter    `torch.cuda._sleep` with cycles calibrated once against CUDA events: no
                   device clock to read, so it waits `offset_ns + transfer_ns` from wherever
                   the stream is (exact only when the stream reaches the wait at the stamp);
                   the fallback where Triton is missing, and the comparison the bench makes

Issue 27 asks which mechanism is exact to a few microseconds: bench/device_wait.py measures
waits of 0.1, 1 and 10 ms with each. On an H200 (torch 2.11, Triton 3.6) Triton's were
exact to 0.1 us queued and ended 2.9 us after a late stream's arrival; cuda-sleep's missed
by up to 49 us at 10 ms and, being relative, waited the whole lateness again when late. Wired, opt-in (PRISM_RR_DEVICE_WAITS=auto|triton|cuda-sleep|host, live timing): from the
first step boundary, `mark_step` stamps a step slot; a call with virtual members queues
`occupy_aside(step slot, last virtual arrival - the step's model start, transfer)` (the
real rank's own arrival being the stream's) and its ReplayWork's wait() waits for the
ticket instead of sleeping the host. On an H200 that wiring is wrong so far: the DDP
trainer's recording scaled to dp 8 replayed at 545 ms a step with Triton waits against
10 ms with host waits (tests/gpu/test_gpu.py::test_virtual_peers_wait_on_the_stream); the
cause is not found, so the waits stay opt-in. The host syncs a replayed step has on CUDA
besides the wait: `_exchange` reads inputs on the host (real ranks sharing a call with
virtual ones); that moves to the device before the card's "no host synchronization inside
a replayed step" can hold.
`_check`'s digests are read once the device has passed the inputs
(intercept/device_reads.py, PRISM_RR_DEVICE_CHECKS), and recorded outputs are written
from pinned memory without blocking (_data.write).
"""

from __future__ import annotations

import statistics
from time import monotonic_ns

import torch

from prism_rr.replayer import _timing

# Deferred imports: Triton (seconds to import, and optional) and replayer._triton_wait, its
# kernels, until a Triton waiter is made or asked for; torch is here already with the session.

__all__ = ["ENV_VAR", "HostWaiter", "SleepWaiter", "Ticket", "TritonWaiter", "Waiter", "mechanisms", "waiter_for"]

ENV_VAR = "PRISM_RR_DEVICE_WAITS"  # a replay's virtual peers wait with this mechanism ("auto": the best here)

SLOTS = 64
# cuda-sleep aims this much long: its cycles per ns, calibrated at 2 ms, were 0.4-0.5% off
# at 10 ms on an H200 (waits 42-49 us short), and a wait must never end early
SLEEP_MARGIN = 0.01


class Waiter:
    """Device-time slots and the waits that read them (see the module's docstring)."""

    name = "?"
    absolute = True  # occupy() reads its slot; False: it waits offset + transfer from wherever the stream is

    def stamp(self, slot: int) -> None:
        raise NotImplementedError

    def occupy(self, slot: int, offset_ns: int, transfer_ns: int = 0, into: int | None = None) -> None:
        raise NotImplementedError

    def occupy_aside(self, slot: int, offset_ns: int, transfer_ns: int = 0, into: int | None = None) -> Ticket:
        raise NotImplementedError

    def read(self, slot: int) -> int:
        raise NotImplementedError

    def read_all(self) -> list[int]:
        """Every slot's value (one wait for the device: at the end, never inside a step)."""
        return [self.read(i) for i in range(self.slots)]

    waits = 0  # occupy_aside calls so far

    def _check(self, *slots) -> None:
        for s in slots:
            if s is not None and not 0 <= s < self.slots:
                raise IndexError(f"no slot {s}: this waiter has {self.slots}")


class Ticket:
    """A wait queued by occupy_aside."""

    def wait(self, stream=None) -> None:
        """The current stream (or `stream`) goes on only once the wait is over."""
        raise NotImplementedError

    def follow(self) -> None:
        """From another thread (a future's completion): the stream that was current when the
        wait was queued goes on only once it is over; on the host, nothing (the caller
        runs at the wait's end)."""


class _HostTicket(Ticket):
    def __init__(self, target_ns: int, sleep_until):
        self.target_ns, self._sleep_until = target_ns, sleep_until

    def wait(self, stream=None) -> None:
        self._sleep_until(self.target_ns)


class _CudaTicket(Ticket):
    def __init__(self, event, stream):
        self._event = event
        self.stream = stream  # the stream current when it was queued

    def wait(self, stream=None) -> None:
        (stream or torch.cuda.current_stream()).wait_event(self._event)

    def follow(self) -> None:
        self.stream.wait_event(self._event)


class HostWaiter(Waiter):
    """Slots of host monotonic time; occupy() blocks the calling thread. `clock` and
    `sleep_until` are the host's (tests give their own)."""

    name = "host"

    def __init__(self, slots: int = SLOTS, *, clock=monotonic_ns, sleep_until=None):
        if sleep_until is None:
            sleep_until = _timing.sleep_until
        self.slots = slots
        self._v = [0] * slots
        self._clock, self._sleep_until = clock, sleep_until

    def stamp(self, slot: int) -> None:
        self._check(slot)
        self._v[slot] = self._clock()

    def occupy(self, slot: int, offset_ns: int, transfer_ns: int = 0, into: int | None = None) -> None:
        self._check(slot, into)
        target = max(self._clock(), self._v[slot] + offset_ns) + transfer_ns
        self._sleep_until(target)
        if into is not None:
            self._v[into] = self._clock()

    def occupy_aside(self, slot: int, offset_ns: int, transfer_ns: int = 0, into: int | None = None) -> Ticket:
        """The host is the stream: it arrives now, and waits when the ticket is waited for
        (until the end, which `into` keeps)."""
        self._check(slot, into)
        self.waits += 1
        end = max(self._clock(), self._v[slot] + offset_ns) + transfer_ns
        if into is not None:
            self._v[into] = end
        return _HostTicket(end, self._sleep_until)

    def read(self, slot: int) -> int:
        self._check(slot)
        return self._v[slot]


class _StreamWaiter(Waiter):
    """A waiter of CUDA kernels: occupy_aside queues occupy() on a side stream of its own."""

    _side = None  # made on first use, on the current stream's device

    def occupy_aside(self, slot: int, offset_ns: int, transfer_ns: int = 0, into: int | None = None) -> Ticket:
        current = torch.cuda.current_stream()
        if self._side is None:
            self._side = torch.cuda.Stream(device=current.device)
        self._side.wait_stream(current)  # it starts where the program's stream is
        with torch.cuda.stream(self._side):
            self.occupy(slot, offset_ns, transfer_ns, into)
        done = torch.cuda.Event()
        done.record(self._side)
        self.waits += 1
        return _CudaTicket(done, current)


def _kernels():
    """The Triton kernels (stamp, occupy), compiled on first use: importing this module
    needs no Triton."""
    from prism_rr.replayer import _triton_wait

    return _triton_wait.stamp, _triton_wait.occupy


class TritonWaiter(_StreamWaiter):
    """Slots of %globaltimer ns in device memory; stamp and occupy are one-thread kernels
    on the current stream."""

    name = "triton"

    def __init__(self, device, slots: int = SLOTS):
        self.slots = slots
        self._stamp, self._occupy = _kernels()
        self._v = torch.zeros(slots, dtype=torch.int64, device=device)
        # compiled (or loaded from Triton's cache) now, not at a step's first wait: the
        # stamp and the variants of an i32 and an i64 offset (2^31 ns is 2.1 s from the
        # step's start), each wait ending at once (its slot's time less the offset is past)
        self.stamp(0)
        for offset in (-1, -(1 << 40)):
            self.occupy(0, offset)

    def stamp(self, slot: int) -> None:
        self._check(slot)
        self._stamp[(1,)](self._v, slot, num_warps=1)

    def occupy(self, slot: int, offset_ns: int, transfer_ns: int = 0, into: int | None = None) -> None:
        self._check(slot, into)
        self._occupy[(1,)](self._v, slot, int(offset_ns), int(transfer_ns), -1 if into is None else into,
                           num_warps=1)

    def read(self, slot: int) -> int:
        self._check(slot)
        return int(self._v[slot].item())

    def read_all(self) -> list[int]:
        return self._v.tolist()


class SleepWaiter(_StreamWaiter):
    """`torch.cuda._sleep` for `offset_ns + transfer_ns`, at cycles per ns calibrated once
    (the median of `rounds` sleeps timed by CUDA events). Relative: reads no slot; its stamps
    and ends are CUDA events, read back as ns from the first stamp."""

    name = "cuda-sleep"
    absolute = False

    def __init__(self, device, slots: int = SLOTS, *, calibrate_ms: float = 2.0, rounds: int = 5):
        self.slots = slots
        self._torch = torch
        self._device = device
        self._events: list = [None] * slots
        self.cycles_per_ns = self._calibrate(calibrate_ms, rounds)

    def _calibrate(self, ms: float, rounds: int) -> float:
        torch = self._torch
        with torch.cuda.device(self._device):
            probe = 1_000_000
            rates = []
            for _ in range(rounds + 1):  # the first warms up
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.cuda._sleep(probe)
                b.record()
                b.synchronize()
                rates.append(probe / (a.elapsed_time(b) * 1e6))
            rate = statistics.median(rates[1:])
            # once more at the length asked, so that a clock that boosts under load is met
            cycles = int(ms * 1e6 * rate)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            return cycles / (a.elapsed_time(b) * 1e6)

    def _mark(self, slot: int) -> None:
        e = self._torch.cuda.Event(enable_timing=True)
        e.record()
        self._events[slot] = e

    def stamp(self, slot: int) -> None:
        self._check(slot)
        self._mark(slot)

    def occupy(self, slot: int, offset_ns: int, transfer_ns: int = 0, into: int | None = None) -> None:
        self._check(slot, into)
        ns = max(0, int(offset_ns)) + max(0, int(transfer_ns))
        if ns:
            self._torch.cuda._sleep(max(1, int(ns * self.cycles_per_ns * (1 + SLEEP_MARGIN))))
        if into is not None:
            self._mark(into)

    def read(self, slot: int) -> int:
        self._check(slot)
        first = next((e for e in self._events if e is not None), None)
        e = self._events[slot]
        if e is None:
            return 0
        e.synchronize()
        return int(round(first.elapsed_time(e) * 1e6))


def mechanisms(device) -> list[str]:
    """The mechanisms `waiter_for` can make on `device` here, best first."""
    device = torch.device(device)
    if device.type != "cuda":
        return ["host"]
    if not torch.cuda.is_available():
        return []
    have = []
    try:
        import triton  # noqa: F401

        have.append("triton")
    except ImportError:
        pass
    if hasattr(torch.cuda, "_sleep"):
        have.append("cuda-sleep")
    return have


def waiter_for(device, mechanism: str | None = None, slots: int = SLOTS) -> Waiter:
    """A waiter for `device`'s program stream: the best mechanism here, or the one named."""
    device = torch.device(device)
    have = mechanisms(device)
    if mechanism is not None and mechanism not in have:
        raise ValueError(f"no {mechanism} mechanism on {device} here (have: {', '.join(have) or 'none'})")
    if not have:
        raise ValueError(f"no device wait mechanism on {device} here")
    if mechanism is not None:
        return _make(mechanism, device, slots)
    failed = []
    for name in have:  # the best that works: Triton present may still fail to compile (no C compiler)
        try:
            w = _make(name, device, slots)
            w.stamp(0)
            return w
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    raise RuntimeError("no device wait mechanism works here: " + "; ".join(failed))


def _make(name: str, device, slots: int) -> Waiter:
    if name == "host":
        return HostWaiter(slots)
    if name == "triton":
        return TritonWaiter(device, slots)
    return SleepWaiter(device, slots)
