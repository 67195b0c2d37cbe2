"""Collective algorithms as schedules of point-to-point steps, and their expansion into tasks.

A schedule is a list of steps; a step is a list of flows ``(src, dst, nbytes)`` between ranks
``0..N-1`` (positions in the set's ring order). Per rank, a send of step ``k`` waits for that
rank's receive of step ``k-1`` and its own send of step ``k-1`` (data is forwarded or reduced
step by step, as NCCL-style implementations do), and for the rank's initial data.

* ring all-gather / reduce-scatter: ``N-1`` steps, rank ``i`` sends to ``i+1``; all-reduce is
  reduce-scatter then all-gather, ``2(N-1)`` steps of ``S/N`` bytes each.
* halving-doubling (``N`` a power of two): ``log2 N`` steps each way; rank ``i`` exchanges with
  ``i XOR d``, halving (reduce-scatter) or doubling (all-gather) the bytes each step.
* direct: every rank sends its piece straight to every rank that needs it, in one step.

:func:`estimate_schedule` gives a congestion-aware alpha-beta time (per step: largest route
latency plus the most loaded resource's bytes over its capacity); ``auto`` picks the cheapest.

The per-op lowering (:mod:`marssim.lower`) uses these where the collective model does not
describe the group; on a GPU cluster it runs NCCL's plan in the same format
(:func:`marssim.collectives.group.plan_schedule`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from marssim.system import System

__all__ = ["Flow", "schedule", "estimate_schedule", "choose_algorithm", "is_power_of_two", "KINDS"]

Flow = tuple[int, int, float]
KINDS = ("all_gather", "reduce_scatter", "all_reduce")


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _ring_all_gather(chunks: Sequence[float]) -> list[list[Flow]]:
    n = len(chunks)
    return [[(i, (i + 1) % n, chunks[(i - k) % n]) for i in range(n)] for k in range(n - 1)]


def _ring_reduce_scatter(chunks: Sequence[float]) -> list[list[Flow]]:
    n = len(chunks)
    return [[(i, (i + 1) % n, chunks[(i - k - 1) % n]) for i in range(n)] for k in range(n - 1)]


def _hd_reduce_scatter(chunks: Sequence[float]) -> list[list[Flow]]:
    n = len(chunks)
    steps = []
    lo = [0] * n
    hi = [n] * n  # rank i currently holds partial sums of chunks [lo, hi)
    d = n // 2
    while d >= 1:
        step = []
        new_lo, new_hi = lo[:], hi[:]
        for i in range(n):
            mid = (lo[i] + hi[i]) // 2
            keep_low = (i & d) == 0
            send = (mid, hi[i]) if keep_low else (lo[i], mid)
            step.append((i, i ^ d, float(sum(chunks[send[0]:send[1]]))))
            new_lo[i], new_hi[i] = (lo[i], mid) if keep_low else (mid, hi[i])
        lo, hi = new_lo, new_hi
        steps.append(step)
        d //= 2
    return steps


def _hd_all_gather(chunks: Sequence[float]) -> list[list[Flow]]:
    n = len(chunks)
    steps = []
    d = 1
    while d < n:
        step = []
        for i in range(n):
            start = (i // d) * d  # rank i holds the aligned block of d chunks containing chunk i
            step.append((i, i ^ d, float(sum(chunks[start:start + d]))))
        steps.append(step)
        d *= 2
    return steps


def _direct_all_gather(chunks: Sequence[float]) -> list[list[Flow]]:
    n = len(chunks)
    return [[(i, j, chunks[i]) for i in range(n) for j in range(n) if i != j]]


def _direct_reduce_scatter(chunks: Sequence[float]) -> list[list[Flow]]:
    n = len(chunks)
    return [[(i, j, chunks[j]) for i in range(n) for j in range(n) if i != j]]


def schedule(kind: str, algorithm: str, chunks: Sequence[float]) -> list[list[Flow]]:
    """Steps of collective ``kind`` by ``algorithm`` over ``len(chunks)`` ranks.

    ``chunks[i]`` is the size in bytes of the piece rank ``i`` owns (all-gather: contributes;
    reduce-scatter: ends with). For all-reduce, the tensor is ``sum(chunks)`` bytes split so."""
    n = len(chunks)
    if n < 2:
        return []
    if algorithm == "halving_doubling" and not is_power_of_two(n):
        raise ValueError(f"halving-doubling needs a power-of-two set size, got {n}")
    table = {
        ("all_gather", "ring"): _ring_all_gather,
        ("reduce_scatter", "ring"): _ring_reduce_scatter,
        ("all_gather", "halving_doubling"): _hd_all_gather,
        ("reduce_scatter", "halving_doubling"): _hd_reduce_scatter,
        ("all_gather", "direct"): _direct_all_gather,
        ("reduce_scatter", "direct"): _direct_reduce_scatter,
    }
    if kind == "all_reduce":
        return schedule("reduce_scatter", algorithm, chunks) + schedule("all_gather", algorithm, chunks)
    try:
        return table[(kind, algorithm)](chunks)
    except KeyError:
        raise ValueError(f"no algorithm {algorithm!r} for collective {kind!r}") from None


def estimate_schedule(system: System, devices: Sequence[str], steps: list[list[Flow]]) -> float:
    """Congestion-aware alpha-beta time (s) of a schedule on ``system``: per step, the largest
    route latency plus the largest (bytes on a resource / its capacity) over resources."""
    cap = system.resource_capacity
    total = 0.0
    load = np.zeros_like(cap)
    for step in steps:
        load[:] = 0.0
        latency = 0.0
        for src, dst, nbytes in step:
            if nbytes <= 0:
                continue
            route = system.route(devices[src], devices[dst])
            latency = max(latency, route.latency)
            for r in route.resources:
                load[r] += nbytes
        total += latency + float((load / cap).max(initial=0.0))
    return total


def choose_algorithm(system: System, devices: Sequence[str], kind: str, chunks: Sequence[float],
                     requested: str = "auto") -> tuple[str, list[list[Flow]]]:
    """The algorithm to use and its schedule: ``requested`` when given (falling back to ring when
    halving-doubling does not apply), else the cheapest by :func:`estimate_schedule` (ties: ring,
    then halving-doubling, then direct)."""
    n = len(devices)
    if requested != "auto":
        algo = requested
        if algo == "halving_doubling" and not is_power_of_two(n):
            algo = "ring"
        return algo, schedule(kind, algo, chunks)
    candidates = ["ring"] + (["halving_doubling"] if is_power_of_two(n) and n > 2 else []) + ["direct"]
    best = None
    for algo in candidates:
        steps = schedule(kind, algo, chunks)
        t = estimate_schedule(system, devices, steps)
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, algo, steps)
    assert best is not None
    return best[1], best[2]
