"""A parallel configuration as the per-op decisions of a :class:`~marssim.mapping.Mapping`."""

from __future__ import annotations

from marssim.mapping.model import AcceleratorSet, Mapping, _system_ref
from marssim.mapping.sharding import legal_strategies
from marssim.system import System
from marssim.workload import Graph, OpKind

from .config import ParallelConfig, check_parallel
from .lower import op_rules, prepare_graph, stage_of_layers
from .placement import place

__all__ = ["parallel_mapping", "strategy_of"]


def strategy_of(op, rule) -> str:
    """The sharding strategy that names ``op``'s tensor-parallel split (see
    :meth:`Mapping.from_parallel`); ``none`` where the op is replicated."""
    loops = {loop for loop, num, den in rule.split if den > 1 or num > 1}
    if op.param("grouped") and "B" in loops:
        choice = "dp"
    elif op.kind == OpKind.GEMM and op.param("grad") == "weight":
        choice = "oc" if "N" in loops else "ic" if "K" in loops else "none"
    elif op.kind == OpKind.GEMM:
        choice = "oc" if "N" in loops else "ic" if "K" in loops else "seq" if "M" in loops else "none"
    elif op.kind in (OpKind.MATMUL, OpKind.SOFTMAX) and loops & {"H", "A"}:
        choice = "head"
    elif "C" in loops or "L" in loops:
        choice = "oc" if op.kind != OpKind.SOFTMAX else "head"
    elif "H" in loops:
        choice = "seq"
    else:
        choice = "none"
    return choice if choice in legal_strategies(op) else "none"


def parallel_mapping(graph: Graph, system: System, config: ParallelConfig, where: str = "--parallel") -> Mapping:
    """See :meth:`Mapping.from_parallel`."""
    t = graph.meta.get("transformer")
    from marssim.errors import InputError

    if t is None:
        raise InputError(where, "", "a parallel configuration needs an LLM workload (gpt, llama, moe or a preset)")
    check_parallel(config, t, len(system.accelerators), where)
    prepared = prepare_graph(graph, config)
    where_ = place(system, config)
    names = system.nodes
    sets = []
    for stage in range(config.pp):
        gpus = sorted((g for g in where_.gpus if where_.stage(g) == stage),
                      key=lambda g: (where_.coords[g][0], where_.coords[g][2]))
        sets.append(AcceleratorSet(tuple(names[g] for g in gpus), system.accelerator(names[gpus[0]]).designs[0]))
    stage_of = stage_of_layers(t.layers, config)
    rules = op_rules(prepared, config)
    by_name = {op.name: op for op in prepared.ops}
    op_set, op_sharding = [], []
    for gi in graph.compute_ops:
        op = graph.ops[gi]
        op_set.append(stage_of[op.param("layer")])
        shard = by_name.get(op.name)
        op_sharding.append(strategy_of(op, rules[op.name]) if shard is not None else "none")
    return Mapping(sets=tuple(sets), op_set=tuple(op_set), op_sharding=tuple(op_sharding), micro_batches=1,
                   system=_system_ref(system), workload=graph.spec,
                   set_names=tuple(f"stage{s}" for s in range(config.pp)), parallel=config)
