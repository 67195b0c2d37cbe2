"""Linear layers' GEMMs between measured shapes (marssim.cost.gemm_grid): the log-space
interpolation against a closed-form law, the rule that only a measured grid is interpolated, and
a gradient GEMM taking the forward slice."""

from __future__ import annotations

import itertools
import math

import pytest

from marssim.cost.features import KERNEL_PHASES
from marssim.cost.gemm_grid import DENSE, GEMM_KIND, GemmGrid, grid_from_measured

KEY = (GEMM_KIND, 0, 1, 0, 0)


def law(m: float, n: float, k: float) -> float:
    """A time that is a power law of the shape: what the interpolation reproduces exactly."""
    return 2e-6 * m ** 0.6 * n ** 0.8 * k ** 0.9


def _code(m: int, n: int, k: int, phase: int = 0, kind: int = GEMM_KIND) -> tuple:
    return (kind, 0, 1, m, n, k, 0, 0, (), phase, 0)


MS, NS, KS = (64, 128, 256, 512), (256, 512, 1024, 4096), (256, 1024, 2048)


def test_a_power_law_comes_back_between_the_points_and_across_a_hole():
    points = [p for p in itertools.product(MS, NS, KS) if p != (128, 1024, 1024)]
    grid = GemmGrid((KEY, m, n, k, law(m, n, k)) for m, n, k in points)
    for m, n, k in ((128, 1024, 1024), (300, 700, 1500), (64, 256, 256), (257, 4096, 2048)):
        assert grid.seconds(KEY, m, n, k) == pytest.approx(law(m, n, k), rel=1e-12)
    # outside a measured range, and another slice: nothing
    assert grid.seconds(KEY, 1024, 512, 1024) is None and grid.seconds(KEY, 128, 128, 1024) is None
    assert grid.seconds((GEMM_KIND, 1, 1, 0, 0), 128, 512, 1024) is None


def test_between_two_widths_ln_t_is_linear_in_ln_n():
    grid = GemmGrid([(KEY, 256, 12288, 8192, 3.0e-4), (KEY, 256, 16384, 8192, 3.8e-4)])
    u = math.log(14336 / 12288) / math.log(16384 / 12288)
    assert grid.seconds(KEY, 256, 14336, 8192) == pytest.approx(
        math.exp((1 - u) * math.log(3.0e-4) + u * math.log(3.8e-4)), rel=1e-12)
    assert grid.seconds(KEY, 256, 12288, 8192) == pytest.approx(3.0e-4, rel=1e-14)  # a measured shape is itself


def test_only_a_measured_grid_is_interpolated():
    full = {_code(m, n, k): law(m, n, k) for m, n, k in itertools.product(MS, NS, KS)}
    assert grid_from_measured(full).seconds(KEY, 300, 700, 1500) == pytest.approx(law(300, 700, 1500), rel=1e-12)
    # rows at the shapes of particular models: one (n, k) pair per width, a small share of the pairs
    sparse = {_code(m, n, k): law(m, n, k) for m in MS for n, k in zip(NS, (256, 1024, 2048, 2048))}
    pairs = {(c[4], c[5]) for c in sparse}
    assert len(pairs) < DENSE * len(NS) * len({c[5] for c in sparse})
    assert not grid_from_measured(sparse)
    # a convolution's rows are not a linear layer's
    assert not grid_from_measured({_code(m, n, k, kind=1): t for (_, _, _, m, n, k, *_), t in full.items()})


def test_a_gradient_gemm_takes_the_forward_slice():
    from marssim.cost.features import F_BACKEND, F_DTYPE, F_G, F_KERNEL, F_KK, F_M, F_NN, F_PHASE
    from marssim.cost.gemm_grid import op_seconds

    grid = grid_from_measured({_code(m, n, k): law(m, n, k) for m, n, k in itertools.product(MS, NS, KS)})
    width = 1 + max(F_BACKEND, F_DTYPE, F_G, F_KERNEL, F_KK, F_M, F_NN, F_PHASE)
    x = [0] * width
    x[F_KERNEL], x[F_DTYPE], x[F_G], x[F_M], x[F_NN], x[F_KK] = GEMM_KIND, 0, 1, 300, 700, 1500
    x[F_PHASE] = KERNEL_PHASES.index("dgrad")
    assert op_seconds(grid, tuple(x)) == pytest.approx(law(300, 700, 1500), rel=1e-12)
    x[F_KERNEL] = GEMM_KIND + 1
    assert op_seconds(grid, tuple(x)) is None
