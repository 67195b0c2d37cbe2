"""Mappings: accelerator sets and their designs, op -> set (pipeline stages), sharding per op,
micro-batches; the legal shardings of each op kind and the collectives they imply."""

from marssim.collectives.schedules import choose_algorithm, estimate_schedule, schedule
from .io import load_mapping, mapping_from_dict, mapping_to_dict, save_mapping
from .model import ALGORITHMS, AcceleratorSet, Mapping, mapping_problems, validate_mapping
from .sharding import COMMUNICATION, STRATEGIES, legal_strategies, shard_regions, split_dim, split_sizes

__all__ = [
    "choose_algorithm", "estimate_schedule", "schedule", "load_mapping", "mapping_from_dict", "mapping_to_dict",
    "save_mapping", "ALGORITHMS", "AcceleratorSet", "Mapping", "mapping_problems", "validate_mapping",
    "COMMUNICATION", "STRATEGIES", "legal_strategies", "shard_regions", "split_dim", "split_sizes",
]
