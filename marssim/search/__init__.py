"""Searching the mapping space: the genome encoding, the MARS two-level genetic algorithm and
baselines, with candidate evaluation on any ``concurrent.futures.Executor``."""

from .baselines import count_space, data_parallel, exhaustive, h2h, random_search
from .evaluate import (OBJECTIVES, DeploymentEvaluation, Evaluation, Evaluator, MappingEvaluation, ParallelEvaluation,
                       Problem)
from .ga import GAConfig, mars
from .result import SearchResult
from .runner import ALGORITHMS, SearchSettings, compare, run_algorithm
from .space import Genome, MappingSpace

__all__ = ["Genome", "MappingSpace", "GAConfig", "mars", "data_parallel", "h2h", "random_search", "exhaustive",
           "count_space", "OBJECTIVES", "Evaluation", "MappingEvaluation",
           "ParallelEvaluation", "DeploymentEvaluation", "Evaluator", "Problem", "SearchResult", "ALGORITHMS",
           "SearchSettings", "compare", "run_algorithm"]
