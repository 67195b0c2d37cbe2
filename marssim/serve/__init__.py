"""Request-level LLM serving: a stream of requests, engines that batch them iteration by
iteration over a paged KV cache, replicas behind a router, prefill and decode pools that move KV
caches over the network, and the latency, throughput and goodput an operator plans with
(docs/serving.md).

* :mod:`.requests`, :mod:`.traces`: arrivals (Poisson, gamma, trace replay) and lengths;
* :mod:`.deployment`: pools, schedulers, KV-cache settings, routers as values;
* :mod:`.itermodel`: one iteration's time per pipeline stage from the cost model;
* :mod:`.memory`: KV-cache blocks from the memory left after weights and workspace;
* :mod:`.kvcache`, :mod:`.sequence`, :mod:`.schedulers`: the engines' block manager and policies;
* :mod:`.engine`, :mod:`.router`, :mod:`.disagg`, :mod:`.fabric`: replicas as SimPy processes,
  routing, KV-cache moves, transfers on the max-min fair network;
* :mod:`.simulate`: :func:`simulate_serving`, one run; :mod:`.sweep`: a rate sweep on an executor;
* :mod:`.metrics`, :mod:`.outputs`: figures of merit, tables, plots, Perfetto trace;
* :mod:`.launch`: a deployment as ``vllm serve`` and SGLang command lines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {"Deployment": "deployment", "Pool": "deployment", "SchedulerConfig": "deployment", "parse_pool": "deployment",
          "SLO": "metrics", "load_model": "model", "Arrivals": "requests", "Lengths": "requests",
          "Requests": "requests", "RequestSpec": "requests", "parse_arrivals": "requests", "parse_lengths": "requests",
          "ServeResult": "simulate", "simulate_serving": "simulate", "rate_sweep": "sweep"}
"""Each name of the package and the module that defines it: imported on first use, so that a
process reading a :class:`Deployment` (a plan, a search of other kinds) does not load the engines,
the simulator and the network."""

__all__ = ["SLO", "Arrivals", "Deployment", "Lengths", "Pool", "RequestSpec", "Requests", "SchedulerConfig",
           "ServeResult", "load_model", "parse_arrivals", "parse_lengths", "parse_pool", "rate_sweep",
           "simulate_serving"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:  # for type checkers and editors: the names as if imported here
    from .deployment import Deployment, Pool, SchedulerConfig, parse_pool
    from .metrics import SLO
    from .model import load_model
    from .requests import (
        Arrivals,
        Lengths,
        Requests,
        RequestSpec,
        parse_arrivals,
        parse_lengths,
    )
    from .simulate import ServeResult, simulate_serving
    from .sweep import rate_sweep
