"""The Triton kernels of _device_wait.TritonWaiter, at module level as Triton's JIT wants
them (it resolves the names a kernel calls in its module's globals). Imported only when
a TritonWaiter is made: importing Triton is not free, and CPU builds of torch lack it."""

import triton
import triton.language as tl

try:  # Triton's own, where this version has it
    from triton.language.extra.cuda import globaltimer as _globaltimer
except ImportError:
    _globaltimer = None

if _globaltimer is not None:
    @triton.jit
    def _now():
        return _globaltimer()
else:
    @triton.jit
    def _now():
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)


# No integer argument is specialised on its value (Triton compiles a variant for a 1 and
# for multiples of 16): a wait's offset changes every call, and each new variant would
# compile in the middle of a replayed step. A value's width still picks one (i32, i64).
@triton.jit(do_not_specialize=["slot"])
def stamp(slots, slot):
    """slots[slot] = the device's clock (ns) as the stream reaches this kernel."""
    tl.store(slots + slot, _now())


@triton.jit(do_not_specialize=["slot", "offset", "transfer", "into"])
def occupy(slots, slot, offset, transfer, into):
    """Spin until the later of now and slots[slot] + offset, then `transfer` ns more;
    slots[into] = the end, where into >= 0."""
    base = tl.load(slots + slot, volatile=True)
    now = _now()
    target = tl.maximum(now, base + offset) + transfer
    while now < target:
        now = _now()
    if into >= 0:
        tl.store(slots + into, now)
