"""The compiled engine's own pieces: its sort (insertion sort for a few values, heapsort beyond)
orders any range of an int64 array as numpy does, moving a second array along; its state holds
the very arrays it was built from."""

from __future__ import annotations

import numpy as np
import pytest

k = pytest.importorskip("marssim.sim._fast_kernels")


@pytest.mark.parametrize("n", [0, 1, 2, 5, 16, 17, 40, 1000])
def test_sort_is_numpys(n):
    rng = np.random.default_rng(n)
    for lo in (0, 3):
        a = rng.integers(-50, 50, size=n + lo + 4).astype(np.int64)  # duplicates included
        want = a.copy()
        want[lo:lo + n] = np.sort(a[lo:lo + n])
        k._sort(a, a, lo, lo + n, False)
        assert np.array_equal(a, want)


@pytest.mark.parametrize("n", [3, 16, 17, 300])
def test_sort_moves_pairs_along(n):
    rng = np.random.default_rng(7)
    keys = rng.permutation(10 * n)[:n].astype(np.int64)  # distinct, as flow start sequences are
    vals = rng.integers(0, 1000, size=n).astype(np.int64)
    order = np.argsort(keys)
    want_keys, want_vals = keys[order], vals[order]
    k._sort(keys, vals, 0, n, True)
    assert np.array_equal(keys, want_keys) and np.array_equal(vals, want_vals)


def test_state_holds_the_arrays():
    from numba import njit

    @njit
    def read(state):
        state.fl[0] = 2.5
        return state.it[1] + state.q_a[2]

    arrays = {name: np.zeros(3, dtype=np.int64) for name in k.FIELDS}
    arrays["fl"] = np.zeros(4)
    arrays["it"][1] = 41  # the state reads the caller's arrays, not copies
    arrays["q_a"][2] = 1
    state = k.State(**arrays)
    assert read(state) == 42
    assert arrays["fl"][0] == 2.5  # and writes them
