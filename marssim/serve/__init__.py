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

from .deployment import Deployment, Pool, SchedulerConfig, parse_pool
from .metrics import SLO
from .model import load_model
from .requests import Arrivals, Lengths, Requests, RequestSpec, parse_arrivals, parse_lengths
from .simulate import ServeResult, simulate_serving
from .sweep import rate_sweep

__all__ = ["Deployment", "Pool", "SchedulerConfig", "parse_pool", "SLO", "load_model", "Arrivals", "Lengths",
           "Requests", "RequestSpec", "parse_arrivals", "parse_lengths", "ServeResult", "simulate_serving",
           "rate_sweep"]
