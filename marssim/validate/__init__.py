"""Validate the analytical estimate (and a user's own numbers) against the simulator.

For every mapping: lower it once, estimate it (:func:`marssim.analytical.estimate`), simulate it
(no timelines), and record the relative error ``(estimate - simulation) / simulation``. Over all
mappings: the median, 90th percentile and largest absolute error, how many estimates came out
above the simulation, and the rank correlation of the two (Kendall's tau and Spearman's rho: does
the estimate order mappings the way the simulation does, which is what a search needs).

Where they differ, the difference is contention, and :func:`attribute` says whose: walking the
simulated critical path back from the last task, every transfer on it that took longer than it
would alone charges its extra time to the resources of its route that another flow was using at
the same time, and every compute task that waited for its device longer than it does in the
estimate charges the extra wait to that device. Units: seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from marssim.system import System
from marssim.workercache import pickled, worker_copy
from marssim.workload import Graph

from .compare import attribute, compare, op_times
from .inputs import check_estimates, load_mapping_dir, read_estimates
from .records import Comparison, NamedMapping, UserEstimates
from .report import ValidationReport, scatter_plot

__all__ = ["NamedMapping", "Comparison", "UserEstimates", "ValidationReport", "validate", "compare",
           "load_mapping_dir", "read_estimates", "attribute", "op_times", "scatter_plot"]


def validate(graph: Graph, system: System, mappings: Sequence[NamedMapping], cost=None, *,
             memory_policy: str = "error", estimates: UserEstimates | None = None, executor: Executor | None = None,
             progress: Callable[[int, int], None] | None = None, meta: dict[str, Any] | None = None) -> "ValidationReport":
    """Compare estimate and simulation on every mapping; see :class:`ValidationReport`.

    ``cost``: the cost model (default :func:`marssim.cost.default_cost_model`). ``estimates``: a
    user's numbers to compare as well (checked against the mapping and op names first).
    ``executor``: evaluate mappings in parallel on it (results keep the order given)."""
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    names = [m.name for m in mappings]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"mapping names must be unique; {dup!r} appears twice")
    want_ops = estimates is not None and estimates.kind == "layer"
    if estimates is not None:
        check_estimates(estimates, mappings, graph)
    results: list[Comparison] = []
    wall = time.perf_counter()
    if executor is None or len(mappings) < 2:
        for i, item in enumerate(mappings):
            results.append(compare(graph, system, item, cost, memory_policy=memory_policy, want_ops=want_ops))
            if progress:
                progress(i + 1, len(mappings))
    else:
        key, blob = pickled((graph, system, cost))
        args = [(key, blob, item, memory_policy, want_ops) for item in mappings]
        for i, res in enumerate(executor.map(_compare_task, args)):
            results.append(res)
            if progress:
                progress(i + 1, len(mappings))
    info = {"system": system.name, "workload": graph.spec, "mappings": len(mappings),
            "wall_s": time.perf_counter() - wall}
    info.update(meta or {})
    return ValidationReport.build(results, estimates, info)


_PROBLEMS: dict[str, tuple] = {}


def _compare_task(args) -> Comparison:
    key, blob, item, memory_policy, want_ops = args
    graph, system, cost = worker_copy(_PROBLEMS, key, blob)
    return compare(graph, system, item, cost, memory_policy=memory_policy, want_ops=want_ops)
