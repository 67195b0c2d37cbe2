"""How a parallel configuration cuts a transformer graph: the layers of each model chunk and the
pipeline stage of each layer, every op's tensor-parallel rule (:mod:`.roles`) and the loop sizes
of its shard on one rank, and the graph rebuilt for one micro-batch of the configuration. What the
lowering (:mod:`.lower`), the closed-form screen (:mod:`.analytic`), the memory model
(:mod:`.memory`), serving and calibration all read.

Memoised with the graph (:data:`.memo.GRAPH_MEMO`); the rules of graphs alike in structure shared
in :data:`SHARED_RULES`. Units: parameters, loop sizes (elements).
"""

from __future__ import annotations

import functools
import weakref

from marssim.errors import InputError
from marssim.workload import Graph, Op, OpKind
from marssim.workload.llm import require_transformer
from marssim.workload.llm.tprole import TP_ROLE

from . import experts
from .config import ParallelConfig
from .memo import BoundedCache, graph_cached
from .roles import Rule, rule_for

__all__ = [
    "SHARED_RULES",
    "chunk_layers",
    "op_rules",
    "prepare_graph",
    "rules_key",
    "shard_loops",
    "stage_of_layers",
]


@functools.lru_cache(maxsize=1024)
def chunk_layers(layers: int, cfg: ParallelConfig) -> tuple[tuple[int, ...], ...]:
    """The layers of each model chunk: ``pp * virtual_stages`` chunks (``layers_per_stage`` when
    given), balanced with the larger ones first; chunk 0 also holds the embedding (layer -1), the
    last the head (layer ``layers``). With ``account_for_embedding`` (``account_for_loss``) the
    embedding (the head) counts as a layer of the split: the first (last) chunk holds one block
    fewer. Memoised: read it, do not change it."""
    n = cfg.pp * (cfg.virtual_stages if cfg.schedule == "interleaved" else 1)
    if cfg.layers_per_stage:
        sizes = list(cfg.layers_per_stage)
    else:
        counted = layers + cfg.account_for_embedding + cfg.account_for_loss
        sizes = [counted // n + (1 if i < counted % n else 0) for i in range(n)]
        sizes[0] -= cfg.account_for_embedding
        sizes[-1] -= cfg.account_for_loss
    out, at = [], 0
    for size in sizes:
        out.append(list(range(at, at + size)))
        at += size
    out[0].insert(0, -1)
    out[-1].append(layers)
    return tuple(tuple(chunk) for chunk in out)


def stage_of_layers(layers: int, cfg: ParallelConfig) -> dict[int, int]:
    """The pipeline stage of every layer (``-1``: the embedding, ``layers``: the head)."""
    return {layer: c % cfg.pp for c, chunk in enumerate(chunk_layers(layers, cfg)) for layer in chunk}


def op_rules(graph: Graph, cfg: ParallelConfig) -> dict[str, Rule]:
    """Every op's tensor-parallel rule (:func:`~.roles.rule_for` with its stage's degree), in
    graph order; the MoE re-layouts as ``D`` (locally permuted, before the all-to-all).
    Memoised per graph by the degree of every layer, sequence and expert parallelism."""
    stage_of = stage_of_layers(require_transformer(graph, "a parallel configuration").layers, cfg)
    key = rules_key(cfg, stage_of)
    return graph_cached(graph, key, lambda: _shared_rules(graph, cfg, stage_of, key))


SHARED_RULES = BoundedCache(64)
"""op_rules by (graph structure, rules key): the graphs of one model prepared for several
micro-batch sizes differ in their ops' sizes only, which no rule reads."""


def _structure(graph: Graph) -> tuple:
    """What :func:`~.roles.rule_for` reads of a graph's ops (names, kinds, inputs, the params it
    looks at) and the expert routing: graphs alike in it get the same rules."""
    def make() -> tuple:
        params = ("view", "grad", "grouped", "fn", "what", TP_ROLE)
        t = require_transformer(graph, "a parallel configuration")
        return (getattr(t, "expert_load", None),) + tuple(
            (op.name, op.kind, tuple(op.inputs), tuple(op.param(p) for p in params)) for op in graph.ops)
    return graph_cached(graph, "rule structure", make)


def _shared_rules(graph: Graph, cfg: ParallelConfig, stage_of: dict[int, int], key: tuple) -> dict[str, Rule]:
    return SHARED_RULES.get_or_make((_structure(graph), key), lambda: _op_rules(graph, cfg, stage_of))


def rules_key(cfg: ParallelConfig, stage_of: dict[int, int]) -> tuple:
    """What :func:`op_rules` depends on beyond the graph: sequence and expert parallelism and
    the tensor- and expert-tensor-parallel degree of every layer (``stage_of``:
    :func:`stage_of_layers`)."""
    degrees = tuple(sorted((layer, cfg.tp_of(s), cfg.etp_of(s)) for layer, s in stage_of.items()))
    return ("rules", cfg.sp, cfg.ep, degrees)


_MOE_RESHAPES = ("dispatch", "combine", "dispatch_grad", "combine_grad", "gate_grad")


def shard_loops(op: Op, rule: Rule, rank_params: dict[int, int], zero_share: int) -> dict[str, int]:
    """The loop sizes of ``op``'s part on one rank under ``rule``: each split loop cut to
    ``ceil(size * num / den)``; an AdamW step over the parameters of its layer group one rank
    holds (``rank_params``), a ``1/zero_share`` part of them (ZeRO)."""
    sizes = {}
    for loop, num, den in rule.split:
        if op.has_dim(loop) and (num != 1 or den != 1):
            sizes[loop] = max(1, -(-op.dim(loop) * num // den))
    if op.param("fn") == "adam":
        sizes["C"] = max(1, -(-rank_params.get(op.param("layer"), 0) // zero_share))
    return sizes


def _op_rules(graph: Graph, cfg: ParallelConfig, stage_of: dict[int, int]) -> dict[str, Rule]:
    layouts: dict[str, str] = {}
    rules: dict[str, Rule] = {}
    t = require_transformer(graph, "a parallel configuration")
    share = experts.busiest_share(t.expert_load, cfg.ep)
    load = (share.numerator, share.denominator)
    for op in graph.ops:
        if op.kind == OpKind.INPUT:
            layouts[op.name] = "R"
            continue
        stage = stage_of[op.param("layer")]
        tp = cfg.tp_of(stage)
        rule = rule_for(op, layouts, tp, cfg.sp, cfg.ep, cfg.etp_of(stage) if t.is_moe else 1, load)
        if op.kind == OpKind.RESHAPE and op.param("what") in _MOE_RESHAPES:
            rule = Rule(rule.split, tuple("D" if w == "E" else w for w in rule.want),
                        "D" if rule.out == "E" else rule.out, scale=tp)
        rules[op.name] = rule
        layouts[op.name] = rule.out
    return rules


def prepare_graph(graph: Graph, cfg: ParallelConfig) -> Graph:
    """``graph`` rebuilt (when needed) for one micro-batch of ``cfg`` with its recomputation."""
    t = require_transformer(graph, "a parallel configuration")
    key = ("prepared", cfg.micro_batch, cfg.recompute if t.training else t.recompute, cfg.cp)
    return graph_cached(graph, key, lambda: _prepare(graph, t, cfg))


def _prepare(graph: Graph, t, cfg: ParallelConfig) -> Graph:
    from marssim.workload.llm import build_transformer
    from marssim.workload.llm.config import with_overrides

    # a graph prepared before is prepared again from the workload as written (its sequence not cut
    # twice by context parallelism), and is that workload's own graph while it lives
    base = graph.meta.get("unprepared", t)
    changes = {}
    if base.batch != cfg.micro_batch:
        changes["batch"] = cfg.micro_batch
    if base.training and base.recompute != cfg.recompute:
        changes["recompute"] = cfg.recompute
    if cfg.cp > 1:  # a context-parallel rank's tokens (the attention core's ring gives it every key)
        changes["seq"] = base.seq // cfg.cp
    source = graph if base is t else _source(graph)
    if not changes and source is not None:
        return source
    try:
        rebuilt = with_overrides(base, **changes)
    except InputError as err:
        raise InputError(graph.spec, problems=err.problems) from None
    out = build_transformer(rebuilt, spec=graph.spec)
    out.meta["unprepared"] = base
    if source is not None:
        ref = weakref.ref(source)
        graph_cached(out, "prepared from", lambda: ref)
    if cfg.cp > 1:  # the model FLOPs of the whole sequence (attention is quadratic in it)
        from marssim.workload.llm.footprint import footprint

        out.meta["unsplit_footprint"] = footprint(prepare_graph(graph, cfg.with_(cp=1)))
    return out


def _source(graph: Graph) -> Graph | None:
    """The graph a prepared ``graph`` was prepared from, while it lives."""
    ref = graph_cached(graph, "prepared from", lambda: None)
    return ref() if ref is not None else None


def shard_weights(op: Op, rule: Rule, tp: int) -> int:
    """Elements of ``op``'s weights one rank holds under ``rule`` with ``tp`` tensor-parallel
    ranks (a vocabulary-parallel embedding padded to ``tp`` equal parts)."""
    sizes = {}
    for loop, num, den in rule.split:
        if op.has_dim(loop) and den > 1 and loop in ("N", "K", "B", "C"):
            sizes[loop] = max(1, -(-op.dim(loop) * num // den))
    if op.kind == OpKind.EMBEDDING and rule.out == "P":  # vocabulary-parallel: padded to tp equal parts
        return -(-op.param("vocab") // tp) * op.dim("C")
    part = op.with_loops(**sizes) if sizes else op
    return part.weight_elems
