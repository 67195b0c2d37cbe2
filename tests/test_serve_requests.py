"""Request streams: the arrival processes and length distributions have the moments and shapes
they claim, traces replay their rows, the shipped traces are what their README says, and bad
specs and files get one error naming the key or the row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marssim.errors import InputError
from marssim.serve.requests import (Arrivals, Lengths, RequestSpec, parse_arrivals, parse_lengths, parse_prefix)
from marssim.serve.traces import load_trace, shipped_traces


def test_poisson_gaps_are_exponential():
    r = RequestSpec(Arrivals("poisson", rate=8.0), Lengths("fixed", 10), Lengths("fixed", 5), 40000).draw(1)
    gaps = np.diff(np.r_[0.0, r.arrival])
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV 1
    # memoryless: P(gap > 2/rate) = e^-2
    assert (gaps > 2 / 8.0).mean() == pytest.approx(math.exp(-2), rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_rate_and_burstiness_asked_for(cv):
    r = RequestSpec(Arrivals("gamma", rate=5.0, cv=cv), Lengths("fixed", 10), Lengths("fixed", 5), 60000).draw(2)
    gaps = np.diff(np.r_[0.0, r.arrival])
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_uniform_and_zipf_lengths():
    r = RequestSpec(Arrivals("offline"), Lengths("uniform", low=10, high=19), Lengths("zipf", low=1, high=50, a=1.5),
                    50000).draw(3)
    assert r.prompt.min() == 10 and r.prompt.max() == 19
    assert np.bincount(r.prompt - 10).min() > 50000 / 10 * 0.9
    counts = np.bincount(r.output, minlength=51)[1:]
    # P(k) / P(1) = k^-1.5
    for k in (2, 3, 5):
        assert counts[k - 1] / counts[0] == pytest.approx(k ** -1.5, rel=0.08)
    assert r.output.min() >= 1 and r.output.max() <= 50
    assert (r.arrival == 0).all()


def test_trace_replay_is_the_trace_and_sampling_keeps_rows_together():
    t = load_trace("azure-code-2023")
    r = RequestSpec(Arrivals("trace", trace="azure-code-2023"), Lengths("trace", trace="azure-code-2023"),
                    Lengths("trace", trace="azure-code-2023"), 500).draw(0)
    np.testing.assert_array_equal(r.arrival, t.arrival[:500])
    np.testing.assert_array_equal(r.prompt, t.prompt[:500])
    np.testing.assert_array_equal(r.output, t.output[:500])
    fast = RequestSpec(Arrivals("trace", trace="azure-code-2023", speedup=4.0), Lengths("fixed", 1),
                       Lengths("fixed", 1), 500).draw(0)
    np.testing.assert_allclose(fast.arrival, t.arrival[:500] / 4.0)
    sampled = RequestSpec(Arrivals("poisson", rate=1.0), Lengths("trace", trace="azure-conv-2023"),
                          Lengths("trace", trace="azure-conv-2023"), 2000).draw(0)
    conv = load_trace("azure-conv-2023")
    rows = set(zip(conv.prompt.tolist(), conv.output.tolist()))
    assert all(pair in rows for pair in zip(sampled.prompt.tolist(), sampled.output.tolist()))


def test_with_rate_sets_the_mean_rate():
    base = RequestSpec(Arrivals("trace", trace="azure-conv-2023"), Lengths("fixed", 1), Lengths("fixed", 1), 1000)
    for rate in (2.0, 30.0):
        r = base.with_rate(rate).draw(0)
        assert (len(r) - 1) / (r.arrival[-1] - r.arrival[0]) == pytest.approx(rate, rel=1e-9)
        assert base.with_rate(rate).rate == pytest.approx(rate, rel=1e-9)
    p = RequestSpec(Arrivals("poisson", rate=1.0), Lengths("fixed", 1), Lengths("fixed", 1), 10).with_rate(3.0)
    assert p.arrivals.rate == 3.0


def test_same_seed_same_requests_and_parts_independent():
    a = RequestSpec(Arrivals("poisson", rate=2.0), Lengths("uniform", low=1, high=100), Lengths("fixed", 3), 100)
    assert np.array_equal(a.draw(4).prompt, a.draw(4).prompt)
    assert not np.array_equal(a.draw(4).prompt, a.draw(5).prompt)
    # other output lengths do not move the arrivals or the prompts of the same seed
    b = RequestSpec(a.arrivals, a.prompt, Lengths("uniform", low=5, high=9), 100)
    assert np.array_equal(a.draw(4).arrival, b.draw(4).arrival) and np.array_equal(a.draw(4).prompt, b.draw(4).prompt)


def test_shared_prefixes():
    spec = RequestSpec(Arrivals("offline"), Lengths("fixed", 100), Lengths("fixed", 5), 4000, prefix_tokens=300,
                       prefix_groups=3, prefix_share=0.25)
    r = spec.draw(0)
    shared = r.prefix >= 0
    assert shared.mean() == pytest.approx(0.25, abs=0.03)
    assert set(r.prefix[shared].tolist()) == {0, 1, 2}
    assert (r.prompt[shared] == 400).all() and (r.prompt[~shared] == 100).all()
    assert parse_prefix("tokens=300,groups=3,share=0.25") == (300, 3, 0.25)


def test_the_shipped_traces_are_those_of_the_readme():
    traces = shipped_traces()
    assert set(traces) >= {"azure-conv-2023", "azure-code-2023"}
    readme = (next(iter(traces.values())).parent / "README.md").read_text()
    assert "CC BY 4.0" in readme and "b469a113cedca53ddc3bdea71a143dc4b7d8700c" in readme
    for name in ("azure-conv-2023", "azure-code-2023"):
        t = load_trace(name)
        assert len(t) == 5000 and t.arrival[0] == 0 and (np.diff(t.arrival) >= 0).all()
        assert f"`{name}.csv`" in readme and f"{t.span:,.0f} s" in readme
        assert f"{t.prompt.mean():,.0f}, {np.median(t.prompt):,.0f}, {t.prompt.max():,}" in readme


@pytest.mark.parametrize("text,where", [
    ("arrival_s,prompt_tokens\n0,5\n", "missing output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,1\n1,2.5,3\n", "row 2.prompt_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,1\n1,2,0\n", "row 2.output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n3,5,1\n1,2,3\n", "row 2.arrival_s"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,5,1\n", "row 1.arrival_s"),
])
def test_a_bad_trace_file_is_one_error_naming_the_row(tmp_path, text, where):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_trace(str(path))
    assert where in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("text,where", [
    ("poisson", "arrival.rate"), ("poisson:rate=-1", "arrival.rate"), ("gamma:rate=1,cv=x", "arrival.cv"),
    ("weibull:rate=1", "arrival"), ("trace:no-such-trace", "no-such-trace"), ("poisson:rate=1,burst=2", "arrival.burst"),
])
def test_bad_arrival_specs(text, where):
    with pytest.raises(InputError) as err:
        parse_arrivals(text)
    assert where in str(err.value)


@pytest.mark.parametrize("text,expected", [
    ("512", Lengths("fixed", 512)), ("fixed:7", Lengths("fixed", 7)), ("uniform:10-20", Lengths("uniform", low=10, high=20)),
    ("zipf:a=1.2,low=2,high=9", Lengths("zipf", low=2, high=9, a=1.2)),
])
def test_length_specs(text, expected):
    assert parse_lengths(text) == expected


@pytest.mark.parametrize("text,where", [("uniform:20-10", "prompt.high"), ("fixed:0", "prompt.value"),
                                        ("zipf:a=0,low=1,high=3", "prompt.a"), ("normal:3", "prompt")])
def test_bad_length_specs(text, where):
    with pytest.raises(InputError) as err:
        parse_lengths(text)
    assert where in str(err.value)
