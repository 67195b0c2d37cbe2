"""The plan level: what runs where, whatever kind of plan it is, and the one path that evaluates
it. A plan is a per-op :class:`~marssim.mapping.Mapping`, a
:class:`~marssim.parallel.ParallelConfig` or a serving :class:`~marssim.serve.Deployment`
(:mod:`.model`); plan files hold the first two (:mod:`.io`; a deployment's file is the one
``marssim serve`` reads); :func:`run` checks, lowers, simulates or estimates and reports the
first two, :func:`run_deployment` serves a search's case with a deployment, :func:`serve_stream` and
:func:`serve_rates` a request stream at its rate or at several (:mod:`.run`). The kinds of plan
are told apart in one place, :mod:`.kinds` (:func:`kind_of`: a plan's :class:`KindSpec`); each kind's
evaluation is its own typed record (:mod:`.evaluation`)."""

from .evaluation import DeploymentEvaluation, Evaluation, MappingEvaluation, ParallelEvaluation
from .io import example_plans, load_plan, plan_to_dict, resolve_plan_file, save_plan
from .kinds import KINDS, KindSpec, PlanKind, kind_of
from .model import (Plan, bind_parallel, build_batch, build_recompute, graph_for, is_llm, plan_key, plan_text,
                    workload_sets_batch)
from .run import HOW, Run, lower_plan, run, run_deployment, serve_rates, serve_stream, trace_gpus

__all__ = ["Evaluation", "MappingEvaluation", "ParallelEvaluation", "DeploymentEvaluation",
           "KINDS", "KindSpec", "PlanKind", "kind_of", "Plan", "bind_parallel", "build_batch", "build_recompute",
           "graph_for", "is_llm",
           "plan_key", "plan_text", "workload_sets_batch",
           "example_plans", "load_plan", "plan_to_dict", "resolve_plan_file", "save_plan",
           "HOW", "Run", "lower_plan", "run", "run_deployment", "serve_rates", "serve_stream", "trace_gpus"]
