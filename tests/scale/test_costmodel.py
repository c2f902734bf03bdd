import random

import pytest

from prism_rr.graph.costmodel import Sample, algorithm_factor, fit


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
