"""Megatron-LM-style parallelism of LLM workloads on GPU clusters: tensor, sequence, pipeline,
data and expert parallelism as a configuration (:mod:`.config`), where ranks run
(:mod:`.placement`), how each op splits (:mod:`.roles`), pipeline schedules (:mod:`.schedule`),
exact symmetry folding (:mod:`.fold`), the lowering to a TaskGraph (:mod:`.lower`), ZeRO-3 as
DeepSpeed runs it (:mod:`.zero3`), memory per GPU (:mod:`.memory`) and the run report
(:mod:`.report`)."""

from .config import ORDERS, SCHEDULES, ParallelConfig, check_parallel, parallel_problems, parse_parallel
from .lower import lower_parallel
from .memory import MemoryEstimate, check_memory, memory_estimate
from .partition import chunk_layers, prepare_graph
from .report import ParallelReport, parallel_report, report_of

__all__ = ["ParallelConfig", "SCHEDULES", "ORDERS", "parse_parallel", "parallel_problems", "check_parallel",
           "lower_parallel", "chunk_layers", "prepare_graph", "MemoryEstimate", "memory_estimate",
           "check_memory", "ParallelReport", "parallel_report", "report_of"]
