"""Mappings drawn from the mapping space for comparisons (``marssim validate``, the analytical
estimate's benchmarks): a deterministic mix of families that stress different parts of an
evaluator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from marssim.mapping.named import NamedMapping
from marssim.system import System
from marssim.workload import Graph

from .space import MappingSpace

__all__ = ["FAMILIES", "sample_mappings"]

FAMILIES = ("random", "pipeline", "collective")
"""How sampled mappings are drawn: ``random`` (uniform over the mapping space), ``pipeline``
(at least two sets, the most micro-batches allowed: devices queue micro-batches and stages share
links) and ``collective`` (output- or input-channel sharding wherever legal: all-gathers,
reduce-scatters and all-reduces on every layer)."""


def sample_mappings(graph: Graph, system: System, n: int, *, seed: int = 0,
                    families: Sequence[str] = FAMILIES, max_sets: int | None = None,
                    micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8)) -> list[NamedMapping]:
    """``n`` distinct mappings drawn with :class:`~marssim.search.space.MappingSpace` under ``seed``,
    cycling through ``families`` (see :data:`FAMILIES`). Deterministic."""
    for f in families:
        if f not in FAMILIES:
            raise ValueError(f"unknown family {f!r}; expected {', '.join(FAMILIES)}")
    space = MappingSpace(graph, system, max_sets=max_sets, micro_batch_choices=micro_batch_choices)
    rng = np.random.default_rng(seed)
    out: list[NamedMapping] = []
    seen: set[str] = set()
    n_acc = len(space.accelerators)
    collective = tuple(tuple(s for s in opts if s in ("oc", "ic")) or opts for opts in space.layer_strategies)
    failures = 0
    while len(out) < n and failures < 20 * n + 100:
        family = families[len(out) % len(families)]
        genome = space.random(rng)
        if family == "pipeline" and space.max_sets >= 2 and n_acc >= 2:
            k = int(rng.integers(2, space.max_sets + 1))
            cut_at = set(int(c) for c in rng.choice(n_acc - 1, size=k - 1, replace=False))
            genome = replace(genome, cuts=tuple(i in cut_at for i in range(n_acc - 1)), boundaries=(),
                             assignment=(), micro_batches=max(space.micro_batch_choices))
        elif family == "collective":
            genome = replace(genome, shardings=tuple(str(rng.choice(opts)) if opts else "none" for opts in collective))
        mapping = space.decode(genome)
        if mapping.key in seen:
            failures += 1
            continue
        seen.add(mapping.key)
        out.append(NamedMapping(f"s{len(out):03d}-{family}", mapping, family))
    return out
