"""What the verbs that evaluate one plan (``simulate``, ``estimate``) share: the flags that name
the plan, loading it with every check made before any work, running it through
:func:`marssim.plan.run`, and printing and writing what it gives."""

from __future__ import annotations

import argparse
import contextlib
import sys

from marssim.errors import InputError

from ._common import cost_model, positive_int, refuse_llm_off_gpus, refuse_missing_precision, write_outputs

__all__ = ["add_plan_args", "add_report_args", "load_plan_args", "run_plan_verb", "print_report", "needs_tables"]

MAX_STREAMS = 1024
"""The most compute streams per device: each is a process of the simulation, and no accelerator
runs more kernels at once than this (a GPU's hardware queues are a few dozen)."""


def _streams(text: str) -> int:
    value = positive_int(text)
    if value > MAX_STREAMS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_STREAMS} streams per device (each is a process of "
                                         f"the simulation; no accelerator runs more kernels at once), got {value}")
    return value


def add_plan_args(p: argparse.ArgumentParser, *, simulate: bool) -> None:
    """The plan to evaluate: --mapping FILE (or a shipped example's name), or --system and
    --workload with --parallel (an LLM on a GPU cluster) or --strategy/--micro-batches (one set
    of every accelerator); --batch; the parallel run's --no-fold and --trace-gpus."""
    p.add_argument("--mapping", metavar="FILE",
                   help="a mapping file (per-op sets and shardings, or a parallel: configuration) or the name of a "
                        "shipped example (python -c 'import marssim.data as d; print(d.topologies())' shows where "
                        "they are: mappings/)")
    p.add_argument("--system", metavar="SYSTEM", help="system YAML or shipped name (overrides the mapping's)")
    p.add_argument("--workload", metavar="SPEC", help="zoo spec like resnet50:batch=8, an LLM like "
                                                      "llama3-70b:mode=train,seq=4096, or an .onnx file")
    p.add_argument("--batch", type=positive_int, help="override the workload's batch")
    p.add_argument("--parallel", metavar="CONFIG",
                   help="an LLM workload's parallel configuration on a GPU cluster, e.g. tp=8,pp=2,dp=8,sp=true,"
                        "schedule=1f1b,micro_batch=1,global_batch=512,recompute=selective,zero=1 (settings: tp pp dp "
                        "sp ep zero schedule virtual_stages micro_batch global_batch recompute order bucket "
                        "layers_per_stage stage_tp stage_start overlap_grad_reduce; micro_batch sets the workload's "
                        "batch, default: the workload's batch)")
    p.add_argument("--strategy",
                   help="without --mapping or --parallel: sharding preference list, first legal wins (default dp)")
    p.add_argument("--micro-batches", dest="micro_batches", type=positive_int,
                   help="without --mapping or --parallel: micro-batches (default 1)")
    p.add_argument("--no-fold", dest="fold", action="store_false",
                   help="a parallel configuration: evaluate every GPU, not one per class of identical GPUs (same "
                        "result, slower)")
    p.add_argument("--trace-gpus", metavar="IDS",
                   help="a parallel configuration: GPUs to show in the trace and interval log (e.g. "
                        "gpu[0-15],gpu512); default: one row per pipeline stage")
    if simulate:
        p.add_argument("--estimate", action="store_true",
                       help="a parallel configuration: also print the analytical estimate's report")
        p.add_argument("--memory-policy", choices=("error", "spill", "ignore"), default="error",
                       help="what happens when a memory overflows (default: error; ignore: simulate and report the "
                            "peak; spill: a per-op mapping's overflowing buffers go over the host link)")
        p.add_argument("--streams", type=_streams, default=1,
                       help=f"a per-op mapping: concurrent compute tasks per device (default 1, at most {MAX_STREAMS})")
    else:
        p.add_argument("--memory-policy", choices=("error", "ignore"), default="error",
                       help="a parallel configuration: error (default) refuses one whose memory does not fit before "
                            "estimating it; ignore estimates it anyway (an estimate of a per-op mapping checks no "
                            "memory: simulate it)")


def add_report_args(p: argparse.ArgumentParser) -> None:
    """How the per-layer report is printed: --per-op, --group block|stage, --no-report."""
    p.add_argument("--per-op", dest="per_op", action="store_true",
                   help="print the report per op instead of per layer group")
    p.add_argument("--group", choices=("block", "stage"),
                   help="layer groups of the report: block (a transformer block, a ResNet bottleneck; the default of "
                        "a mapping) or stage (all blocks of a ResNet stage; a parallel run's pipeline stages); a "
                        "parallel run prints its per-stage table and, with --group, this report too")
    p.add_argument("--no-report", dest="report", action="store_false", help="print no per-layer report")


_PARALLEL_ONLY = (("--no-fold", "fold", True), ("--trace-gpus", "trace_gpus", None), ("--estimate", "estimate", False))


def load_plan_args(args: argparse.Namespace):
    """``(plan, graph, system)`` from the flags of :func:`add_plan_args`; InputError, before any
    work, for a flag that does not apply or would be ignored, and for an LLM on a GPU cluster
    given no plan."""
    from marssim.mapping import Mapping
    from marssim.mapping.sharding import STRATEGIES
    from marssim.parallel import parse_parallel
    from marssim.plan import bind_parallel, build_batch, build_recompute, is_llm, load_plan, workload_sets_batch
    from marssim.system import load_system
    from marssim.workload import load_workload
    from marssim.workload.llm import require_transformer

    if args.mapping and args.parallel is not None:
        raise InputError(None, "--parallel", "give either --mapping or --parallel (a mapping file may hold a "
                                             "'parallel:' section itself)")
    if args.parallel is not None or args.mapping:
        for flag, dest in (("--strategy", "strategy"), ("--micro-batches", "micro_batches")):
            if getattr(args, dest, None) is not None:
                raise InputError(None, flag, "applies only without --mapping or --parallel (which set each op's "
                                             "sharding and the micro-batches); drop it, or drop them")
    if args.mapping:
        plan, graph, system = load_plan(args.mapping, system=args.system, workload=args.workload, batch=args.batch)
    elif not args.system or not args.workload:
        raise InputError(None, "arguments", "give --mapping FILE, or --system and --workload (with --parallel for an "
                                            "LLM on a GPU cluster; else a data-parallel mapping over all "
                                            "accelerators is used)")
    else:
        cfg = parse_parallel(args.parallel) if args.parallel is not None else None
        if cfg is not None:
            from marssim.parallel.size import check_gpus

            check_gpus(cfg.gpus)  # before the system is built
        system = load_system(args.system)
        batch = args.batch if cfg is None else build_batch(args.workload, args.batch, cfg,
                                                           micro_batch_given="micro_batch" in _keys(args.parallel))
        # a training LLM at once at its micro-batch and with the configuration's recomputation
        graph = load_workload(args.workload, batch=batch,
                              recompute=None if cfg is None else build_recompute(args.workload, cfg))
        if cfg is not None:
            plan, graph = bind_parallel(cfg, graph, system, "--parallel",
                                        micro_batch_given="micro_batch" in _keys(args.parallel),
                                        order_given="order" in _keys(args.parallel),
                                        batch_given=workload_sets_batch(args.workload, args.batch))
        else:
            if is_llm(graph) and _gpu_cluster(system) and args.strategy is None:
                raise InputError(None, "--parallel", f"{graph.spec} on the GPU cluster {system.spec} runs as a "
                                                     "parallel configuration: give --parallel tp=..,pp=..,dp=.. "
                                                     "(see `marssim simulate --help`), or let `marssim search` find "
                                                     "one (--strategy dp forces a per-op data-parallel mapping)")
            strategy = tuple(s.strip() for s in (args.strategy or "dp").split(","))
            for s in strategy:
                if s not in STRATEGIES:
                    raise InputError(None, "--strategy", f"expected strategies from {', '.join(STRATEGIES)}, got {s!r}")
            plan = Mapping.single_set(graph, system, sharding=strategy, micro_batches=args.micro_batches or 1)
    from marssim.plan.kinds import PlanKind, kind_of

    if is_llm(graph):
        refuse_llm_off_gpus(system, graph.spec, "--mapping" if args.mapping and not args.system else "--system")
        refuse_missing_precision(require_transformer(graph, "a precision check"), system, graph.spec)
    if kind_of(plan).kind is not PlanKind.PARALLEL:
        given = [flag for flag, dest, default in _PARALLEL_ONLY if getattr(args, dest, default) != default]
        if not hasattr(args, "streams") and getattr(args, "memory_policy", "error") == "ignore":
            given.append("--memory-policy ignore")  # estimate: a per-op mapping's memory is not estimated
        if given:
            raise InputError(None, given[0], "applies to a parallel configuration (--parallel, or a mapping file with "
                                             "a 'parallel:' section); this plan is a per-op mapping")
    else:
        if getattr(args, "streams", 1) != 1:
            raise InputError(None, "--streams", "applies to a per-op mapping; a parallel configuration's GPUs run "
                                                "their kernels in the order of its schedule (compute and "
                                                "communication overlap as the schedule says)")
        if getattr(args, "memory_policy", "error") == "spill":
            raise InputError(None, "--memory-policy", "spill applies to a per-op mapping; a parallel configuration's "
                                                      "memory is checked before lowering (error) or not (ignore)")
    if args.trace_gpus and not any(getattr(args, f, None) for f in ("trace", "intervals", "plot")):
        raise InputError(None, "--trace-gpus", "chooses the GPUs of --trace, --intervals and --plot; give one of "
                                               "them, or drop it")
    return plan, graph, system


def _keys(text: str) -> set[str]:
    from marssim.specs import split_spec

    return set(split_spec(text, named=False).params)


def _gpu_cluster(system) -> bool:
    return len(system.accelerators) > 1 and all(system.designs[a.designs[0]].dataflow == "gpu"
                                                 for a in system.accelerators)


def print_report(result, args: argparse.Namespace) -> None:
    """The summary, then the per-layer (or per-op) report the flags ask for."""
    print(result.summary())
    if args.report:
        print()
        if args.per_op:
            print(result.layer_report(per_op=True))
        else:
            print(result.layer_report(level=args.group or "block"))


def run_plan_verb(args: argparse.Namespace, how: str) -> int:
    """``simulate`` (``how="simulate"``) or ``estimate``: load, check, run, print, write, with
    the cyclic garbage collector paused (:func:`marssim.gcpause.gc_paused`): loading, lowering
    and evaluating a plan make few reference cycles, and each of the collector's full passes
    over the objects they keep (the graphs, their rules, the system's routes: hundreds of
    thousands) found none to free while costing up to a tenth of a second (five of them on the
    largest estimate). What it keeps goes to the collector's oldest generation unexamined
    (:func:`marssim.gcpause.promote_survivors`), not walked by the first collection after."""
    from marssim.gcpause import gc_paused, promote_survivors

    with gc_paused():
        try:
            return _run_plan_verb(args, how)
        finally:
            promote_survivors()


def _run_plan_verb(args: argparse.Namespace, how: str) -> int:
    from marssim.plan import run, trace_gpus
    from marssim.plan.kinds import PlanKind, kind_of
    from marssim.results.view import folded_view

    plan, graph, system = load_plan_args(args)
    gpus = trace_gpus(args.trace_gpus, system) if getattr(args, "trace_gpus", None) else None
    cost = cost_model(args)
    parallel = kind_of(plan).kind is PlanKind.PARALLEL
    with progress_bar(args, how) as progress:
        done = run(plan, graph, system, cost, how=how, memory_policy=getattr(args, "memory_policy", "error"),
                   streams=getattr(args, "streams", 1), fold=args.fold, level=args.group or "block",
                   progress=progress, detail=not parallel or needs_tables(args))
    result = done.result
    if result is not None:
        result.meta["mapping_file"] = args.mapping or ""
    shown = None
    if parallel:
        tg = done.taskgraph
        what = "simulated" if how == "simulate" else "estimated"
        coupled = tg.program.coupled if getattr(tg, "program", None) is not None else None
        rings = f" ({len(coupled):,} of them ring transfers of coupled steps)" if coupled is not None else ""
        print(f"{graph.spec} on {system.spec} with {plan.text()}: {tg.n_tasks:,} tasks{rings}, "
              f"{tg.meta['fold_classes']} classes of identical GPUs {what}")
        print("\n".join(done.report.lines()))
        if getattr(args, "estimate", False):  # on the simulation's lowering: the same estimate, not lowered again
            est = run(plan, graph, system, cost, how="estimate", memory_policy="ignore", fold=args.fold, detail=False,
                      taskgraph=tg)
            r = est.report
            print(f"analytical estimate: iteration {r.iteration_s * 1e3:.3f} ms, MFU {r.mfu:.1%}, bubble "
                  f"{r.bubble_share:.1%} (no link contention)")
        if args.report and (args.per_op or args.group):
            print()
            print(result.layer_report(per_op=True) if args.per_op else result.layer_report(level=args.group))
        shown = folded_view(result, gpus) if result is not None else None
    else:
        print_report(result, args)
    if how == "estimate":
        print(f"lower bound  {done.lower_bound * 1e3:.4f} ms ({max(done.bounds, key=done.bounds.get)}; no schedule "
              "of these tasks is faster, contention or not)")
    lines = write_outputs(result, args, shown) if result is not None else []
    if lines:
        print()
        print("\n".join(lines))
    return 0


def needs_tables(args: argparse.Namespace) -> bool:
    """Whether a parallel configuration's run must keep its per-task tables (a full
    :class:`~marssim.results.Result`): for the files of --out, --trace, --intervals and --plot
    and the per-op or per-group report; else its report is built from the schedule's summaries."""
    outputs = any(getattr(args, flag, None) for flag in ("out", "trace", "intervals", "plot"))
    report = args.report and (args.per_op or args.group)
    return bool(outputs or report)


@contextlib.contextmanager
def progress_bar(args: argparse.Namespace, how: str):
    """A tqdm bar on stderr fed by the progress callbacks of a run (yields the callback, or None
    when no bar is drawn): the lowering's tasks built, then the tasks the simulation or the
    estimate has ended."""
    if not progress_stderr(args):
        yield None
        return
    from tqdm import tqdm

    from marssim.progress import EstimateProgress, LoweringProgress, SimulationProgress

    bar = tqdm(total=0, desc="lowering", unit=" tasks", unit_scale=True, file=sys.stderr, leave=False)
    phase = {"name": "lowering"}

    def update(event: LoweringProgress | SimulationProgress | EstimateProgress) -> None:
        match event:
            case LoweringProgress(tasks=done, total=total):
                name = "lowering"
            case SimulationProgress(tasks_done=done, tasks=total) | EstimateProgress(tasks_done=done, tasks=total):
                name = "simulating" if how == "simulate" else "estimating"
        if name != phase["name"]:
            phase["name"] = name
            bar.reset(total=total)
            bar.set_description(name)
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


def progress_stderr(args: argparse.Namespace) -> bool:
    """Whether a progress bar may be drawn (stderr is a terminal and --quiet was not given)."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()
