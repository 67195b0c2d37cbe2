"""A latency-versus-load curve: the same deployment under the same requests arriving at several
rates, each point one simulation, spread over any ``concurrent.futures.Executor`` (a process
pool, a Dask cluster's executor; None runs them here).

Every point draws its requests with the same seed from the spec at its rate (:meth:`RequestSpec.with_rate`):
the same lengths and the same arrival pattern, stretched or compressed, so the curve differs
between points only by the load. The problem (deployment, model, system, cost model, requests,
SLO) is pickled once and unpickled once per worker process (:mod:`marssim.workercache`); a
worker keeps its iteration-time memo from one point to the next.
"""

from __future__ import annotations

from concurrent.futures import Executor

from marssim.cost.base import CostModel
from marssim.system import System
from marssim.workercache import pickled, worker_copy
from marssim.workload.llm.config import TransformerConfig

from .deployment import Deployment
from .metrics import SLO
from .requests import RequestSpec
from .simulate import simulate_serving

__all__ = ["rate_sweep"]

_PROBLEMS: dict = {}


def _point(key: str, blob: bytes | None, problem: tuple | None, rate: float) -> dict:
    if problem is None:
        problem = worker_copy(_PROBLEMS, key, blob)
    deployment, model, system, cost, spec, seed, slo = problem
    requests = spec.with_rate(rate).draw(seed)
    result = simulate_serving(deployment, model, system, cost, requests, seed=seed, slo=slo)
    return {"rate": float(rate), "summary": result.summary}


def _warm(deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel) -> None:
    """Time one token on each pool's GPUs here, so that the cost model travels to the workers
    with whatever it prepares on first use (a calibration table's fit) done once."""
    from .itermodel import IterationModel
    from .simulate import place_replicas

    seen = set()
    for p, stages in place_replicas(system, deployment):
        design = system.accelerator(stages[0][0]).designs[0]
        if design not in seen:
            seen.add(design)
            IterationModel(model, system, ((stages[0][0],),), cost).stage_times((1, 1), (0, 0), (), 1, 1, 1)


def rate_sweep(deployment: Deployment, model: TransformerConfig, system: System, cost: CostModel, spec: RequestSpec,
               rates: list[float], *, seed: int = 0, slo: SLO = SLO(), executor: Executor | None = None) -> list[dict]:
    """``{"rate": requests/s, "summary": ...}`` for every rate, in the order of ``rates``."""
    problem = (deployment, model, system, cost, spec, seed, slo)
    if executor is None:
        return [_point("", None, problem, r) for r in rates]
    _warm(deployment, model, system, cost)
    key, blob = pickled(problem)
    futures = [executor.submit(_point, key, blob, None, r) for r in rates]
    return [f.result() for f in futures]
