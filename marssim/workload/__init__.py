"""Workloads: ops with exact shapes, DAGs of them, the built-in zoo and ONNX import."""

from .builder import GraphBuilder, T
from .graph import Graph, merge_graphs
from .op import DTYPE_BYTES, GEMM_LIKE, Op, OpKind, dtype_bytes
from .registry import format_spec, is_onnx_spec, load_workload, parse_spec, register, spec_mode, zoo_entries

__all__ = [
    "GraphBuilder", "T", "Graph", "merge_graphs", "DTYPE_BYTES", "GEMM_LIKE", "Op", "OpKind", "dtype_bytes",
    "format_spec", "is_onnx_spec", "load_workload", "parse_spec", "register", "spec_mode",
    "zoo_entries",
]
