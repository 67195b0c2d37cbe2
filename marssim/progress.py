"""What a long run tells its caller while it goes: one small frozen record per kind of progress
event, handed to a :data:`Progress` callback. A receiver tells the events apart by their type
(``match event: case SimulationProgress(): ...``), never by the keys of a dict.

* :class:`LoweringProgress`: a parallel configuration's lowering, stage by stage;
* :class:`SimulationProgress`: a simulation, in simulated time and tasks ended;
* :class:`EstimateProgress`: the analytical estimate, pass by pass;
* :class:`GenerationDone`: a search's generation, with its history row;
* :class:`SearchStarted`, :class:`SearchDone`: one search of several compared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = ["LoweringProgress", "SimulationProgress", "EstimateProgress", "GenerationDone", "SearchStarted",
           "SearchDone", "ProgressEvent", "Progress"]


@dataclass(frozen=True)
class LoweringProgress:
    """A parallel configuration's lowering: ``stage`` (``fold``, ``templates``, ``assemble``),
    ``tasks`` lowered so far of the ``total`` the TaskGraph will have."""

    stage: str
    tasks: int
    total: int


@dataclass(frozen=True)
class SimulationProgress:
    """A simulation: ``time_s`` simulated seconds so far, ``tasks_done`` tasks ended of ``tasks``."""

    time_s: float
    tasks_done: int
    tasks: int


@dataclass(frozen=True)
class EstimateProgress:
    """The analytical estimate after one of its passes (``stage``: ``durations``, ``schedule``,
    ``critical_path``, ``bounds``): ``tasks_done`` tasks of ``tasks``."""

    stage: str
    tasks_done: int
    tasks: int


@dataclass(frozen=True)
class GenerationDone:
    """A search's generation finished: its number (from 0), the best fitness so far (the value
    minimised; inf before any feasible plan), distinct simulations and screens run so far, the
    wall seconds since the search began, evaluations (simulations and screens) per wall second;
    ``row``: the generation's whole history row (a search's own columns, e.g. ``best_makespan_s``,
    ``best_gpus``, ``mean_fitness``)."""

    generation: int
    best_fitness: float
    simulations: int
    estimates: int
    wall_s: float
    evaluations_per_s: float
    row: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SearchStarted:
    """One search of several compared begins: its ``algorithm``."""

    algorithm: str


@dataclass(frozen=True)
class SearchDone:
    """One search of several compared ended: its ``algorithm`` and its ``result`` (a
    :class:`~marssim.search.result.SearchResult`)."""

    algorithm: str
    result: Any


ProgressEvent = Union[LoweringProgress, SimulationProgress, EstimateProgress, GenerationDone, SearchStarted,
                      SearchDone]
"""Every progress event."""

Progress = Callable[[ProgressEvent], None]
"""A progress callback."""
