"""The plan level: what runs where, whatever kind of plan it is, and the one path that evaluates
it. A plan is a per-op :class:`~marssim.mapping.Mapping` or a
:class:`~marssim.parallel.ParallelConfig` (:mod:`.model`); plan files hold either (:mod:`.io`);
:func:`run` checks, lowers, simulates or estimates and reports any plan (:mod:`.run`)."""

from .io import example_plans, load_plan, plan_to_dict, resolve_plan_file, save_plan
from .model import Plan, bind_parallel, graph_for, is_llm, plan_key, plan_text, workload_sets_batch
from .run import HOW, Run, lower_plan, run, trace_gpus

__all__ = ["Plan", "bind_parallel", "graph_for", "is_llm", "plan_key", "plan_text", "workload_sets_batch",
           "example_plans", "load_plan", "plan_to_dict", "resolve_plan_file", "save_plan",
           "HOW", "Run", "lower_plan", "run", "trace_gpus"]
