"""The one place where a schedule's bytes and energy are added up.

* :func:`resource_bytes`: bytes each bandwidth resource of the System carries (link directions,
  switch backplanes, memory ports): every transfer's bytes on every resource of its route, plus
  flows outside the TaskGraph (spills).
* :func:`node_compute_energy`: compute energy per node, with whether any of its tasks had an
  energy figure; :func:`compute_energy` sums it over the accelerators.
* :func:`transfer_energy`: each transfer's communication energy, its bytes times the energy per
  byte of the links it crosses; :func:`communication_energy` sums it.

Neither depends on the schedule (only on what the TaskGraph holds), so simulation and estimate
report the same numbers. Units: bytes, joules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from marssim.system import Route, System
from marssim.taskgraph import COMPUTE, TaskGraph, column_chunks, unbuilt_program

__all__ = ["route_incidence", "resource_bytes", "node_busy", "node_compute_energy", "compute_energy", "transfer_energy",
           "communication_energy", "route_energy_per_byte"]


def route_incidence(routes: Sequence[Route]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (resource, route) incidence of ``routes`` as flat arrays: route ``res_route[i]``
    crosses resource ``res_idx[i]``, standing there for ``res_weight[i]`` flows (1 but for the
    folded routes of :mod:`marssim.parallel.fold`)."""
    res_idx: list[int] = []
    res_route: list[int] = []
    res_weight: list[float] = []
    for r, route in enumerate(routes):
        res_idx.extend(route.resources)
        res_route.extend([r] * len(route.resources))
        res_weight.extend(route.weights or (1.0,) * len(route.resources))
    return (np.asarray(res_idx, dtype=np.int64), np.asarray(res_route, dtype=np.int64),
            np.asarray(res_weight, dtype=np.float64))


def resource_bytes(taskgraph: TaskGraph, system: System, *,
                   incidence: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                   extra: Iterable[tuple[Route, float]] = ()) -> np.ndarray:
    """Bytes every bandwidth resource of ``system`` carries: the TaskGraph's transfers over their
    routes, and ``extra`` flows ``(route, bytes)`` that are not tasks (a simulation's spills).
    ``incidence``: :func:`route_incidence` of ``taskgraph.routes`` when the caller has it."""
    tg = taskgraph
    out = np.zeros(len(system.resource_names))
    if tg.routes:
        res_idx, res_route, res_weight = incidence if incidence is not None else route_incidence(tg.routes)
        if len(res_idx):
            # bytes per route, added task after task (whole columns, runs of them or a program's
            # rows: the same sums)
            program = unbuilt_program(tg, ("kind", "route", "nbytes"))
            if program is not None:
                rows = program.rows
                moving = rows["kind"] != COMPUTE
                moved = bool((moving & program.used_rows).any())
                route = rows["route"].astype(np.int64)
                route = np.where(route < 0, route + len(tg.routes), route)  # as np.add.at reads -1
                route_bytes = program.row_sums(np.where(moving, route, -1), rows["nbytes"], len(tg.routes))
            else:
                route_bytes = np.zeros(len(tg.routes))
                moved = False
                for c in column_chunks(tg, ("kind", "route", "nbytes")):
                    moving = c["kind"] != COMPUTE
                    if moving.any():
                        moved = True
                        np.add.at(route_bytes, c["route"][moving], c["nbytes"][moving])
            if moved:
                np.add.at(out, res_idx, route_bytes[res_route] * res_weight)
    for route, nbytes in extra:
        if route.resources:
            out[list(route.resources)] += nbytes
    return out


def node_busy(taskgraph: TaskGraph) -> np.ndarray:
    """Per node index: seconds of its compute tasks, added task after task."""
    tg = taskgraph
    program = unbuilt_program(tg, ("kind", "device", "duration"))
    if program is not None:
        rows = program.rows
        return program.row_sums(np.where(rows["kind"] == COMPUTE, rows["device"], -1), rows["duration"],
                                len(tg.node_names))
    busy = np.zeros(len(tg.node_names))
    for c in column_chunks(tg, ("kind", "device", "duration")):
        compute = c["kind"] == COMPUTE
        np.add.at(busy, c["device"][compute], c["duration"][compute])
    return busy


def node_compute_energy(taskgraph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per node index: joules of its compute tasks (unknown ones counted 0) and whether any of
    them had an energy figure."""
    tg = taskgraph
    n = len(tg.node_names)
    program = unbuilt_program(tg, ("kind", "energy", "device"))
    if program is not None:
        rows = program.rows
        compute = rows["kind"] == COMPUTE
        energy = program.row_sums(np.where(compute, rows["device"], -1), np.nan_to_num(rows["energy"]), n)
        known = np.zeros(n, dtype=bool)
        known[rows["device"][compute & program.used_rows & ~np.isnan(rows["energy"])]] = True
        return energy, known
    energy = np.zeros(n)
    known = np.zeros(n, dtype=bool)
    for c in column_chunks(tg, ("kind", "energy", "device")):  # added task after task
        is_compute = c["kind"] == COMPUTE
        e = c["energy"][is_compute]
        device = c["device"][is_compute]
        np.add.at(energy, device, np.nan_to_num(e))
        known[device[~np.isnan(e)]] = True
    return energy, known


def compute_energy(taskgraph: TaskGraph, system: System) -> float:
    """Joules of the compute tasks on the system's accelerators: per device, then summed over
    the devices that have an energy figure; NaN when none has."""
    energy, known = node_compute_energy(taskgraph)
    idx = [system.node_index[acc.id] for acc in system.accelerators]
    values = [float(energy[i]) for i in idx if known[i]]
    return float(sum(values)) if values else float("nan")


def route_energy_per_byte(routes: Sequence[Route], system: System) -> np.ndarray:
    """Joules per byte of each route (the sum over the links it crosses), with a trailing 0 for
    "no route" (index -1)."""
    e = system.resource_energy_per_byte
    return np.asarray([float(e[list(r.resources)].sum()) if r.resources else 0.0 for r in routes] + [0.0])


def transfer_energy(taskgraph: TaskGraph, system: System) -> np.ndarray:
    """Joules of communication per task (0 for compute tasks; NaN everywhere when no link of the
    system has an energy figure)."""
    tg = taskgraph
    if not system.has_link_energy:
        return np.full(tg.n_tasks, np.nan)
    per_byte = route_energy_per_byte(tg.routes, system)
    return np.where(tg.kind != COMPUTE, tg.nbytes * per_byte[tg.route], 0.0)


def communication_energy(taskgraph: TaskGraph, system: System) -> float:
    """Joules of all transfers (NaN when no link has an energy figure)."""
    if not system.has_link_energy:
        return float("nan")
    return float(transfer_energy(taskgraph, system).sum())
