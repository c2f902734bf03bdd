"""A communication cost model fitted to a recording's transfer times.

Per collective family: t = alpha + bytes * f(n) / beta, where n is the group size and
f the algorithm's scaling (ring all_reduce 2(n-1)/n; all_gather, reduce_scatter,
all_to_all, gather and scatter (n-1)/n; tree broadcast and reduce ceil(log2 n); p2p 1;
barrier 0). A call's transfer time is the smallest end - start among the members that
recorded it: the last to arrive waits only for the transfer (no clock alignment needed).

The fit is least squares per family. Where a family's samples cannot separate latency
from bandwidth (one size of message, a negative slope, or a slope that the scatter of the
times does not support: t-statistic under 2) it shares the bandwidth fitted over all
families together (a within-family regression) and keeps its own latency; where that
pooled slope is not supported either, bytes cost nothing (`bandwidth_identified` false:
the recording cannot tell, and `with_bandwidth` sets one, as `scale --bandwidth` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prism_rr.format.ops import algorithm_factor, family, latency_steps, lookup, receives, shard_side
from prism_rr.format.records import Collective, PointToPoint

# family, algorithm_factor and latency_steps live in the op table; named here for the
# cost model's callers.
__all__ = ["CostModel", "Fit", "Sample", "algorithm_factor", "family", "fit", "latency_steps", "message_bytes", "samples"]


def _moves_bytes(fam: str) -> bool:
    """Whether a family's calls carry bytes at all (barriers do not: no bandwidth to fit)."""
    return algorithm_factor(fam, 2) > 0


def message_bytes(rec, n: int) -> int:
    """The bytes the cost model counts for one call of a group of `n`: the whole buffer
    (gathered output, scattered input, reduced tensor)."""
    if isinstance(rec, PointToPoint):
        return rec.nbytes
    op = lookup(rec.op)
    side = shard_side(op.form) if op is not None else None
    if side == "in":
        return max(rec.out_bytes, rec.in_bytes * n)
    if side == "out":
        return max(rec.in_bytes, rec.out_bytes * n)
    if op is not None and not _moves_bytes(op.family):
        return 0
    return max(rec.in_bytes, rec.out_bytes)


@dataclass(frozen=True, slots=True)
class Sample:
    """One matched call: its family, group size, counted bytes and transfer time."""

    fam: str
    n: int
    nbytes: int
    transfer_ns: int
    key: tuple  # (group, seq) or (group, src, dst, seq)

    @property
    def x(self) -> float:
        return self.nbytes * algorithm_factor(self.fam, self.n)


def samples(bundle, ranks=None) -> list[Sample]:
    """Every call completed by at least one recorded member, with its transfer time."""
    groups = {g["id"]: len(g["ranks"]) for g in bundle.groups}
    best: dict[tuple, list] = {}  # key -> [fam, n, bytes, transfer]
    for rank in bundle.recorded_ranks if ranks is None else ranks:
        for rec in bundle.events(rank):
            cls = type(rec)
            if cls is Collective:
                key = (rec.group, rec.seq)
                n = groups.get(rec.group, 1)
            elif cls is PointToPoint:
                if rec.peer < 0:
                    continue
                src, dst = (rec.peer, rank) if receives(rec.op) else (rank, rec.peer)
                key = (rec.group, src, dst, rec.seq)
                n = 2
            else:
                continue
            if rec.end_ns is None:
                continue
            d = max(0, rec.end_ns - rec.start_ns)
            cur = best.get(key)
            if cur is None:
                best[key] = [family(rec.op), n, message_bytes(rec, n), d]
            elif d < cur[3]:
                cur[3] = d
    return [Sample(f, n, b, t, k) for k, (f, n, b, t) in best.items()]


@dataclass(slots=True)
class Fit:
    """One family's fitted latency and inverse bandwidth, and how well they fit."""

    fam: str
    alpha_ns: float
    ns_per_byte: float  # 1 / beta
    samples: int
    rmse_ns: float = 0.0
    mape_pct: float = 0.0
    r2: float | None = None
    pooled: bool = False  # bandwidth shared with the other families
    latency: str = "constant"  # "constant": alpha once; "steps": alpha per algorithm step
    identified: bool = True  # the recording supports this bandwidth (else: pooled or given or none)

    @property
    def beta_bytes_per_s(self) -> float | None:
        return 1e9 / self.ns_per_byte if self.ns_per_byte > 0 else None

    def predict_ns(self, nbytes: int, n: int) -> float:
        lat = latency_steps(self.fam, n) if self.latency == "steps" else 1.0
        return self.alpha_ns * lat + self.ns_per_byte * nbytes * algorithm_factor(self.fam, n)

    def to_dict(self) -> dict:
        return {"alpha_ns": round(self.alpha_ns, 1), "ns_per_byte": self.ns_per_byte,
                "beta_bytes_per_s": self.beta_bytes_per_s, "samples": self.samples,
                "rmse_ns": round(self.rmse_ns, 1), "mape_pct": round(self.mape_pct, 2),
                "r2": None if self.r2 is None else round(self.r2, 4), "pooled_bandwidth": self.pooled,
                "bandwidth_identified": self.identified}


@dataclass(slots=True)
class CostModel:
    """Fits per family; predicts a call's transfer time from its bytes and group size."""

    fits: dict[str, Fit] = field(default_factory=dict)
    pooled_ns_per_byte: float = 0.0
    rmse_ns: float = 0.0
    mape_pct: float = 0.0
    samples: int = 0
    latency: str = "constant"
    pooled_identified: bool = True
    given_bytes_per_s: float | None = None  # a bandwidth set by hand (with_bandwidth)

    def with_bandwidth(self, bytes_per_s: float) -> "CostModel":
        """The same latencies with every family's bandwidth set to `bytes_per_s` (the
        target cluster's, which a recording on another machine cannot tell)."""
        if not bytes_per_s > 0:
            raise ValueError(f"bandwidth must be positive, not {bytes_per_s}")
        nspb = 1e9 / bytes_per_s
        fits = {k: Fit(f.fam, f.alpha_ns, nspb if _moves_bytes(k) else 0.0, f.samples, f.rmse_ns, f.mape_pct,
                       f.r2, False, f.latency, True) for k, f in self.fits.items()}
        return CostModel(fits, nspb, self.rmse_ns, self.mape_pct, self.samples, self.latency, True, bytes_per_s)

    @property
    def unidentified(self) -> list[str]:
        """Families whose bandwidth the recording could not tell."""
        return sorted(k for k, f in self.fits.items() if not f.identified and _moves_bytes(k))

    def predict_ns(self, op_or_fam: str, nbytes: int, n: int) -> float | None:
        f = self.fits.get(family(op_or_fam))
        return None if f is None else f.predict_ns(nbytes, n)

    def delta_ns(self, op: str, nbytes_old: int, n_old: int, nbytes_new: int, n_new: int) -> int:
        """How much longer (or shorter) a call of the new size takes than the recorded one."""
        f = self.fits.get(family(op))
        if f is None:
            # A family never recorded: the pooled bandwidth with no latency change.
            fam = family(op)
            return round(self.pooled_ns_per_byte * (nbytes_new * algorithm_factor(fam, n_new)
                                                    - nbytes_old * algorithm_factor(fam, n_old)))
        return round(f.predict_ns(nbytes_new, n_new) - f.predict_ns(nbytes_old, n_old))

    def to_dict(self) -> dict:
        return {
            "form": "t = alpha + bytes * f(n) / beta" if self.latency == "constant"
            else "t = alpha * steps(n) + bytes * f(n) / beta",
            "latency": self.latency,
            "factors": {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
                        "all_to_all": "(n-1)/n", "gather_scatter": "(n-1)/n",
                        "broadcast": "ceil(log2 n)", "p2p": "1", "barrier": "0"},
            "params": {k: v.to_dict() for k, v in sorted(self.fits.items())},
            "pooled_ns_per_byte": self.pooled_ns_per_byte,
            "pooled_bandwidth_identified": self.pooled_identified,
            "given_bytes_per_s": self.given_bytes_per_s,
            "bandwidth_unidentified": self.unidentified,
            "fit_error": {"samples": self.samples, "rmse_ns": round(self.rmse_ns, 1),
                          "mape_pct": round(self.mape_pct, 2)},
        }


def _line(xs, ys) -> tuple[float, float] | None:
    """Least-squares (intercept, slope), or None when x does not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-9 * max(1.0, mx * mx) * n:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


_T_MIN = 2.0  # a slope this many standard errors from zero is one the data support


def _supported(b: float, sxx: float, sse: float, dof: int) -> bool:
    """Is slope b (over x with spread sxx, residual sum of squares sse) supported?"""
    if b <= 0 or dof <= 0 or sxx <= 0:
        return False
    se = (sse / dof / sxx) ** 0.5
    return se == 0 or b / se >= _T_MIN


def fit(data: list[Sample], *, latency: str = "constant") -> CostModel:
    """Fit a CostModel to samples (see the module's doc for the method).

    `latency="steps"` makes alpha a per-step latency (alpha * steps(n)), the textbook
    form; fitted on the recording's time divided by its steps, so with one group size
    per family it predicts the same recorded calls and extrapolates by step count."""
    if latency not in ("constant", "steps"):
        raise ValueError(f"latency must be constant or steps, not {latency!r}")
    if latency == "steps":
        # t / L = alpha + b * x / L: the same least squares on per-step quantities.
        scaled = [Sample(s.fam, s.n, s.nbytes, s.transfer_ns, s.key) for s in data]
        steps = {s.key: latency_steps(s.fam, s.n) for s in data}
        model = _fit([(s, s.x / steps[s.key], s.transfer_ns / steps[s.key]) for s in scaled], latency)
        return model
    return _fit([(s, s.x, float(s.transfer_ns)) for s in data], latency)


def _fit(rows, latency: str) -> CostModel:
    """The model of `rows` (sample, x, y): one line per family where the family's own
    samples support one, else the pooled slope; with each fit's errors and the model's."""
    by: dict[str, list] = {}
    for row in rows:
        by.setdefault(row[0].fam, []).append(row)
    pooled, pooled_ok = _pooled_slope(by)
    model = CostModel(pooled_ns_per_byte=pooled, latency=latency, pooled_identified=pooled_ok)
    sq = ape = 0.0
    count = 0
    for fam, rs in sorted(by.items()):
        ss = [r[0] for r in rs]
        f = _family_fit(fam, rs, pooled, pooled_ok, latency)
        errs = [f.predict_ns(s.nbytes, s.n) - s.transfer_ns for s in ss]
        ys = [float(s.transfer_ns) for s in ss]
        f.rmse_ns = (sum(e * e for e in errs) / len(errs)) ** 0.5
        f.mape_pct = 100.0 * sum(abs(e) / max(1, s.transfer_ns) for e, s in zip(errs, ss)) / len(ss)
        my = sum(ys) / len(ys)
        tot = sum((y - my) ** 2 for y in ys)
        f.r2 = 1.0 - sum(e * e for e in errs) / tot if tot > 0 else None
        model.fits[fam] = f
        sq += sum(e * e for e in errs)
        ape += f.mape_pct * len(ss) / 100.0
        count += len(ss)
    model.samples = count
    if count:
        model.rmse_ns = (sq / count) ** 0.5
        model.mape_pct = 100.0 * ape / count
    return model


def _pooled_slope(by: dict[str, list]) -> tuple[float, bool]:
    """(slope, whether the samples support it): a regression within each family (each
    centred on its means), one slope for all; 0.0 where the recording cannot tell what
    bytes cost."""
    centred = []  # (x - mean x, y - mean y) of every sample, family by family
    for rs in by.values():
        mx = sum(r[1] for r in rs) / len(rs)
        my = sum(r[2] for r in rs) / len(rs)
        centred += [(r[1] - mx, r[2] - my) for r in rs]
    num = sum(dx * dy for dx, dy in centred)
    den = sum(dx * dx for dx, _ in centred)
    pooled = max(0.0, num / den) if den > 0 else 0.0
    sse = sum((dy - pooled * dx) ** 2 for dx, dy in centred)
    dof = len(centred) - len(by)  # one mean per family
    pooled_ok = _supported(pooled, den, sse, dof - 1)
    return (pooled if pooled_ok else 0.0), pooled_ok


def _family_fit(fam: str, rs: list, pooled: float, pooled_ok: bool, latency: str) -> Fit:
    """One family's line: its own where its samples support one with a latency of 0 or
    more (through the origin where they support one below 0), else its mean time with
    the pooled slope."""
    xs = [r[1] for r in rs]
    ys = [r[2] for r in rs]
    line = _line(xs, ys) if len(rs) >= 3 and _moves_bytes(fam) else None
    supported = False
    if line is not None:
        mx = sum(xs) / len(xs)
        sxx = sum((x - mx) ** 2 for x in xs)
        sse = sum((y - line[0] - line[1] * x) ** 2 for x, y in zip(xs, ys))
        supported = _supported(line[1], sxx, sse, len(xs) - 2)
    identified = supported or not _moves_bytes(fam)
    if line is not None and supported and line[0] >= 0:
        a, b, shared = line[0], line[1], False
    else:
        identified = identified or (pooled_ok and _moves_bytes(fam))
        b = pooled if _moves_bytes(fam) else 0.0
        a = max(0.0, sum(ys) / len(ys) - b * sum(xs) / len(xs))
        shared = True
        if line is not None and supported and line[0] < 0:  # through the origin
            b = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
            a, shared = 0.0, False
    return Fit(fam, a, b, len(rs), pooled=shared, latency=latency, identified=identified)
