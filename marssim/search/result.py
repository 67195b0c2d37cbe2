"""What a search returns: the best mapping, its simulated evaluation, and the history."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from marssim.mapping import Mapping

from .evaluate import Evaluation

__all__ = ["SearchResult", "SearchInterrupted"]


@dataclass
class SearchResult:
    """The outcome of one search.

    ``best`` is valid for the searched graph and system; ``evaluation`` is its *simulated*
    evaluation (never an estimate). ``history`` has one row per generation (or batch):
    ``generation``, ``best_fitness``, ``best_makespan_s``, ``mean_fitness``, ``simulations``,
    ``estimates``, ``wall_s``. ``simulations``/``estimates`` count distinct candidates run."""

    algorithm: str
    objective: str
    best: Mapping
    evaluation: Evaluation
    history: pd.DataFrame
    simulations: int
    estimates: int
    wall_s: float
    seed: int = 0
    notes: dict = field(default_factory=dict)

    @property
    def fitness(self) -> float:
        return self.evaluation.fitness(self.objective)

    @property
    def makespan(self) -> float:
        return self.evaluation.makespan

    def summary(self) -> str:
        e = self.evaluation
        text = (f"{self.algorithm}: makespan {e.makespan * 1e3:.4f} ms, throughput {e.throughput:.4g} samples/s, "
                f"{len(self.best.sets)} sets, {self.best.n_stages} stages, {self.best.micro_batches} micro-batches; "
                f"{self.simulations} simulations, {self.estimates} estimates in {self.wall_s:.1f} s")
        if e.energy == e.energy:
            text += f"; energy {e.energy * 1e3:.4g} mJ"
        return text


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search that had found a mapping: ``result`` is the best one so far (its
    evaluation simulated, ``notes["interrupted"]`` True), for the caller to keep before exiting."""

    def __init__(self, result: SearchResult) -> None:
        super().__init__(f"interrupted: best so far {result.makespan * 1e3:.4f} ms")
        self.result = result
