"""Mixture-of-experts layers under expert tensor parallelism and uneven routing.

* ``etp`` (Megatron-LM's ``--expert-tensor-parallel-size``; by default the tensor-parallel
  degree, as Megatron-LM's): the experts' GEMMs split their weights over ``etp`` ranks of the
  tensor-parallel group, column-parallel (``gate``, ``up``, ``fc1``) then row-parallel
  (``down``, ``fc2``), as the dense MLP over ``tp``. After the all-to-all each rank holds the
  tokens routed to its experts from its expert-parallel peers (layout ``E``); they are
  all-gathered over the ``etp`` group (``X``) before the experts, whose column-parallel GEMMs
  leave features split over it (``Y``) and whose row-parallel GEMMs leave partial sums (``Z``),
  reduce-scattered back to the rank's tokens (``E``) before the return all-to-all. The expert
  ranks are laid out as Megatron-LM's: along a stage's ``tp x dp x cp`` ranks, tensor-parallel
  innermost, first ``etp``, then ``ep``, then the expert data parallelism
  (:meth:`marssim.parallel.placement.Placement.patterns`): with ``etp = tp`` an expert-parallel
  group is ``ep`` data-parallel replicas at one tensor-parallel rank; with ``etp < tp`` it takes
  tensor-parallel ranks first, so ``ep`` may exceed ``dp`` ("parallel folding"). The ranks
  holding the same experts reduce their gradients together (Megatron-LM's expert data-parallel
  group: ``tp x dp x cp / (etp x ep)`` ranks).
* routing imbalance (the workload's ``expert_load``, tokens routed to each expert, relative):
  experts sit on expert-parallel ranks in order (rank ``r`` holds experts ``r E/ep .. (r+1)
  E/ep - 1``, as Megatron-LM places them), so rank ``r`` receives the share ``s_r`` of the routed
  tokens its experts' loads add up to. The all-to-all after the experts waits for the busiest
  rank, so every rank's expert work and every all-to-all is timed at the busiest rank's tokens:
  :func:`busiest_share` ``= ep max_r s_r`` times the uniform ones (1 when routing is uniform; the
  other ranks' idle time at the all-to-all is not told apart from their work).

Units: bytes.
"""

from __future__ import annotations

from fractions import Fraction

from .patterns import DP_RING, EDP_RING, ETP_RING, TP_RING

__all__ = ["busiest_share", "rank_shares", "LAYOUT_SHARE", "layout_fraction", "expert_path", "EXPERT_LAYOUTS",
           "gradient_group", "etp_pattern"]

EXPERT_LAYOUTS = ("D", "E", "X", "Y", "Z")
"""Layouts of routed tokens: ``D`` dispatched (the rank's own tokens, before the all-to-all),
``E`` at their expert's rank, ``X`` gathered over the expert-tensor-parallel group, ``Y`` their
features split over it, ``Z`` partial sums over it."""


def rank_shares(loads: tuple[float, ...], ep: int) -> list[float]:
    """The share of the routed tokens each expert-parallel rank receives (experts in order,
    ``len(loads) / ep`` per rank); uniform when ``loads`` is empty."""
    if not loads:
        return [1.0 / ep] * ep
    per = len(loads) // ep
    total = float(sum(loads))
    return [sum(loads[r * per:(r + 1) * per]) / total for r in range(ep)]


def busiest_share(loads: tuple[float, ...], ep: int) -> Fraction:
    """``ep`` times the busiest expert-parallel rank's share of the routed tokens (>= 1; 1 for
    uniform routing or ``ep = 1``), as a fraction the rules' integer splits take."""
    if ep <= 1 or not loads:
        return Fraction(1)
    share = Fraction(max(rank_shares(loads, ep)) * ep).limit_denominator(10_000)
    return max(share, Fraction(1))


LAYOUT_SHARE = {"D": (1, 0), "E": (1, 1), "Y": (1, 1), "X": (2, 1), "Z": (2, 1)}
"""Per expert layout: whether it holds the ``etp`` group's tokens (2) or the rank's (1), and
whether the busiest rank's share applies (1: tokens at their expert's rank)."""


def layout_fraction(layout: str, tp: int, etp: int, share: Fraction) -> float:
    """The fraction of a tensor's bytes (the graph's uniform capacity) one rank holds in an
    expert ``layout`` (see :data:`EXPERT_LAYOUTS`); ``tp``, ``etp``: the stage's degrees."""
    group, skew = LAYOUT_SHARE[layout]
    return float((etp if group == 2 else 1) * (share if skew else 1)) / tp


def expert_path(have: str, want: str) -> list[str]:
    """The collectives that turn routed tokens in layout ``have`` into ``want``: ``a2a`` (the
    expert-parallel all-to-all, either way), ``ag`` (all-gather over the expert-tensor-parallel
    group), ``rs`` (reduce-scatter over it); an empty list where a rank slices what it holds."""
    out: list[str] = []
    at = have
    if at == "Z":
        out.append("rs")
        at = "E"
    if at == "X" and want != "X":
        at = "E"  # the rank's part of the gathered tokens: a slice
    if at == "D" and want in ("E", "X"):
        out.append("a2a")
        at = "E"
    if at == "E" and want == "X":
        out.append("ag")
    elif at == "E" and want == "D":
        out.append("a2a")
    return out


def gradient_group(cfg, stage: int) -> tuple[str, int]:
    """The placement pattern and size of the ring that reduces a stage's expert gradients: the
    ranks holding the same expert weights, Megatron-LM's expert data-parallel group of
    ``tp x dp x cp / (etp x ep)`` ranks (``xdp+1``, ``etp x ep`` apart along the stage's ranks;
    ``edp+1`` or ``dp+1`` where ``etp = tp``)."""
    tp, etp = cfg.tp_of(stage), cfg.etp_of(stage)
    size = tp * cfg.dp_cp // (etp * cfg.ep)
    if tp > etp:
        return "xdp+1", size
    return (EDP_RING if cfg.ep > 1 else DP_RING), size


def etp_pattern(cfg, stage: int) -> str:
    """The ring pattern of a stage's expert-tensor-parallel group: the tensor-parallel ring when
    the two are one group."""
    return TP_RING if cfg.etp_of(stage) == cfg.tp_of(stage) else ETP_RING
