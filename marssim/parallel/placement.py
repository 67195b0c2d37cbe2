"""Where each rank of a parallel configuration runs, and who talks to whom.

Ranks are numbered along ``order`` (innermost first): with ``tp-pp-dp`` rank
``r = tp_rank + tp * (pp_rank + pp * dp_rank)`` and rank ``r`` runs on the system's ``r``-th
accelerator, so the tensor-parallel ranks of a group sit on consecutive GPUs (one node when
``tp <= 8``), the stages of a pipeline next, the data-parallel replicas outermost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marssim.system import System

from .config import ParallelConfig

__all__ = ["Placement", "place"]


@dataclass(frozen=True)
class Placement:
    """``grid[dp, pp, tp]``: the node index of each rank's GPU; ``coords``: node index ->
    ``(dp, pp, tp)``."""

    cfg: ParallelConfig
    grid: np.ndarray
    coords: dict[int, tuple[int, int, int]]

    @property
    def gpus(self) -> list[int]:
        return sorted(self.coords)

    def at(self, dp: int, pp: int, tp: int) -> int:
        return int(self.grid[dp, pp, tp])

    def stage(self, gpu: int) -> int:
        return self.coords[gpu][1]

    def patterns(self) -> dict[str, "callable"]:
        """The communication patterns of the configuration, each a map GPU -> peer GPU (or None):
        ring neighbours of the tensor-, data- and expert-data-parallel groups, the next and
        previous pipeline stage, the expert-parallel all-to-all partners."""
        cfg = self.cfg
        T, P, D, E = cfg.tp, cfg.pp, cfg.dp, cfg.ep
        c = self.coords
        out: dict[str, object] = {}
        if T > 1:
            out["tp+1"] = lambda g: self.at(c[g][0], c[g][1], (c[g][2] + 1) % T)
        if D > 1:
            out["dp+1"] = lambda g: self.at((c[g][0] + 1) % D, c[g][1], c[g][2])
        if P > 1:
            out["pp+1"] = lambda g: self.at(c[g][0], (c[g][1] + 1) % P, c[g][2])
            out["pp-1"] = lambda g: self.at(c[g][0], (c[g][1] - 1) % P, c[g][2])
        if E > 1:
            for k in range(1, E):
                out[f"ep+{k}"] = (lambda k: lambda g: self.at((c[g][0] // E) * E + (c[g][0] % E + k) % E,
                                                              c[g][1], c[g][2]))(k)
            if D // E > 1:
                out["edp+1"] = lambda g: self.at((c[g][0] + E) % D, c[g][1], c[g][2])
        return out  # type: ignore[return-value]


def place(system: System, cfg: ParallelConfig) -> Placement:
    """The placement of ``cfg`` on the first ``tp * pp * dp`` accelerators of ``system``."""
    nodes = [system.node_index[a] for a in system.accelerator_ids][: cfg.gpus]
    sizes = {"tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp}
    axes = cfg.order.split("-")
    grid = np.zeros((cfg.dp, cfg.pp, cfg.tp), dtype=np.int64)
    coords: dict[int, tuple[int, int, int]] = {}
    for rank, node in enumerate(nodes):
        r = rank
        pos = {}
        for axis in axes:
            pos[axis] = r % sizes[axis]
            r //= sizes[axis]
        grid[pos["dp"], pos["pp"], pos["tp"]] = node
        coords[node] = (pos["dp"], pos["pp"], pos["tp"])
    return Placement(cfg, grid, coords)
