"""Serving figures that stay readable: many replicas drawn as each pool's median over its
replicas with percentile bands (a line each would overplot into one band), a few as a line each;
the token-gap CDF on a log axis. The bands hold the replicas' values: at every time the median
lies between the lowest and the highest replica, read independently from the iteration log."""

from __future__ import annotations

import numpy as np
import pytest

from support import RooflineCost, make_system

from marssim.serve import Arrivals, Deployment, Lengths, Pool, RequestSpec, load_model, simulate_serving
from marssim.serve import outputs

MODEL = "llama:layers=2,hidden=256,heads=8,kv_heads=4,ffn=768,vocab=2000"


@pytest.fixture(scope="module")
def runs():
    model = load_model(MODEL)
    system = make_system(8, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")
    requests = RequestSpec(Arrivals("poisson", rate=400.0), Lengths("uniform", low=20, high=300),
                           Lengths("uniform", low=2, high=60), 120).draw(0)
    return {n: simulate_serving(Deployment((Pool(replicas=n),)), model, system, RooflineCost(), requests)
            for n in (2, 8)}


def test_many_replicas_are_a_median_within_its_bands(runs):
    result = runs[8]
    fig = outputs._timeline(result)
    kv = fig.axes[0]
    assert len(kv.lines) == 1  # the median, not eight lines
    assert len(kv.collections) == 2  # the 25-75% and min-max bands
    grid, median = kv.lines[0].get_data()
    it = result.iterations
    per_replica = []
    for info in result.replicas:  # a replica the router gave no request stays at zero
        mask = it["replica"] == info.index
        t, v = it["end"][mask], it["kv_blocks"][mask] / it["kv_capacity"][mask] * 100
        k = np.searchsorted(t, grid, side="right") - 1
        per_replica.append(np.where(k >= 0, v[np.clip(k, 0, None)] if len(v) else 0.0, 0.0))
    stacked = np.vstack(per_replica)
    assert stacked.shape[0] == 8
    assert np.all(median >= stacked.min(axis=0) - 1e-9) and np.all(median <= stacked.max(axis=0) + 1e-9)
    assert np.allclose(median, np.median(stacked, axis=0))


def test_a_few_replicas_are_a_line_each(runs):
    fig = outputs._timeline(runs[2])
    assert len(fig.axes[0].lines) == 2 and not fig.axes[0].collections


def test_token_gaps_on_a_log_axis(runs, tmp_path):
    outputs.plot_run(runs[8], tmp_path / "f.png")
    assert (tmp_path / "f.svg").read_text().count("log scale") == 1
