"""The kinds of plan, one registry: what tells a per-op :class:`~marssim.mapping.Mapping`, a
:class:`~marssim.parallel.ParallelConfig` and a serving :class:`~marssim.serve.deployment.Deployment`
apart, in one place, so that nothing outside the plan level asks a plan its class.

Each :class:`PlanKind` has a :class:`KindSpec` (:data:`KINDS`; :func:`kind_of` finds a plan's):
its noun, the section of a file that holds it, the objectives a search of it minimises, its one list
of search algorithms (the first the default), the figures its evaluations report, its record of
an evaluation (:mod:`marssim.plan.evaluation`), its names (one line, a short cell, a stable key),
its own lines of a report, the graph it runs (a configuration runs one micro-batch of the
workload), how a search deals it to workers, and how its simulation and its screen are named.
Evaluating a plan of any kind goes through :mod:`marssim.plan.run` (:func:`~marssim.plan.run`,
:func:`~marssim.plan.run_deployment`, :func:`~marssim.plan.serve_stream`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from marssim.errors import InputError
from marssim.mapping import Mapping
from marssim.parallel import ParallelConfig
from marssim.serve.deployment import Deployment
from marssim.workload import Graph

from .evaluation import (PLAN_OBJECTIVES, SERVING_OBJECTIVES, DeploymentEvaluation, Evaluation, MappingEvaluation,
                         ParallelEvaluation)
from .model import Plan, PlanKind, graph_for

__all__ = ["PlanKind", "KindSpec", "KINDS", "find_kind", "kind_of", "short_config", "short_deployment"]


@dataclass(frozen=True)
class KindSpec:
    """What a kind of plan is (see the module docstring).

    ``plan_type``: its class; ``noun``: what a person calls one (``mapping``, ``configuration``,
    ``deployment``), ``plural``: what a person calls its plans; ``section``: the key of a file
    that holds one; ``objectives``: what a search of it may minimise (the first the default);
    ``algorithms``: the searches it has (the first the default); ``evaluation``: the record of
    its evaluations (a :class:`~marssim.plan.evaluation.Evaluation`), ``metrics``: the figures it
    reports (names of that record's fields); ``screen``: what its screen is;
    ``text``, ``short``, ``key``: a plan in a line, in a table cell, as a stable hex key;
    ``describe``: its own lines of a report (``graph``: the workload, None for a deployment);
    ``graph_of``: the graph it runs of the workload; ``affinity``: what a worker builds once
    and reuses for it (plans sorted by it share a worker; () deals them round-robin);
    ``folded``: its TaskGraph holds one GPU per class of identical GPUs (a trace unfolds it);
    ``rerun_rel_tol``: how far a second simulation of it may differ from the first (relative)."""

    kind: PlanKind
    plan_type: type
    noun: str
    plural: str
    section: str
    objectives: tuple[str, ...]
    algorithms: tuple[str, ...]
    metrics: tuple[str, ...]
    evaluation: type[Evaluation]
    screen: str
    text: Callable[[Plan], str]
    short: Callable[[Plan], str]
    key: Callable[[Plan], str]
    describe: Callable[[Plan, Graph | None], list[str]]
    graph_of: Callable[[Graph, Plan], Graph]
    affinity: Callable[[Plan], tuple] = lambda plan: ()
    folded: bool = False
    rerun_rel_tol: float = 0.0

    @property
    def default_algorithm(self) -> str:
        return self.algorithms[0]

    @property
    def default_objective(self) -> str:
        return self.objectives[0]

    def check_algorithm(self, name: str, where: str = "--algorithm") -> None:
        """InputError unless ``name`` is one of this kind's :attr:`algorithms` (saying which kind
        it searches when it is another's)."""
        if name in self.algorithms:
            return
        others = [k.plural for k in KINDS.values() if name in k.algorithms]
        raise InputError(None, where, f"{self.plural} are searched by {', '.join(self.algorithms)}, not {name}"
                                      + (f" ({name} searches {' and '.join(others)})" if others else ""))


def _hash_key(plan: Plan) -> str:
    return hashlib.sha1(repr(plan).encode()).hexdigest()


def _same_graph(graph: Graph, plan: Plan) -> Graph:
    return graph


def _describe_mapping(m: Mapping, graph: Graph | None) -> list[str]:
    """One line per set: devices, design and the layer range it runs; the micro-batches."""
    names = [graph.ops[gi].name for gi in graph.compute_ops] if graph is not None else []
    lines = []
    for i, s in enumerate(m.sets):
        ops = [k for k, si in enumerate(m.op_set) if si == i]
        if not ops:
            continue
        strategies = sorted({m.op_sharding[k] for k in ops})
        devices = s.devices[0] if len(s.devices) == 1 else f"{s.devices[0]}..{s.devices[-1]} ({len(s.devices)})"
        span = f"{names[ops[0]]} .. {names[ops[-1]]}" if names else f"ops {ops[0]} .. {ops[-1]}"
        lines.append(f"  set {i}: {devices:<20} {s.design:<10} {span} ({len(ops)} ops; {', '.join(strategies)})")
    lines.append(f"  micro-batches: {m.micro_batches}")
    return lines


def _describe_deployment(dep: Deployment, graph: Graph | None) -> list[str]:
    """One line per pool, and the router."""
    lines = [f"  pool {i}: {p.text()}" for i, p in enumerate(dep.pools)]
    bucket = f", context bucket {dep.context_bucket}" if dep.context_bucket != 1 else ""
    lines.append(f"  router {dep.router}{bucket}")
    return lines


def short_deployment(dep: Deployment) -> str:
    """A deployment in a few characters: per pool ``16xtp4`` (``pp2``, ``ep4``), the GPU kind on a mixed
    cluster, the role (``P:``, ``D:``), the scheduler (``cont``, ``mixed``, ``chunk``) with its
    token budget, sequence cap and block size (``2k/s128/b32``); whole (tables widen to it)."""
    parts = []
    for p in dep.pools:
        c = p.scheduler
        kind = "chunk" if c.kind == "chunked" else "mixed" if c.mixed else "cont" if c.kind == "continuous" else c.kind
        tokens = f"{c.max_batched_tokens // 1024}k" if c.max_batched_tokens % 1024 == 0 else str(c.max_batched_tokens)
        text = {"prefill": "P:", "decode": "D:"}.get(p.role, "") + f"{p.replicas}xtp{p.tp}"
        text += f"pp{p.pp}" if p.pp > 1 else ""
        text += f"ep{p.ep}" if p.ep > 1 else ""
        text += f"@{p.gpu}" if p.gpu else ""
        text += f" {kind}/{tokens}/s{c.max_num_seqs}/b{c.block_size}"
        parts.append(text)
    return " + ".join(parts)


_SHORT = (("sp", lambda v: "sp" if v else ""), ("ep", lambda v: f"ep{v}"), ("micro_batch", lambda v: f"mb{v}"),
          ("global_batch", lambda v: f"gb{v}"), ("schedule", lambda v: {"1f1b": "", "gpipe": "gpipe"}.get(v, "il")),
          ("virtual_stages", lambda v: f"v{v}"),
          ("recompute", lambda v: {"selective": "rc-sel", "full": "rc-full"}.get(v, "")),
          ("zero", lambda v: f"z{v}"), ("order", lambda v: v), ("bucket", lambda v: f"bucket{v}"),
          ("overlap_grad_reduce", lambda v: "" if v else "no-overlap"),
          ("tp_comm_overlap", lambda v: "tpo" if v else ""),
          ("overlap_param_gather", lambda v: "opg" if v else ""), ("overlap_p2p_comm", lambda v: "p2po" if v else ""),
          ("etp", lambda v: f"etp{v}"), ("account_for_embedding", lambda v: "split+emb" if v else ""),
          ("account_for_loss", lambda v: "split+loss" if v else ""))


def short_config(cfg: ParallelConfig) -> str:
    """A configuration in a few characters (``tp8 pp2 dp8 sp mb1 gb64 rc-full z1``; per-stage
    settings as ``stp=8/4``, ``lps=10/12``, ``start=0/16``); whole (tables widen to it)."""
    parts = [f"tp{cfg.tp}" if not cfg.stage_tp else "stp=" + "/".join(map(str, cfg.stage_tp)),
             f"pp{cfg.pp}", f"dp{cfg.dp}"] + ([f"cp{cfg.cp}"] if cfg.cp > 1 else [])
    default = ParallelConfig()
    for name, fmt in _SHORT:
        value = getattr(cfg, name)
        if value != getattr(default, name) or name in ("micro_batch",):
            token = fmt(value)
            if token:
                parts.append(token)
    if cfg.layers_per_stage:
        parts.append("lps=" + "/".join(map(str, cfg.layers_per_stage)))
    if cfg.stage_start:
        parts.append("start=" + "/".join(map(str, cfg.stage_start)))
    return " ".join(parts)


def _config_affinity(cfg: ParallelConfig) -> tuple:
    """The model graph prepared for the configuration's micro-batch, recomputation and context
    parallelism, then the rules of its tensor, sequence and expert parallelism."""
    return (cfg.micro_batch, cfg.recompute, cfg.cp, cfg.sp, cfg.tp, cfg.ep, cfg.etp, cfg.text())


KINDS: dict[PlanKind, KindSpec] = {
    PlanKind.MAPPING: KindSpec(
        PlanKind.MAPPING, Mapping, "mapping", "per-op mappings", "assign",
        objectives=PLAN_OBJECTIVES,
        algorithms=("mars", "data_parallel", "h2h", "random", "exhaustive"),
        metrics=("makespan", "throughput", "energy"), evaluation=MappingEvaluation,
        screen="analytical estimate",
        text=lambda m: f"mapping {m.key[:12]}", short=lambda m: m.key[:12], key=lambda m: m.key,
        describe=_describe_mapping, graph_of=_same_graph),
    PlanKind.PARALLEL: KindSpec(
        PlanKind.PARALLEL, ParallelConfig, "configuration",
        "parallel configurations of an LLM workload on a GPU cluster", "parallel",
        objectives=("latency", "throughput"), algorithms=("mars", "megatron_grid"),
        metrics=("makespan", "throughput", "energy", "mfu", "exposed", "ttft", "tpot", "memory_peak"),
        evaluation=ParallelEvaluation, screen="closed form", text=lambda c: c.text(), short=short_config,
        key=_hash_key,
        describe=lambda c, graph: [f"  {c.text()}"], graph_of=lambda graph, c: graph_for(graph, c),
        affinity=_config_affinity, folded=True, rerun_rel_tol=1e-12),
    PlanKind.DEPLOYMENT: KindSpec(
        PlanKind.DEPLOYMENT, Deployment, "deployment", "serving deployments", "pools",
        objectives=SERVING_OBJECTIVES, algorithms=("mars", "uniform_grid", "exhaustive"),
        metrics=("rate", "goodput", "gpus", "cost_per_mtok", "slo_ratio", "latency", "throughput",
                 "user_tokens_per_s"),
        evaluation=DeploymentEvaluation, screen="closed form", text=lambda d: d.text(), short=short_deployment,
        key=_hash_key,
        describe=_describe_deployment, graph_of=_same_graph),
}
"""Every kind of plan and what it is."""

_BY_TYPE = {spec.plan_type: spec for spec in KINDS.values()}


def find_kind(obj: object) -> KindSpec | None:
    """The :class:`KindSpec` of ``obj`` when it is a plan, else None."""
    return _BY_TYPE.get(type(obj))


def kind_of(plan: Plan) -> KindSpec:
    """The :class:`KindSpec` of ``plan``; TypeError for anything that is no plan."""
    spec = find_kind(plan)
    if spec is None:
        raise TypeError(f"not a plan: {type(plan).__name__}; expected one of "
                        f"{', '.join(t.__name__ for t in _BY_TYPE)}")
    return spec
