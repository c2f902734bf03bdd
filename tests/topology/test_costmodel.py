import random

import pytest

from prism_rr.topology.costmodel import Sample, algorithm_factor, fit


@pytest.mark.timeout(10)
def test_fit_recovers_latency_and_bandwidth():
    rng = random.Random(1)
    data = []
    for i in range(200):
        n = rng.choice((2, 4, 8))
        nbytes = rng.randrange(1 << 10, 1 << 24)
        t = 20_000 + 0.1 * nbytes * algorithm_factor("all_reduce", n)
        data.append(Sample("all_reduce", n, nbytes, round(t * rng.uniform(0.98, 1.02)), (0, i)))
    model = fit(data)
    f = model.fits["all_reduce"]
    assert abs(f.ns_per_byte - 0.1) / 0.1 < 0.05
    assert f.mape_pct < 5 and not f.pooled
    d = model.to_dict()
    assert set(d) >= {"form", "params", "fit_error"} and d["params"]["all_reduce"]["samples"] == 200


@pytest.mark.timeout(10)
def test_fit_pools_bandwidth_for_a_family_of_one_size():
    data = [Sample("all_gather", 2, 1 << 20, 50_000 + j, (1, j)) for j in range(5)]
    data += [Sample("all_reduce", 2, b, 10_000 + b // 10, (2, b)) for b in (1000, 10_000, 100_000, 1_000_000)]
    model = fit(data)
    assert model.fits["all_gather"].pooled
    assert model.delta_ns("all_gather_into_tensor", 1 << 20, 2, 1 << 20, 4) > 0
    assert model.predict_ns("barrier", 0, 8) is None


@pytest.mark.timeout(10)
def test_a_slope_the_scatter_does_not_support_is_not_a_bandwidth():
    """Times that do not grow with bytes (a time-shared CPU): no bandwidth is fitted, the
    model says so, and one can be given."""
    rng = random.Random(2)
    data = [Sample("all_gather", 2, rng.randrange(8000, 14000), rng.randrange(1_000_000, 9_000_000), (0, i))
            for i in range(40)]
    model = fit(data)
    f = model.fits["all_gather"]
    assert not f.identified and f.ns_per_byte == 0.0 and model.unidentified == ["all_gather"]
    assert model.delta_ns("all_gather_into_tensor", 10_000, 2, 10_000_000, 4096) == 0
    assert model.to_dict()["bandwidth_unidentified"] == ["all_gather"]
    given = model.with_bandwidth(1e9)  # 1 GB/s: 1 ns a byte
    assert given.fits["all_gather"].ns_per_byte == 1.0 and given.unidentified == []
    assert given.fits["all_gather"].alpha_ns == f.alpha_ns
    assert given.to_dict()["given_bytes_per_s"] == 1e9
    with pytest.raises(ValueError):
        model.with_bandwidth(0)
