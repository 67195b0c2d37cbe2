"""A workload: a DAG of :class:`Op` in topological order, with totals and layer segments."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING


from .op import GEMM_LIKE, Op, OpKind

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Graph", "merge_graphs"]


class Graph:
    """An immutable DAG of ops. ``ops`` are in topological order; edges come from ``Op.inputs``.

    ``batch`` is the number of samples the graph processes; ``spec`` is the zoo/ONNX string it was
    built from (recorded in mapping files so they can be re-evaluated alone).
    """

    def __init__(self, name: str, ops: Sequence[Op], *, batch: int, spec: str = "", meta: dict | None = None) -> None:
        self.name = name
        self.batch = batch
        self.spec = spec or name
        self.meta: dict = dict(meta or {})
        """What the builder knows beyond the ops (an LLM's :class:`~marssim.workload.llm.TransformerConfig`,
        read through :func:`marssim.workload.llm.transformer_of` alone)."""
        self.ops: tuple[Op, ...] = _topological(ops)
        self.index: dict[str, int] = {op.name: i for i, op in enumerate(self.ops)}
        preds: list[tuple[int, ...]] = []
        succs: list[list[int]] = [[] for _ in self.ops]
        for i, op in enumerate(self.ops):
            p = tuple(self.index[name] for name in op.inputs)
            preds.append(p)
            for j in p:
                succs[j].append(i)
        self.preds: tuple[tuple[int, ...], ...] = tuple(preds)
        self.succs: tuple[tuple[int, ...], ...] = tuple(tuple(s) for s in succs)

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    def op(self, name: str) -> Op:
        """The op called ``name`` (KeyError if none)."""
        return self.ops[self.index[name]]

    @cached_property
    def models(self) -> tuple[str, ...]:
        """Model names in order of first appearance."""
        return tuple(dict.fromkeys(op.model for op in self.ops))

    @cached_property
    def compute_ops(self) -> tuple[int, ...]:
        """Indices of the ops that run on accelerators (all but graph inputs)."""
        return tuple(i for i, op in enumerate(self.ops) if op.kind != OpKind.INPUT)

    @cached_property
    def outputs(self) -> tuple[int, ...]:
        """Indices of ops whose results leave the graph (no consumers; ops marked ``keep``, like
        a KV-cache write, keep theirs on the device)."""
        return tuple(i for i in self.compute_ops if not self.succs[i] and not self.ops[i].param("keep"))

    @cached_property
    def training(self) -> bool:
        """True for a training step (the graph holds backward ops)."""
        return any(op.param("phase") == "bwd" for op in self.ops)

    @property
    def parameters(self) -> int:
        """Learned parameters of the model: weight elements of forward ops that own them
        (backward and recomputed ops read the forward weights; optimizer state is not a
        parameter)."""
        return sum(op.weight_elems for op in self.ops
                   if op.param("phase", "fwd") == "fwd" and not op.param("shares"))

    def to_networkx(self) -> nx.DiGraph:
        """The graph as a networkx DiGraph with the :class:`Op` under node attribute ``op``."""
        import networkx as nx

        g = nx.DiGraph()
        for op in self.ops:
            g.add_node(op.name, op=op)
        for op in self.ops:
            for src in op.inputs:
                g.add_edge(src, op.name)
        return g

    # ------------------------------------------------------------------ totals
    @property
    def macs(self) -> int:
        """Multiply-accumulates of the GEMM-like ops (conv, gemm, matmul)."""
        return sum(op.macs for op in self.ops)

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    @property
    def weight_bytes(self) -> int:
        return sum(op.weight_bytes for op in self.ops)

    def count(self, kind: OpKind | str) -> int:
        """Number of ops of a kind."""
        k = OpKind(kind)
        return sum(1 for op in self.ops if op.kind == k)

    @cached_property
    def layers(self) -> tuple[tuple[int, ...], ...]:
        """Layer segments: each GEMM-like op with the non-GEMM ops that follow it in order.

        Non-GEMM ops before the first GEMM-like op of a model start their own segment. Segments
        never span two models. Pipeline stages are runs of consecutive layers.
        """
        out: list[list[int]] = []
        previous_model = None
        for i in self.compute_ops:
            op = self.ops[i]
            if not out or op.kind in GEMM_LIKE or op.model != previous_model:
                out.append([i])
            else:
                out[-1].append(i)
            previous_model = op.model
        return tuple(tuple(seg) for seg in out)

    def summary(self):
        """A pandas DataFrame, one row per op: kind, model, loops, MACs, FLOPs and bytes."""
        import pandas as pd

        rows = []
        for op in self.ops:
            rows.append({
                "op": op.name, "kind": op.kind.value, "model": op.model,
                "loops": " ".join(f"{k}={v}" for k, v in op.loops),
                "macs": op.macs, "flops": op.flops, "weight_bytes": op.weight_bytes,
                "input_bytes": op.input_bytes, "output_bytes": op.output_bytes,
            })
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, batch={self.batch}, ops={len(self.ops)}, GMACs={self.macs / 1e9:.4g})"


def _topological(ops: Sequence[Op]) -> tuple[Op, ...]:
    names: dict[str, Op] = {}
    for op in ops:
        if op.name in names:
            raise ValueError(f"duplicate op name {op.name!r}")
        names[op.name] = op
    for op in ops:
        for src in op.inputs:
            if src not in names:
                raise ValueError(f"op {op.name!r} reads {src!r}, which is not an op of the graph")
    # Keep the given order when it is already topological (the common case): cheap check first.
    seen: set[str] = set()
    ordered = True
    for op in ops:
        if any(src not in seen for src in op.inputs):
            ordered = False
            break
        seen.add(op.name)
    if ordered:
        return tuple(ops)
    import networkx as nx

    g = nx.DiGraph()
    position = {op.name: i for i, op in enumerate(ops)}
    g.add_nodes_from(position)
    for op in ops:
        for src in op.inputs:
            g.add_edge(src, op.name)
    try:
        order = list(nx.lexicographical_topological_sort(g, key=position.__getitem__))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(g)
        raise ValueError(f"the graph has a cycle through {' -> '.join(u for u, _ in cycle)}") from None
    return tuple(names[n] for n in order)


def merge_graphs(name: str, graphs: Iterable[Graph], *, spec: str = "") -> Graph:
    """Several models run at once: ops renamed ``model/op``, each op tagged with its model."""
    ops: list[Op] = []
    batch = 0
    for g in graphs:
        prefix = g.name
        for op in g.ops:
            ops.append(replace(op, name=f"{prefix}/{op.name}", inputs=tuple(f"{prefix}/{s}" for s in op.inputs),
                               model=prefix))
        batch = max(batch, g.batch)
    return Graph(name, ops, batch=batch, spec=spec or name)
