"""Where each rank of a parallel configuration runs, and who talks to whom.

Ranks are numbered along ``order`` (innermost first): with ``tp-pp-dp`` rank
``r = tp_rank + tp * (pp_rank + pp * dp_rank)`` and rank ``r`` runs on the system's ``r``-th
accelerator, so the tensor-parallel ranks of a group sit on consecutive GPUs (one node when
``tp <= 8``), the stages of a pipeline next, the data-parallel replicas outermost. With
per-stage tensor parallelism (``stage_tp``) or a chosen placement (``stage_start``) each stage
runs on a block of consecutive GPUs, its tensor-parallel ranks innermost.

Context parallelism (``cp``) splits each data-parallel replica into ``cp`` ranks: the
data-parallel coordinate runs over ``dp x cp`` ranks, the context-parallel ones innermost
(``dp_rank * cp + cp_rank``), so the gradient reduction and the distributed optimizer's group
(``dp+1``) spans ``dp x cp`` ranks, as Megatron-LM's ``data_parallel_group_with_cp`` does, and
with ``order=tp-dp-pp`` a context-parallel group sits ``tp`` GPUs apart (Megatron-LM's default
``tp-cp-ep-dp-pp`` has it so).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from marssim.system import System

from .config import ParallelConfig
from .memo import OwnerMemo
from .patterns import CP_RING, DP_RING, EDP_RING, ETP_RING, PULL_NEXT, PULL_PREV, TP_RING, Pattern, ep_peer

__all__ = ["Placement", "place", "default_order", "direct_patterns", "expert_index", "expert_group_of"]


def direct_patterns(patterns) -> tuple[str, ...]:
    """The patterns whose transfers are an all-to-all's direct sends (each pair on its own route,
    not steps of a ring): the expert-parallel partners ``ep+k``."""
    return tuple(name for name in patterns if Pattern(name).group == "ep")


@dataclass(frozen=True)
class Placement:
    """``ranks[(dp, pp, tp)]``: the node index of each rank's GPU; ``coords``: node index ->
    ``(dp, pp, tp)`` (``dp`` counts ``dp x cp`` ranks, the context-parallel ones innermost)."""

    cfg: ParallelConfig
    ranks: dict[tuple[int, int, int], int]
    coords: dict[int, tuple[int, int, int]]

    @property
    def gpus(self) -> list[int]:
        return sorted(self.coords)

    def at(self, dp: int, pp: int, tp: int) -> int:
        return self.ranks[(dp, pp, tp)]

    def stage(self, gpu: int) -> int:
        return self.coords[gpu][1]

    def on_stage(self, gpu: int, stage: int) -> int:
        """The GPU of ``stage`` that ``gpu`` exchanges activations with: same data-parallel
        replica, the tensor-parallel rank modulo the stage's degree."""
        dp, _, tp = self.coords[gpu]
        return self.ranks[(dp, stage, tp % self.cfg.tp_of(stage))]

    def patterns(self) -> dict[str, "callable"]:
        """The communication patterns of the configuration, each a map GPU -> peer GPU (or None):
        ring neighbours of the tensor-, context-, data- and expert-data-parallel groups, of the
        expert-tensor-parallel group where it is smaller than the tensor-parallel one (``etp+1``)
        and of the ranks holding the same experts (``xdp+1``), and the expert-parallel
        all-to-all partners (each GPU sends to its peer; the expert groups in Megatron-LM's expert
        order: along a stage's ranks, tensor-parallel innermost, ``etp`` then ``ep`` then expert
        data parallelism), and the GPUs of the
        next and previous pipeline stage a GPU receives activations and gradients from
        (:data:`PULLS`: each GPU receives from its peer)."""
        hit = self.__dict__.get("_patterns")
        if hit is not None:
            return hit
        out = self._patterns()
        object.__setattr__(self, "_patterns", out)  # memoised: the maps are pure functions of the placement
        return out

    def _patterns(self) -> dict[str, "callable"]:
        cfg = self.cfg
        P, D, E, C = cfg.pp, cfg.dp_cp, cfg.ep, cfg.cp
        c = self.coords
        out: dict[str, object] = {}
        if any(cfg.tp_of(s) > 1 for s in range(P)):
            out[TP_RING] = lambda g: self.at(c[g][0], c[g][1], (c[g][2] + 1) % cfg.tp_of(c[g][1]))
        if D > 1:
            out[DP_RING] = lambda g: self.at((c[g][0] + 1) % D, c[g][1], c[g][2])
        if C > 1:  # the context-parallel ring: the innermost part of the data-parallel coordinate
            out[CP_RING] = lambda g: self.at((c[g][0] // C) * C + (c[g][0] % C + 1) % C, c[g][1], c[g][2])
        if P > 1:  # pulled: a stage's GPU receives from the GPU of the other stage that on_stage names
            out[PULL_NEXT] = lambda g: self.on_stage(g, (c[g][1] + 1) % P)
            out[PULL_PREV] = lambda g: self.on_stage(g, (c[g][1] - 1) % P)
        if any(1 < cfg.etp_of(s) < cfg.tp_of(s) for s in range(P)):
            def etp_next(g):  # the expert-tensor-parallel ring: etp consecutive tensor-parallel ranks
                e = cfg.etp_of(c[g][1])
                return self.at(c[g][0], c[g][1], (c[g][2] // e) * e + (c[g][2] % e + 1) % e)

            out[ETP_RING] = etp_next

        def expert_rank(g) -> tuple[int, int, int, int]:
            """(stage, tp, etp, f), ``f`` the GPU's :func:`expert_index`."""
            dp, s, t = c[g]
            return s, cfg.tp_of(s), cfg.etp_of(s), expert_index(cfg, dp, s, t)

        def at_expert_rank(s: int, tp: int, f: int) -> int:
            dp, t = divmod(f, tp)
            return self.at(dp, s, t)

        if any(cfg.tp_of(s) > cfg.etp_of(s) for s in range(P)):
            def copies_next(g):  # the ranks holding the same experts' weights: etp x ep apart
                s, tp, e, f = expert_rank(g)
                return at_expert_rank(s, tp, (f + e * E) % (tp * D))

            out["xdp+1"] = copies_next
        if E > 1:
            def peer_at(k: int):
                def peer(g):
                    s, tp, e, f = expert_rank(g)
                    p = (f // e) % E
                    return at_expert_rank(s, tp, f + e * ((p + k) % E - p))
                return peer

            for k in range(1, E):
                out[ep_peer(k)] = peer_at(k)
            if D % E == 0 and D // E > 1:  # where tp = etp: the replicas of the data-parallel coordinate
                out[EDP_RING] = lambda g: self.at((c[g][0] + E) % D, c[g][1], c[g][2])
        return out  # type: ignore[return-value]


def expert_index(cfg: ParallelConfig, dp: int, stage: int, tp_rank: int) -> int:
    """A rank's place along its stage's ``tp x dp x cp`` ranks (``dp`` counts ``dp x cp``),
    tensor-parallel innermost: the line on which Megatron-LM lays out ``etp`` expert-tensor-parallel
    ranks, then ``ep`` expert-parallel ones, then the expert data parallelism."""
    return tp_rank + cfg.tp_of(stage) * dp


def expert_group_of(cfg: ParallelConfig, dp: int, stage: int, tp_rank: int) -> tuple[int, int, int]:
    """The expert-parallel group of a rank, as a key its members share: the stage, the rank's
    expert-tensor-parallel place and its expert-data-parallel replica (:func:`expert_index`)."""
    f, etp = expert_index(cfg, dp, stage, tp_rank), cfg.etp_of(stage)
    return stage, f % etp, f // (etp * cfg.ep)


LAYOUTS = OwnerMemo(default_size=8)
"""Per system (while it lives), its most recently used rank layouts (a search's configurations
share a few; screens may run in threads)."""


def place(system: System, cfg: ParallelConfig) -> Placement:
    """The placement of ``cfg`` on the system's accelerators (see the module docstring and
    ``ParallelConfig.stage_start``). The rank layout is memoised per system by what it depends
    on (the stages' blocks, tensor-parallel degrees, ``dp x cp``, ``order``)."""
    blocked = bool(cfg.stage_start or (cfg.stage_tp and not cfg.uniform))
    key = (blocked, cfg.stage_start if blocked else (), tuple(cfg.tp_of(s) for s in range(cfg.pp)), cfg.pp,
           cfg.dp_cp, cfg.order, cfg.gpus)
    ranks, coords = LAYOUTS.get_or_make(system, ("layout", key), lambda: _layout(system, cfg, blocked))
    return Placement(cfg, ranks, coords)


MEGATRON_ORDER = "tp-dp-pp"
"""Megatron-LM's rank order (``tp-cp-ep-dp-pp``): a pipeline's stages outermost."""


def default_order(system: System, cfg: ParallelConfig) -> str:
    """The rank order of ``cfg`` on ``system`` when the configuration names none.

    ``cfg.order`` (``tp-pp-dp``: a pipeline's stages inside a data-parallel replica), except where
    Megatron-LM's own order ``tp-dp-pp`` (``tp-cp-ep-dp-pp``) keeps a group inside one scale-up
    domain (a DGX server's NVLink, or one rack of GB200 NVL72) and ``tp-pp-dp`` does not:

    * the expert-parallel groups (``ep > 1``): their all-to-alls move every routed token twice a
      layer and direction, so Megatron-LM puts the expert ranks innermost after tensor and context
      parallelism; with ``tp-pp-dp`` and ``pp > 1`` they would sit ``tp x pp`` GPUs apart, on the
      network (Qwen3-235B-A22B on 256 B300 with pp 8 and ep 8: the estimate 2.3x slower);
    * on a rack-scale NVLink domain -- one scale-up fabric across several hosts, as GB200 NVL72's
      72 GPUs -- the data-parallel groups: the gradient rings then run on NVLink and only the
      pipeline's activations cross the network between domains, as a framework places ranks on
      that machine. On servers of eight GPUs any order sends data-parallel rings between nodes."""
    if cfg.pp == 1 or cfg.dp_cp == 1 or cfg.stage_start or not cfg.uniform:
        return cfg.order
    accelerators = system.accelerator_ids[: cfg.gpus]
    where = [system.cluster_node(a) for a in accelerators]
    if any(w is None for w in where):
        return cfg.order
    domain = {system.node_index[a]: node for a, (node, _) in zip(accelerators, where)}
    rack_scale = any(group is not None and group.gpus_per_node > group.per_host for _, group in where)

    def groups_inside(order: str, group_of) -> bool:
        ranks, _ = _layout(system, replace(cfg, order=order), False)
        seen: dict[tuple, int] = {}
        for (dp, pp, tp), node in ranks.items():
            if seen.setdefault(group_of(dp, pp, tp), domain[node]) != domain[node]:
                return False
        return True

    def data_group(dp: int, pp: int, tp: int) -> tuple:
        return pp, tp

    def expert_group(dp: int, pp: int, tp: int) -> tuple:
        return expert_group_of(cfg, dp, pp, tp)

    wanted = ([expert_group] if cfg.ep > 1 else []) + ([data_group] if rack_scale else [])
    for group_of in wanted:
        if not groups_inside(cfg.order, group_of) and groups_inside(MEGATRON_ORDER, group_of):
            return MEGATRON_ORDER
    return cfg.order


def _layout(system: System, cfg: ParallelConfig, blocked: bool) -> tuple[dict, dict]:
    """``(ranks, coords)`` of :func:`place`."""
    nodes = [system.node_index[a] for a in system.accelerator_ids]
    ranks: dict[tuple[int, int, int], int] = {}
    if blocked:
        # each stage a block of tp * dp GPUs: where the configuration puts it, else one after another
        blocks = [cfg.tp_of(stage) * cfg.dp_cp for stage in range(cfg.pp)]
        starts = cfg.stage_start or tuple(itertools.accumulate(blocks, initial=0))[:-1]
        for stage, first in enumerate(starts):
            tp = cfg.tp_of(stage)
            for k in range(tp * cfg.dp_cp):
                ranks[(k // tp, stage, k % tp)] = nodes[first + k]
    else:
        sizes = {"tp": cfg.tp_of(0), "pp": cfg.pp, "dp": cfg.dp_cp}
        axes = cfg.order.split("-")
        for rank, node in enumerate(nodes[: cfg.gpus]):
            r = rank
            pos = {}
            for axis in axes:
                pos[axis] = r % sizes[axis]
                r //= sizes[axis]
            ranks[(pos["dp"], pos["pp"], pos["tp"])] = node
    coords = {node: key for key, node in ranks.items()}
    return ranks, coords
