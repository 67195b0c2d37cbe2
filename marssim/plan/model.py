"""What a plan is: a per-op :class:`~marssim.mapping.Mapping` (the MARS mapping space: sets,
designs, segments, shardings), a :class:`~marssim.parallel.ParallelConfig` (Megatron-LM-style
tensor, sequence, pipeline, data and expert parallelism of an LLM on a GPU cluster) or a serving
:class:`~marssim.serve.Deployment` (pools of model replicas, their parallelism, GPU kind and
engine scheduler). Each kind has its own evaluation: :func:`marssim.plan.run` lowers and
evaluates the first two, :func:`marssim.plan.run_deployment` serves a stream of requests with
the third.

A parallel configuration runs micro-batches: its graph is one micro-batch of the workload
(:func:`graph_for`), and the configuration's ``micro_batch`` is that graph's batch.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Union

from marssim.errors import InputError
from marssim.mapping import Mapping
from marssim.parallel import ParallelConfig, check_parallel
from marssim.serve.deployment import Deployment
from marssim.specs import split_spec
from marssim.system import System
from marssim.workload import Graph, load_workload, spec_mode
from marssim.workload.llm import require_transformer, transformer_of

__all__ = ["Plan", "PlanKind", "plan_key", "plan_text", "is_llm", "graph_for", "bind_parallel", "build_batch",
           "build_recompute"]

Plan = Union[Mapping, ParallelConfig, Deployment]


class PlanKind(enum.Enum):
    """The kinds of plan (what each is: :data:`marssim.plan.kinds.KINDS`)."""

    MAPPING = "mapping"
    PARALLEL = "parallel"
    DEPLOYMENT = "deployment"


def plan_key(plan: Plan) -> str:
    """A stable content hash (hex) of everything in ``plan`` that affects its evaluation."""
    if isinstance(plan, Mapping):
        return plan.key
    return hashlib.sha1(repr(plan).encode()).hexdigest()


def plan_text(plan: Plan) -> str:
    """One line naming ``plan``: a configuration's or a deployment's settings, a mapping's key."""
    return plan.text() if isinstance(plan, (ParallelConfig, Deployment)) else f"mapping {plan.key[:12]}"


def is_llm(graph: Graph) -> bool:
    """True when ``graph`` is a transformer a parallel configuration can run."""
    return transformer_of(graph) is not None


def graph_for(graph: Graph, cfg: ParallelConfig, cache: dict | None = None) -> Graph:
    """``graph`` at ``cfg``'s micro-batch (a training workload is rebuilt from its spec; a
    serving one keeps its batch). ``cache``: graphs already built, by micro-batch."""
    t = require_transformer(graph, "a parallel configuration")
    if not t.training or cfg.micro_batch == graph.batch:
        return graph
    cache = {} if cache is None else cache
    hit = cache.get(cfg.micro_batch)
    if hit is None:
        hit = cache[cfg.micro_batch] = load_workload(graph.spec, batch=cfg.micro_batch)
    return hit


def build_batch(spec: str, batch: int | None, config: ParallelConfig, *, micro_batch_given: bool) -> int | None:
    """The batch to build the workload ``spec`` at for ``config`` (``batch``: the one asked for, None:
    the spec's): a training LLM whose configuration gives its micro-batch while the workload gives
    no batch is built at the micro-batch at once -- the graph :func:`bind_parallel` would otherwise
    rebuild from the workload at its own batch (:func:`graph_for`), the same parameters, so the
    same graph, built once --; any other workload at ``batch`` (its own batch is then needed: the
    micro-batch is checked against it, or it is the micro-batch)."""
    if micro_batch_given and not workload_sets_batch(spec, batch) and spec_mode(spec) == "train":
        return config.micro_batch
    return batch


def build_recompute(spec: str, config: ParallelConfig) -> str | None:
    """The recomputation to build the workload ``spec`` with for ``config`` (None: the spec's): a
    training zoo LLM whose spec names none is built with the configuration's at once -- the
    graph :func:`marssim.parallel.prepare_graph` would otherwise rebuild from it for the
    configuration, the same parameters, so the same graph (named by the same spec), built once."""
    if spec_mode(spec) == "train" and "recompute" not in split_spec(spec).params:
        return config.recompute
    return None


def workload_sets_batch(spec: str, batch: int | None = None) -> bool:
    """Whether a workload spec (or a ``--batch``) gives the batch explicitly."""
    return batch is not None or "batch" in split_spec(spec).params


def bind_parallel(config: ParallelConfig, graph: Graph, system: System, where: str, *,
                  micro_batch_given: bool, batch_given: bool,
                  order_given: bool = True) -> tuple[ParallelConfig, Graph]:
    """``config`` and the graph of one micro-batch of it, checked against ``system``.

    The configuration's ``micro_batch`` sets the graph's batch; left out, the workload's batch is
    the micro-batch. Both given and different is refused (which one would hold is a guess). A
    configuration that names no rank ``order`` (``order_given=False``) takes the system's default
    (:func:`marssim.parallel.placement.default_order`).
    Raises InputError naming ``where`` and the key: a workload that is no LLM, or a configuration
    the workload or the system cannot take."""
    t = require_transformer(graph, "a parallel configuration", where)
    if micro_batch_given:
        if batch_given and graph.batch != config.micro_batch:
            raise InputError(where, "micro_batch", f"is {config.micro_batch} while the workload's batch is "
                                                   f"{graph.batch}; a parallel configuration runs micro-batches "
                                                   "of micro_batch sequences (global_batch: sequences per "
                                                   "iteration): give one of the two")
        graph = graph_for(graph, config) if t.training else graph
        if graph.batch != config.micro_batch:
            raise InputError(where, "micro_batch", f"applies to training; a serving workload's batch is its "
                                                   f"own ({graph.batch}), got micro_batch={config.micro_batch}")
    else:
        config = config.with_(micro_batch=graph.batch)
    check_parallel(config, require_transformer(graph, "a parallel configuration"), len(system.accelerators), where)
    if not order_given:
        from marssim.parallel.placement import default_order

        config = config.with_(order=default_order(system, config))
    return config, graph
