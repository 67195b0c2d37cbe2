"""Searching the mapping space: the genome encoding, the MARS two-level genetic algorithm and
baselines, with candidate evaluation on any ``concurrent.futures.Executor``."""

from .space import Genome, MappingSpace

__all__ = ["Genome", "MappingSpace"]
