"""Building a call's outputs from its members' inputs: real ones, recorded ones, or replicas.

`contrib[j]` is the list of input tensors of the member with group rank j, or None when
nothing is known of it; such a member is taken to be an identical replica of this rank
(its inputs are this rank's inputs), which is what data-parallel peers are. A SUM
all_reduce over n replicas is then n times this rank's value.

`build_grouped` takes the members in parts, (group ranks, inputs), for the thousands of
virtual ranks of one role that send the same data: a SUM counts a part's value once per
member, a gather repeats it; the work is per part, plus the size of the output.
"""

from __future__ import annotations

import math

import torch

from prism_rr.errors import FormatError
from prism_rr.format import ops
from prism_rr.text import quoted

__all__ = ["build_grouped", "build_outputs", "from_blob", "from_bytes", "reduce", "reduce_counted", "write"]


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    dt = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(dt, torch.dtype):  # a name from a bundle: only torch's dtypes
        raise FormatError(f"unknown dtype {quoted(dtype)} in the bundle")
    return dt


def from_bytes(data: bytes, dtype: str | torch.dtype, shape) -> torch.Tensor:
    dt = _dtype(dtype)
    if not data:
        return torch.empty(tuple(shape), dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=dt).reshape(tuple(shape))


def from_blob(bundle, ident: bytes, dtype: str | torch.dtype, shape) -> torch.Tensor:
    """A recorded payload as a tensor of the recorded dtype and shape."""
    dt = _dtype(dtype)
    return from_bytes(bundle.blob(ident, expected=math.prod(shape) * dt.itemsize), dt, shape)


def write(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy src's values into dst in place (shapes may differ; element counts do not).
    Host values into a CUDA tensor go through pinned memory (torch's caching host
    allocator, which keeps the block until the copy is done), copied without blocking: a
    copy from pageable memory would make the host wait for the device's stream."""
    with torch.no_grad():
        src = src.reshape(dst.shape)
        if dst.is_cuda and src.is_cpu and src.numel():
            dst.copy_(src.pin_memory(), non_blocking=True)
        else:
            dst.copy_(src)


def reduce(tensors: list[torch.Tensor], op: str | None) -> torch.Tensor:
    """Reduce in member order, as a ring would on identical hardware (values, not bits)."""
    name = (op or "SUM").upper()
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if name in ("SUM", "AVG", "PREMUL_SUM"):
            acc.add_(t)
        elif name == "PRODUCT":
            acc.mul_(t)
        elif name == "MAX":
            torch.maximum(acc, t, out=acc)
        elif name == "MIN":
            torch.minimum(acc, t, out=acc)
        elif name == "BAND":
            acc.bitwise_and_(t)
        elif name == "BOR":
            acc.bitwise_or_(t)
        elif name == "BXOR":
            acc.bitwise_xor_(t)
        else:
            raise ValueError(f"reduce op {op!r}")
    if name == "AVG":
        acc = acc / len(tensors) if acc.is_floating_point() else acc // len(tensors)
    return acc


def _rows(t: torch.Tensor, splits, j: int, n: int) -> torch.Tensor:
    """The rows of t that go to member j of n (even split when splits are empty)."""
    if not splits:
        return t.reshape(n, -1)[j] if t.numel() else t
    start = sum(splits[:j])
    return t[start : start + splits[j]]


def plausible(t: torch.Tensor, seed: int) -> None:
    """Fill a received tensor whose data was not recorded: unit normals for floating
    dtypes (what layer activations look like, and never the uninitialised memory of an
    empty() buffer, whose NaNs and denormals would change branches and slow every
    operator), zeros otherwise. Seeded, so a replay makes the same values each time."""
    if t.is_floating_point():
        g = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
        write(t, torch.randn(tuple(t.shape), generator=g).to(t.dtype))
    else:
        write(t, torch.zeros(tuple(t.shape), dtype=t.dtype))


def _form(op: str) -> str:
    """How `op` fills its outputs (ops.py); ValueError for an op with no rule here."""
    known = ops.lookup(op)
    if known is None or known.p2p:
        raise ValueError(f"no virtual-member rule for {op}")
    return known.form


def build_outputs(op: str, me: int, n: int, ins, outs, contrib, *, reduce_op=None, root=None,
                  in_splits=None, out_splits=None) -> None:
    """Fill `outs` in place for `op` at group rank `me` of `n` members."""
    form = _form(op)
    c = [x if x is not None else list(ins) for x in contrib]
    match form:
        case "reduce_all":
            for i, t in enumerate(outs):
                write(t, reduce([m[i] for m in c], reduce_op))
        case "gather_list" | "gather_list_by_rank":
            k = len(ins)
            for j in range(n):
                for i in range(k):
                    write(outs[_gathered(form, i, j, n, k)], c[j][i])
        case "gather_tensor":
            for i, t in enumerate(outs):
                write(t, torch.cat([m[i].reshape(-1) for m in c]))
        case "reduce_scatter_list":
            for i, t in enumerate(outs):
                write(t, reduce([m[i * n + me] for m in c], reduce_op))
        case "reduce_scatter_tensor":
            for i, t in enumerate(outs):
                write(t, reduce([m[i].reshape(n, -1)[me] for m in c], reduce_op))
        case "all_to_all":
            for j in range(n):
                write(outs[j], c[j][me])
        case "all_to_all_single":
            out = outs[0]
            row = math.prod(out.shape[1:]) if out.dim() else 1
            mine = in_splits[me] if in_splits is not None else []
            parts = []
            for j in range(n):
                need = out_splits[j] * row if out_splits else out.numel() // n
                if contrib[j] is not None:
                    splits = in_splits[j] if in_splits is not None else []
                    part = _rows(contrib[j][0], splits, me, n).reshape(-1)
                else:  # a replica sends this rank what this rank sends itself
                    part = _rows(ins[0], mine, me, n).reshape(-1)
                if part.numel() != need:
                    part = torch.zeros(need, dtype=out.dtype)
                parts.append(part)
            write(out, torch.cat(parts) if parts else out)
        case "copy_root":
            for i, t in enumerate(outs):
                write(t, c[root][i])
        case "reduce_root":
            if me == root:
                for i, t in enumerate(outs):
                    write(t, reduce([m[i] for m in c], reduce_op))
        case "gather_root":
            if me == root:
                for j in range(n):
                    write(outs[j], c[j][0])
        case "scatter_root":
            if contrib[root] is not None and len(contrib[root]) == n:
                write(outs[0], contrib[root][me])
        case "none":
            pass
        case _:
            raise ValueError(f"no virtual-member rule for {op} (form {form})")


def _gathered(form: str, i: int, j: int, n: int, k: int) -> int:
    """Where input i of member j goes among n members' k inputs each: all_gather lists its
    outputs input-major, all_gather_coalesced rank-major."""
    return i * n + j if form == "gather_list" else j * k + i


def reduce_counted(pairs: list, op: str | None, n: int) -> torch.Tensor:
    """Reduce (tensor, how many members sent it) pairs, as `reduce` would the full list."""
    name = (op or "SUM").upper()
    if name in ("SUM", "AVG", "PREMUL_SUM"):
        acc = None
        for t, c in pairs:
            x = t * c if c != 1 else t
            acc = x.clone() if acc is None else acc.add_(x)
        if name == "AVG":
            acc = acc / n if acc.is_floating_point() else acc // n
        return acc
    if name == "PRODUCT":
        acc = None
        for t, c in pairs:
            x = t.pow(c) if c != 1 else t
            acc = x.clone() if acc is None else acc.mul_(x)
        return acc
    if name == "BXOR":  # an even number of equal values cancels
        odd = [t for t, c in pairs if c % 2]
        return reduce(odd, op) if odd else torch.zeros_like(pairs[0][0])
    return reduce([t for t, _ in pairs], op)  # MAX, MIN, BAND, BOR: repeats change nothing


def _rows_of(t: torch.Tensor, n: int):
    """t as n rows, a view when it can be; (rows, whether they must be written back)."""
    if t.is_contiguous():
        return t.view(n, -1), False
    return torch.empty((n, t.numel() // n), dtype=t.dtype), True


def build_grouped(op: str, me: int, n: int, ins, outs, parts, *, reduce_op=None, root=None,
                  in_splits=None, out_splits=None) -> None:
    """Fill `outs` like `build_outputs`, from parts [(group ranks, inputs or None, index)]
    that cover every member once (None: each of those members is a replica of this rank;
    index: the group ranks as a long tensor, or None)."""
    form = _form(op)
    parts = [p if len(p) == 3 else (*p, None) for p in parts]
    ps = [(pos, list(ins) if t is None else t) for pos, t, _ in parts]
    with torch.no_grad():
        match form:
            case "reduce_all":
                for i, t in enumerate(outs):
                    write(t, reduce_counted([(m[i], len(pos)) for pos, m in ps], reduce_op, n))
            case "gather_tensor":
                for i, t in enumerate(outs):
                    rows, copy = _rows_of(t, n)
                    for (pos, m), (_, _, index) in zip(ps, parts):
                        src = m[i].reshape(1, -1)
                        if len(pos) == 1:
                            rows[pos[0]].copy_(src[0])
                        else:
                            if index is None:
                                index = torch.tensor(pos, dtype=torch.long)
                            rows[index] = src.expand(len(pos), -1)
                    if copy:
                        write(t, rows)
            case "gather_list" | "gather_list_by_rank":
                k = len(ins)
                for pos, m in ps:
                    for j in pos:
                        for i in range(k):
                            write(outs[_gathered(form, i, j, n, k)], m[i])
            case "reduce_scatter_list":
                for i, t in enumerate(outs):
                    write(t, reduce_counted([(m[i * n + me], len(pos)) for pos, m in ps], reduce_op, n))
            case "reduce_scatter_tensor":
                for i, t in enumerate(outs):
                    write(t, reduce_counted([(m[i].reshape(n, -1)[me], len(pos)) for pos, m in ps], reduce_op, n))
            case "copy_root":
                src = next(m for pos, m in ps if root in pos)
                for i, t in enumerate(outs):
                    write(t, src[i])
            case "none":
                pass
            case _:  # the rest (all_to_all, gather, scatter, reduce): member by member
                contrib = [None] * n
                for pos, t, _ in parts:
                    for j in pos:
                        contrib[j] = t
                build_outputs(op, me, n, ins, outs, contrib, reduce_op=reduce_op, root=root,
                              in_splits=in_splits, out_splits=out_splits)
