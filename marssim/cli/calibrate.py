"""``marssim calibrate``: measure GPU kernel timings and fit the cost model's GPU curves to them.

Subcommands: ``grid`` (the shapes to time, derived from zoo workloads -- or, with ``--llm``,
from the LLM workloads as the parallel lowering cuts them -- with the estimated harness time
and its split into chunks), ``measure`` (time them on a CUDA device into
``traces/calibration/<device>.csv``; ``--dry-run`` runs anywhere), ``fit`` (fit the efficiency
curves of a table, write ``<table>.fit.json`` and report the held-out error), ``check``
(validate tables and report what they cover), ``backfill`` (add the convolution geometry
columns to conv rows measured without them, from the layer each row's note names). All but
``measure`` run without a GPU. ``import`` converts published measurements (Vidur's kernel,
host-overhead and collective profiles) into marssim's tables with their provenance.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from marssim.errors import InputError

from ._common import positive_int

VERB = "calibrate"
ORDER = 85


def _grid_args(p: argparse.ArgumentParser) -> None:
    from marssim.calibrate.grid import DEFAULT_KINDS, DEFAULT_WORKLOADS, MEASURE_KINDS
    from marssim.calibrate.llm import DEFAULT_LLM_MODELS, LLM_KINDS, LlmGridOptions

    o = LlmGridOptions()
    p.add_argument("--workloads", default=None,
                   help=f"zoo specs or ONNX files, comma-separated (default {','.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--kinds", default=None,
                   help=f"kernel kinds, some of {','.join(MEASURE_KINDS)} (default {','.join(DEFAULT_KINDS)}; with "
                        f"--llm some of {','.join(LLM_KINDS)}, default all)")
    p.add_argument("--dtype", default=None, help="dtypes, some of bf16,fp16,fp32,tf32 (default bf16,fp16,fp32; with "
                                                 "--llm the models' type, bf16, of which the AdamW step is fp32)")
    p.add_argument("--no-sweep", dest="sweep", action="store_false",
                   help="only the workloads' own layer shapes, no sweep around them")
    p.add_argument("--max-batch-factor", type=positive_int, default=None,
                   help="the sweep scales each layer's batch by 2, 4, ... up to this (default 32)")
    p.add_argument("--shards", default="",
                   help="also the shards of each layer split this many ways by every legal sharding strategy, "
                        "comma-separated counts >= 2 (e.g. 2,4,8: the shapes model-parallel mappings ask for)")
    g = p.add_argument_group("LLM grid", "the kernels the simulator times for GPT-3 and Llama-3 layers under "
                                         "tensor parallelism (marssim/calibrate/llm.py); replaces --workloads, "
                                         "the sweep and --shards")
    g.add_argument("--llm", action="store_true",
                   help="the LLM grid: training (forward, input- and weight-gradient GEMMs, attention and its "
                        "gradients, norms, activations, AdamW), prefill and decode over a KV cache, unfused and "
                        "fused attention, at every tensor-parallel degree")
    g.add_argument("--llm-models", default=",".join(DEFAULT_LLM_MODELS),
                   help=f"LLM specs, comma-separated (default {','.join(DEFAULT_LLM_MODELS)})")
    g.add_argument("--llm-tp", default=",".join(map(str, o.tp)),
                   help=f"tensor-parallel degrees (default {','.join(map(str, o.tp))})")
    g.add_argument("--llm-micro-batches", default=",".join(map(str, o.micro_batches)),
                   help=f"training micro-batches, in sequences (default {','.join(map(str, o.micro_batches))})")
    g.add_argument("--llm-seq", type=positive_int, default=None,
                   help="tokens per training sequence and prompt (default 2048 for GPT-3, 4096 for Llama 3)")
    g.add_argument("--llm-attention-backends", default=",".join(o.backends),
                   help=f"scaled-dot-product attention backends the fused attention shapes are measured with, "
                        f"some of flash,efficient,cudnn,math (default {','.join(o.backends)})")
    p.add_argument("--chunk-seconds", type=float, default=240.0,
                   help="estimated harness seconds per chunk (default 240: a chunk fits a 10-minute run with "
                        "a 2.5x margin)")
    p.add_argument("--no-triton", dest="triton", action="store_false", help="leave out the Triton GEMM")


def _shard_counts(text: str) -> tuple[int, ...]:
    """``--shards``: comma-separated split counts, each an integer >= 2 (empty: none)."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if not item.isdigit() or int(item) < 2:
            raise InputError(None, "--shards", f"expected comma-separated integers >= 2, got {item!r}")
        out.append(int(item))
    return tuple(out)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(VERB, help="measure GPU kernel timings and fit the cost model's GPU curves to them",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="calibrate_command", metavar="COMMAND", title="commands")

    g = s.add_parser("grid", help="the kernel shapes to time, from zoo or LLM workloads (runs anywhere)",
                     description="Derive the shape grid from the workloads' layers (plus a sweep around them), or "
                                 "with --llm from the LLM workloads' tensor-parallel shards, estimate the harness "
                                 "time on the dgx-h100 design and split it into chunks.")
    _grid_args(g)
    g.add_argument("--list", action="store_true", help="print every point")
    g.add_argument("--out", metavar="FILE.csv", help="write the grid as CSV (one row per point and kernel)")
    g.set_defaults(func=run_grid)

    m = s.add_parser("measure", help="time the grid's kernels on a CUDA device (needs a GPU; --dry-run does not)",
                     description="Time every kernel of the grid (or of one chunk of it) on CUDA device 0 and "
                                 "merge the rows into the table. Needs torch with CUDA (pip install "
                                 "'marssim[gpu]'). A rerun skips kernels already in the table. Exit status 3: "
                                 "stopped at --max-seconds with kernels left (run it again to resume).")
    _grid_args(m)
    m.add_argument("--out", metavar="FILE.csv",
                   help="table to merge rows into (default traces/calibration/<device>.csv; <device> in the name "
                        "becomes the GPU's short name, such as H100)")
    m.add_argument("--fused-out", metavar="FILE.csv",
                   help="table for fused-attention rows (default traces/fused-attention/<device>.csv); kept out of "
                        "traces/calibration/ because a fused kernel is not one op of the zoo")
    m.add_argument("--chunk", type=positive_int, metavar="I",
                   help="time only chunk I (1-based) of the split by --chunk-seconds (default: everything)")
    m.add_argument("--repeats", type=positive_int, default=20,
                   help="fewest timed repetitions per kernel, at least 20 (default 20; more for short kernels)")
    m.add_argument("--max-seconds", type=float, default=540.0,
                   help="stop before a kernel that would end after this many seconds (default 540)")
    m.add_argument("--no-resume", dest="resume", action="store_false",
                   help="time kernels again even when the table has them")
    m.add_argument("--dry-run", action="store_true",
                   help="print the grid, kernel count and time estimate; time nothing")
    m.add_argument("--quiet", action="store_true", help="no progress bar")
    m.set_defaults(func=run_measure)

    f = s.add_parser("fit", help="fit the GPU efficiency curves to a table; report the held-out error",
                     description="Fit the cost model's GPU efficiency curve per (device, kind, dtype, tuning) to "
                                 "TABLE with its local residual correction from measured neighbours, write the parameters "
                                 "to TABLE's .fit.json beside it, and report the error on 20 %% of each group's shapes "
                                 "held out of a second fit (median, p90, max; and the curve's alone).")
    f.add_argument("table", metavar="TABLE.csv")
    f.add_argument("--json", metavar="FILE", help="write the fitted parameters here instead")
    f.set_defaults(func=run_fit)

    c = s.add_parser("check", help="validate calibration tables; report coverage per kind and dtype",
                     description="Validate each TABLE against the calibration schema (errors name the file, line "
                                 "and column) and report rows, shapes, tunings and kernels per kind and dtype; with "
                                 "--workloads, which of their layers have a measured shape.")
    c.add_argument("tables", metavar="TABLE.csv", nargs="+")
    c.add_argument("--workloads", help="zoo specs or ONNX files: report the share of their layers the tables hold")
    c.set_defaults(func=run_check)

    from marssim.cost.convgeom import PADDING_RULES

    b = s.add_parser("backfill", help="add the convolution geometry columns to conv rows measured without them",
                     description="Rebuild the layer each conv row's note names (origin=spec:layer and variant), "
                                 "check that its GEMM shape, FLOPs and bytes equal the row's, and write its "
                                 "geometry (conv_c ... conv_groups) into OUT. Rows that do not rebuild exactly "
                                 "keep empty geometry columns (matched by their GEMM shape, as before). Runs "
                                 "anywhere.")
    b.add_argument("table", metavar="TABLE.csv")
    b.add_argument("--out", required=True, metavar="OUT.csv", help="converted table to write (may be TABLE itself)")
    b.add_argument("--padding", choices=PADDING_RULES, default="current",
                   help="padding rule of the harness that measured the table (default current; tables measured "
                        "before spatial shards were: layer)")
    b.add_argument("--shard-padding", dest="shard_padding", choices=PADDING_RULES, default=None,
                   help="padding rule of the harness that measured the table's shard rows, when another "
                        "(default: --padding)")
    b.set_defaults(func=run_backfill)

    i = s.add_parser("import", help="convert published measurements (Vidur's profiles, AIConfigurator's kernels) into "
                                    "marssim's tables",
                     description="Read published measurements from a checkout or a git directory of their repository "
                                 "at COMMIT and write them in marssim's schemas with their provenance: vidur-compute "
                                 "(per-operator kernel times, data/profiling/compute/<gpu>/<model>/mlp.csv -> "
                                 "traces/calibration/<GPU>.csv, merged), vidur-host (host overheads of a serving "
                                 "iteration, data/profiling/a100/cpu_overheads.csv -> traces/host-overheads/A100.csv), "
                                 "vidur-network (collective times, data/profiling/network/<system>/*.csv -> "
                                 "traces/collectives/vidur-2024.csv), xla-collectives (XLA's H100 collective table, "
                                 "a textproto file given to --from -> traces/collectives/xla-2025.csv), aiconfigurator "
                                 "(NVIDIA AIConfigurator's measured GEMMs and context and generation attention "
                                 "kernels from aiconfigurator-core's parquet files, "
                                 "systems/data/<gpu>/{gemm,attention}/<framework>/<version>/*_perf.parquet -> "
                                 "traces/calibration/<GPU>-aiconfigurator.csv, merged; needs pyarrow), "
                                 "aiconfigurator-collectives (its measured NCCL collectives and engines' custom "
                                 "all-reduces, systems/data/<gpu>/comm/<nccl|framework>/<version>/*_perf.parquet -> "
                                 "traces/collectives/aiconfigurator-<version>.csv). Runs anywhere.")
    i.add_argument("source", choices=("vidur-compute", "vidur-host", "vidur-network", "xla-collectives",
                                      "aiconfigurator", "aiconfigurator-collectives"))
    i.add_argument("--from", dest="origin", required=True, metavar="PATH",
                   help="the repository: a git directory (bare or a checkout) or a plain directory of its files; "
                        "xla-collectives: the textproto file; aiconfigurator: the package's systems/data directory, "
                        "the unpacked package, or 'installed'")
    i.add_argument("--commit", help="the commit the files are read at (recorded in every row; not for aiconfigurator)")
    i.add_argument("--date", help="ISO date of the files when PATH is not a git directory (default: from git; "
                                  "aiconfigurator: the date of the import)")
    i.add_argument("--gpus", default="a100,h100", help="vidur-compute: GPU directories to import (default a100,h100)")
    i.add_argument("--tokens", default="default",
                   help="vidur-compute: 'default' (powers of two and 3 x powers of two), 'all', or a comma-separated list")
    i.add_argument("--aic-gpus", default="h100_sxm,h200_sxm,b200_sxm,b300_sxm,gb200,gb300",
                   help="aiconfigurator: the package's systems to import (default the shipped tables' GPUs: "
                        "h100_sxm,h200_sxm,b200_sxm,b300_sxm,gb200,gb300); aiconfigurator-collectives: the "
                        "systems whose tables are read again, the others' rows kept as the file has them")
    i.add_argument("--framework", default="trtllm", choices=("trtllm", "vllm", "sglang"),
                   help="aiconfigurator: whose kernels (default trtllm); the rows' stack is <framework>-<version>")
    i.add_argument("--version", dest="framework_version", default="1.3.0rc20",
                   help="aiconfigurator: the framework's version directory (default 1.3.0rc20)")
    i.add_argument("--families", default="gemm,context-attention,generation-attention",
                   help="aiconfigurator: the kernel families to import, some of gemm, context-attention, "
                        "generation-attention, moe (default the first three; moe: the fused mixture-of-experts "
                        "operators -> traces/moe-kernels/<GPU>-aiconfigurator-moe.csv)")
    i.add_argument("--shapes", default="default", choices=("default", "all"),
                   help="aiconfigurator: the transformer subset of GEMM shapes and the MoE shapes of the shipped "
                        "presets (default) or every shape")
    i.add_argument("--out", metavar="PATH",
                   help="where to write: a directory for vidur-compute (default traces/calibration) and vidur-network "
                        "(default traces/collectives), a .csv file for vidur-host (default "
                        "traces/host-overheads/A100.csv), a directory for aiconfigurator (default traces/calibration; "
                        "its moe family: traces/moe-kernels, <GPU>-aiconfigurator-moe.csv)")
    i.set_defaults(func=run_import)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _counts(text: str, flag: str) -> tuple[int, ...]:
    """Comma-separated positive integers (at least one)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() and int(t) >= 1 for t in items):
        raise InputError(None, flag, f"expected comma-separated integers >= 1, got {text!r}")
    return tuple(dict.fromkeys(int(t) for t in items))


def _llm_options(args: argparse.Namespace):
    """The :class:`~marssim.calibrate.llm.LlmGridOptions` of the ``--llm`` flags; flags of the zoo
    grid, which --llm would ignore, are refused."""
    from marssim.calibrate.grid import parse_list, split_workloads
    from marssim.calibrate.llm import LlmGridOptions
    from marssim.cost.features import SDPA_BACKENDS

    for flag, given in (("--workloads", args.workloads is not None), ("--shards", bool(args.shards)),
                        ("--max-batch-factor", args.max_batch_factor is not None)):
        if given:
            raise InputError(None, flag, "the LLM grid (--llm) derives its shapes from --llm-models; leave "
                                         f"{flag} out")
    dtypes = parse_list(args.dtype or "bf16", ("bf16", "fp16", "fp32"), "--dtype")
    if len(dtypes) != 1:
        raise InputError(None, "--dtype", f"the LLM grid builds the models in one type, got {args.dtype!r}")
    return LlmGridOptions(models=split_workloads(args.llm_models), tp=_counts(args.llm_tp, "--llm-tp"),
                          micro_batches=_counts(args.llm_micro_batches, "--llm-micro-batches"),
                          seq=args.llm_seq or 0, dtype=dtypes[0],
                          backends=parse_list(args.llm_attention_backends, SDPA_BACKENDS, "--llm-attention-backends"))


def _points(args: argparse.Namespace):
    """The grid the flags ask for."""
    from marssim.calibrate.grid import (
        DEFAULT_KINDS, DEFAULT_WORKLOADS, MEASURE_DTYPES, MEASURE_KINDS, build_grid, parse_list, split_workloads,
    )

    if not args.llm:
        from marssim.calibrate.llm import DEFAULT_LLM_MODELS, LlmGridOptions

        o = LlmGridOptions()
        defaults = {"--llm-models": ",".join(DEFAULT_LLM_MODELS), "--llm-tp": ",".join(map(str, o.tp)),
                    "--llm-micro-batches": ",".join(map(str, o.micro_batches)), "--llm-seq": None,
                    "--llm-attention-backends": ",".join(o.backends)}
        for flag, default in defaults.items():
            if getattr(args, flag[2:].replace("-", "_")) != default:
                raise InputError(None, flag, "applies to the LLM grid: add --llm")
    if args.llm:
        from marssim.calibrate.llm import LLM_KINDS, llm_grid

        options = _llm_options(args)
        kinds = parse_list(args.kinds, LLM_KINDS, "--kinds") if args.kinds else LLM_KINDS
        return llm_grid(options, kinds)
    kinds = parse_list(args.kinds or ",".join(DEFAULT_KINDS), MEASURE_KINDS, "--kinds")
    dtypes = parse_list(args.dtype or "bf16,fp16,fp32", MEASURE_DTYPES, "--dtype")
    specs = split_workloads(args.workloads or ",".join(DEFAULT_WORKLOADS))
    return build_grid(specs, kinds, dtypes, sweep=args.sweep, max_batch_factor=args.max_batch_factor or 32,
                      shards=_shard_counts(args.shards))


# ----------------------------------------------------------------------------- shared
def _grid(args: argparse.Namespace):
    """(points, tasks, estimates, chunks) from the grid flags; InputError on bad flags."""
    from marssim.calibrate.grid import estimate_seconds, split_chunks
    from marssim.calibrate.harness import Task
    from marssim.calibrate.kernels import TRITON_COMPILE_S, kernels_for, triton_specialization

    if not args.chunk_seconds > 0:
        raise InputError(None, "--chunk-seconds", f"expected seconds > 0, got {args.chunk_seconds}")
    points = _points(args)
    impls = [kernels_for(p, triton=args.triton) for p in points]
    per_point = estimate_seconds(points, [len(k) for k in impls])
    tasks = []
    compiled: set[tuple] = set()
    for i, (p, ks) in enumerate(zip(points, impls)):
        for impl in ks:
            seconds = per_point[i] / len(ks)
            if impl.name.startswith("triton"):
                signature = triton_specialization(p)
                if signature not in compiled:  # Triton compiles once per specialization
                    compiled.add(signature)
                    seconds += TRITON_COMPILE_S
            tasks.append(Task(p, impl, seconds, seed=i))
    chunks = split_chunks([t.estimate_s for t in tasks], args.chunk_seconds) if tasks else []
    return points, tasks, chunks


def _summary(points, tasks, chunks, chunk_seconds: float) -> list[str]:
    from marssim.system.describe import format_table

    by_kind = Counter((p.measure_kind, p.phase, p.dtype) for p in points)
    kernels = Counter((t.point.measure_kind, t.point.phase, t.point.dtype) for t in tasks)
    est = Counter()
    for t in tasks:
        est[(t.point.measure_kind, t.point.phase, t.point.dtype)] += t.estimate_s
    rows = [[k, ph, dt, str(n), str(kernels[(k, ph, dt)]), f"{est[(k, ph, dt)]:.0f}"]
            for (k, ph, dt), n in by_kind.items()]
    lines = format_table(["kind", "phase", "dtype", "shapes", "kernels", "est. s"], rows, indent="  ")
    from marssim.calibrate.kernels import TRITON_COMPILE_S, triton_specialization

    total = sum(t.estimate_s for t in tasks)
    compiles = len({triton_specialization(t.point) for t in tasks if t.impl.name.startswith("triton")})
    lines.append(f"  total: {len(points)} shapes, {len(tasks)} kernels, about {total / 60:.1f} min"
                 + (f" (of which {compiles} Triton compilations, ~{compiles * TRITON_COMPILE_S:.0f} s)"
                    if compiles else "")
                 + f"; {len(chunks)} chunk(s) of <= {chunk_seconds:.0f} estimated s")
    lines.append("  estimate: per kernel the analytical GPU roofline time of the dgx-h100 design, warm-up, "
                 "repetitions after a 256 MiB L2 flush each, and a fixed set-up cost")
    return lines


# ----------------------------------------------------------------------------- grid
def _grid_name(args: argparse.Namespace) -> str:
    from marssim.calibrate.grid import DEFAULT_WORKLOADS

    if args.llm:
        return f"the LLM workloads {args.llm_models} at tp={args.llm_tp}"
    return args.workloads or ",".join(DEFAULT_WORKLOADS)


def run_grid(args: argparse.Namespace) -> int:
    import csv

    from marssim.cost.calibrated import CONV_COLUMNS, conv_cells
    from marssim.fsutil import atomic_file

    if args.out and not args.out.endswith(".csv"):
        raise InputError(args.out, "--out", "expected a file name ending in .csv")
    points, tasks, chunks = _grid(args)
    print(f"calibration grid for {_grid_name(args)}:")
    for line in _summary(points, tasks, chunks, args.chunk_seconds):
        print(line)
    for i, (a, b) in enumerate(chunks, 1):
        print(f"  chunk {i}: kernels {a + 1}-{b}, about {sum(t.estimate_s for t in tasks[a:b]):.0f} s "
              f"({tasks[a].point.measure_kind} {tasks[a].point.dtype} .. {tasks[b - 1].point.measure_kind} "
              f"{tasks[b - 1].point.dtype})")
    if args.list:
        for t in tasks:
            print(f"  {t.impl.name:18s} {t.point.describe()}")
    if args.out:
        with atomic_file(args.out, newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(["chunk", "measure_kind", "kind", "dtype", "batch", "m", "n", "k", "flops", "bytes",
                        *CONV_COLUMNS, "phase", "backend", "kernel", "tuning", "estimate_s", "op_kind", "loops",
                        "origin"])
            chunk_of = {i: c for c, (a, b) in enumerate(chunks, 1) for i in range(a, b)}
            for i, t in enumerate(tasks):
                p = t.point
                loops = " ".join(f"{d}={v}" for d, v in p.op.loops)
                geometry = conv_cells(p.conv)
                w.writerow([chunk_of[i], p.measure_kind, p.kind, p.dtype, p.batch, p.m, p.n, p.k, p.flops, p.bytes,
                            *(geometry[c] for c in CONV_COLUMNS), p.phase, p.backend, t.impl.name, t.impl.tuning,
                            f"{t.estimate_s:.4g}", p.op.kind.value, loops, p.origin])
        print(f"grid      {args.out}")
    return 0


# ----------------------------------------------------------------------------- measure
def run_measure(args: argparse.Namespace) -> int:
    from marssim.calibrate.grid import FUSED_ATTENTION, TimingPlan

    for flag, value in (("--out", args.out), ("--fused-out", args.fused_out)):
        if value and not value.endswith(".csv"):
            raise InputError(value, flag, "expected a file name ending in .csv")
    if args.repeats < 20:
        raise InputError(None, "--repeats", f"expected at least 20 repetitions, got {args.repeats}")
    if not args.max_seconds > 0:
        raise InputError(None, "--max-seconds", f"expected seconds > 0, got {args.max_seconds}")
    for path in (args.out, args.fused_out):
        if path and "<device>" not in path and "{device}" not in path and Path(path).exists():
            from marssim.cost.calibrated import load_table

            load_table(path)  # a table to merge into must be valid before anything is timed
    points, tasks, chunks = _grid(args)
    if args.chunk is not None:
        if args.chunk > len(chunks):
            raise InputError(None, "--chunk", f"expected a chunk from 1 to {len(chunks)}, got {args.chunk}")
        a, b = chunks[args.chunk - 1]
        tasks = tasks[a:b]
        points = tuple(dict.fromkeys(t.point for t in tasks))
    fused = any(p.measure_kind == FUSED_ATTENTION for p in points)
    if args.dry_run:
        which = f"chunk {args.chunk} of {len(chunks)}" if args.chunk else f"all {len(chunks)} chunk(s)"
        print(f"dry run ({which}) of the grid for {_grid_name(args)}; nothing is timed")
        for line in _summary(points, tasks, [(0, len(tasks))] if args.chunk else chunks, args.chunk_seconds):
            print(line)
        print(f"  table: {args.out or 'traces/calibration/<device>.csv'}"
              + (f"; fused attention: {args.fused_out or 'traces/fused-attention/<device>.csv'}" if fused else ""))
        return 0

    from marssim.calibrate.device import torch_cuda_status

    ok, why = torch_cuda_status()
    if not ok:
        print(f"marssim calibrate measure: error: a CUDA device is required to time kernels ({why}); "
              "grid, fit, check and measure --dry-run run without one", file=sys.stderr)
        return 2
    from marssim.calibrate.harness import MeasureOptions, measure
    from marssim.calibrate.table import short_device_name
    from marssim.cost.calibrated import traces_dir

    device = short_device_name(why)

    def named(path: str) -> Path:  # "traces/calibration/<device>.csv" -> "traces/calibration/H100.csv"
        return Path(path.replace("<device>", device).replace("{device}", device))

    out = named(args.out) if args.out else traces_dir() / "calibration" / f"{device}.csv"
    fused_out = named(args.fused_out) if args.fused_out else traces_dir() / "fused-attention" / f"{device}.csv"
    for path in (out, fused_out if fused else None):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    plan = TimingPlan(min_reps=args.repeats, max_reps=max(100, args.repeats))
    options = MeasureOptions(out, fused_out if fused else None, plan, args.max_seconds, args.resume)
    print(f"timing {len(tasks)} kernels on {why} into {out}" + (f" and {fused_out}" if fused else ""),
          file=sys.stderr, flush=True)
    report = measure(tasks, options, progress=not args.quiet)
    info = report.device
    print(f"{info.name}: {report.measured} kernels timed, {report.already} already in the table, "
          f"{len(report.skipped)} skipped, {report.left} left for a rerun; {report.seconds:.0f} s")
    for path, n in report.written.items():
        print(f"  {path}: {n} rows merged")
    for what, why_skipped in report.skipped[:50]:
        print(f"  skipped {what}: {why_skipped}")
    if len(report.skipped) > 50:
        print(f"  ... and {len(report.skipped) - 50} more skipped")
    if report.left:
        print(f"  time limit reached: run the same command again to time the {report.left} kernels left")
    return 0 if report.left == 0 else 3


# ----------------------------------------------------------------------------- fit
def run_fit(args: argparse.Namespace) -> int:
    from marssim.calibrate.fitting import fit_table, format_report

    if args.json and not args.json.endswith(".json"):
        raise InputError(args.json, "--json", "expected a file name ending in .json")
    reports, path = fit_table(args.table, args.json)
    print(f"{args.table}: {sum(r.n_rows for r in reports)} rows in {len(reports)} groups")
    print(format_report(reports))
    print(f"\nfit       {path}")
    return 0


# ----------------------------------------------------------------------------- check
def run_check(args: argparse.Namespace) -> int:
    from marssim.calibrate.coverage import format_coverage, table_coverage, workload_coverage
    from marssim.cost.calibrated import load_table

    for path in args.tables:
        table = load_table(path)
        print(f"{path}: valid, {len(table)} rows, devices {', '.join(table.devices()) or '-'}")
        print(format_coverage(table_coverage(table)))
        if args.workloads:
            from marssim.calibrate.grid import load_graphs, split_workloads

            graphs = load_graphs(split_workloads(args.workloads))
            for line in workload_coverage(table, graphs):
                print(line)
    return 0


# ----------------------------------------------------------------------------- backfill
def run_backfill(args: argparse.Namespace) -> int:
    from marssim.calibrate.backfill import backfill_conv_geometry
    from marssim.calibrate.table import merge_rows, read_comments, read_rows
    from marssim.cost.calibrated import load_table

    if not args.out.endswith(".csv"):
        raise InputError(args.out, "--out", "expected a file name ending in .csv")
    load_table(args.table)  # the full schema check before anything is written
    rows, report = backfill_conv_geometry(read_rows(args.table), args.padding, args.shard_padding)
    rules = args.padding + (f", shard rows {args.shard_padding}" if args.shard_padding else "")
    comment = (f"# conv geometry columns back-filled by `marssim calibrate backfill` (padding rule {rules}) from "
               f"each row's origin: {report.describe()}")
    merge_rows(args.out, rows, comment, replace_all=True, comments=read_comments(args.table))
    load_table(args.out)
    print(f"{args.out}: {report.describe()}")
    return 0


# ----------------------------------------------------------------------------- import
class _Files:
    """Files of a published repository at a commit: a git directory (bare or a checkout), or a
    plain directory whose files carry one ``date``."""

    def __init__(self, origin: str, commit: str, date: str | None) -> None:
        import datetime as dt

        self.root = Path(origin)
        self.commit = commit
        if not self.root.is_dir():
            raise InputError(origin, "--from", "expected a directory (a git directory or a copy of the repository)")
        self.git = (self.root / "HEAD").is_file() and (self.root / "objects").is_dir() or (self.root / ".git").exists()
        if not self.git and not date:
            raise InputError(origin, "--date", "a plain directory needs --date YYYY-MM-DD (the files' commit date)")
        if date:
            try:
                dt.date.fromisoformat(date)
            except ValueError:
                raise InputError(None, "--date", f"expected an ISO date like 2024-05-14, got {date!r}") from None
        self.date = date
        if self.git:
            self._git("rev-parse", "--verify", f"{commit}^{{commit}}")

    def _git(self, *args: str) -> str:
        import subprocess

        flag = ["--git-dir", str(self.root)] if not (self.root / ".git").exists() else ["-C", str(self.root)]
        done = subprocess.run(["git", *flag, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise InputError(str(self.root), "--commit", f"git {' '.join(args)}: {done.stderr.strip()[:200]}")
        return done.stdout

    def list(self, prefix: str) -> list[str]:
        if self.git:
            return sorted(self._git("ls-tree", "-r", "--name-only", self.commit, "--", prefix).split())
        base = self.root
        return sorted(str(p.relative_to(base)).replace("\\", "/") for p in (base / prefix).rglob("*") if p.is_file())

    def read(self, path: str) -> str:
        if self.git:
            return self._git("show", f"{self.commit}:{path}")
        return (self.root / path).read_text(encoding="utf-8")

    def date_of(self, path: str) -> str:
        if self.date:
            return self.date
        return self._git("log", "-1", "--format=%cs", self.commit, "--", path).strip()


def run_import(args: argparse.Namespace) -> int:
    if args.source == "xla-collectives":
        return _import_xla_collectives(args)
    if args.source == "aiconfigurator":
        return _import_aiconfigurator(args)
    if args.source == "aiconfigurator-collectives":
        return _import_aiconfigurator_collectives(args)
    if not args.commit:
        raise InputError(None, "--commit", f"{args.source}: the commit the files are read at is required")
    files = _Files(args.origin, args.commit, args.date)
    if args.source == "vidur-compute":
        return _import_vidur_compute(args, files)
    if args.source == "vidur-host":
        return _import_vidur_host(args, files)
    return _import_vidur_network(args, files)


def _import_vidur_compute(args: argparse.Namespace, files: "_Files") -> int:
    from marssim.calibrate.published import (
        VIDUR_GPUS, VIDUR_LICENSE, VIDUR_SOURCE, VIDUR_STACK, Provenance, VidurImport, default_tokens, import_summary,
        vidur_files, vidur_rows,
    )
    from marssim.calibrate.table import merge_rows
    from marssim.cost.calibrated import load_table, traces_dir

    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    for g in gpus:
        if g not in VIDUR_GPUS:
            raise InputError(None, "--gpus", f"expected some of {', '.join(VIDUR_GPUS)}, got {g!r}")
    if args.tokens == "default":
        tokens = default_tokens
    elif args.tokens == "all":
        tokens = None
    else:
        wanted = set(_counts(args.tokens, "--tokens"))
        tokens = wanted.__contains__
    out_dir = Path(args.out) if args.out else traces_dir() / "calibration"
    found = vidur_files(files.list("data/profiling/compute"))
    for gpu in gpus:
        mine = [(model, path) for g, model, path in found if g == gpu]
        if not mine:
            raise InputError(args.origin, "data/profiling/compute", f"no {gpu}/<org>/<model>/mlp.csv at {args.commit}")
        result = VidurImport()
        for model, path in mine:
            prov = Provenance(VIDUR_SOURCE, args.commit, path, VIDUR_LICENSE, files.date_of(path))
            result.merge(vidur_rows(files.read(path), prov, gpu, model, tokens))
        device = VIDUR_GPUS[gpu].device
        target = out_dir / f"{device}.csv"
        out_dir.mkdir(parents=True, exist_ok=True)
        comment = (f"# {VIDUR_SOURCE} (MIT license) at {args.commit}: data/profiling/compute/{gpu}/*/mlp.csv, "
                   f"{len(mine)} models, imported by `marssim calibrate import vidur-compute --tokens {args.tokens}` "
                   f"as stack {VIDUR_STACK}: sarathi-serve (vidur branch) layers in fp16 under torch.inference_mode, "
                   "torch.profiler kernel times (median of 20 steps, L2 warm, 1 us resolution), "
                   f"{VIDUR_GPUS[gpu].variant.replace(';', ',')}; driver, CUDA and library versions not published; "
                   "spread_s 0: quartiles not published (std_s in the note)")
        merge_rows(target, result.rows, comment)
        load_table(target)  # the full schema check of what was written
        print(f"{target}: {device}, stack {VIDUR_STACK}:")
        for line in import_summary(result, [p for _, p in mine]):
            print(f"  {line}")
    return 0


def _import_vidur_host(args: argparse.Namespace, files: "_Files") -> int:
    from marssim.cost.host_overheads import load_host_overheads, vidur_host_rows, write_host_overheads
    from marssim.calibrate.published import VIDUR_LICENSE, VIDUR_SOURCE, VIDUR_STACK
    from marssim.cost.calibrated import traces_dir

    path = "data/profiling/a100/cpu_overheads.csv"
    target = Path(args.out) if args.out else traces_dir() / "host-overheads" / "A100.csv"
    if target.suffix != ".csv":
        raise InputError(str(target), "--out", "expected a file name ending in .csv")
    rows = vidur_host_rows(files.read(path), "A100", VIDUR_STACK, VIDUR_SOURCE, args.commit, path, VIDUR_LICENSE,
                           files.date_of(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    write_host_overheads(target, rows, [
        f"{VIDUR_SOURCE} (MIT license) at {args.commit}: {path} (removed from the repository later), imported by "
        "`marssim calibrate import vidur-host`: host time of the stages of one sarathi-serve iteration on A100 GPUs, "
        "per model, batch size and tensor-parallel degree; mean and median over the profiled iterations"])
    load_host_overheads(target)
    print(f"{target}: {len(rows)} rows")
    return 0


_VIDUR_NETWORKS = {
    "a100_dgx": ("dgx-a100", "A100", "DGX A100: 8 A100 80GB SXM4 on NVSwitch (the network between nodes not described)"),
    "a100_pairwise_nvlink": ("nc-a100-v4", "A100", "Azure Standard_NC96ads_A100_v4: 4 A100 80GB PCIe, NVLink bridges "
                                                   "between pairs"),
    "h100_dgx": ("dgx-h100", "H100", "DGX H100: 8 H100 80GB SXM5 on NVSwitch (the network between nodes not described)"),
    "h100_pairwise_nvlink": ("h100-nvl-pairs", "H100", "4 H100 NVL, NVLink bridges between pairs"),
}
"""Vidur's network directories (docs/profiling.md at the imported commit): the system name rows get
and what the source says of the machine."""


def _import_vidur_network(args: argparse.Namespace, files: "_Files") -> int:
    from marssim.calibrate.published import VIDUR_LICENSE, VIDUR_SOURCE, VIDUR_STACK
    from marssim.collectives.measured import load_collectives, vidur_network_rows, write_collectives
    from marssim.cost.calibrated import traces_dir

    out_dir = Path(args.out) if args.out else traces_dir() / "collectives"
    rows = []
    seen: dict[str, str] = {}
    notes = []
    for path in files.list("data/profiling/network"):
        parts = path.split("/")
        if len(parts) != 5 or parts[-1] not in ("all_reduce.csv", "send_recv.csv") or parts[3] not in _VIDUR_NETWORKS:
            continue
        text = files.read(path)
        if text in seen:  # a copy of another file (Vidur ships one send_recv profile twice)
            notes.append(f"{path} is a copy of {seen[text]}: left out")
            continue
        seen[text] = path
        system, gpu, _ = _VIDUR_NETWORKS[parts[3]]
        rows += vidur_network_rows(text, system=system, net_system=f"{system}+net", gpu=gpu, stack=VIDUR_STACK,
                                   source=VIDUR_SOURCE, commit=args.commit, file=path, license_=VIDUR_LICENSE,
                                   date=files.date_of(path))
    if not rows:
        raise InputError(args.origin, "data/profiling/network", f"no Vidur network profiles at {args.commit}")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{VIDUR_STACK}.csv"
    comments = [f"{VIDUR_SOURCE} (MIT license) at {args.commit}: data/profiling/network/<system>/<collective>.csv, "
                "imported by `marssim calibrate import vidur-network` (sizes nearest each power of two and three times "
                "a power of two). Measured by vidur/profiling/collectives: torch.distributed on NCCL (fp16 buffers, "
                "no CUDA graphs), 11 calls back to back after a barrier, the median NCCL kernel time on rank 0 by "
                "torch.profiler, the median of 3 such rounds; NCCL version not published"]
    comments += [f"system {name}: {desc}" for name, _, desc in _VIDUR_NETWORKS.values()]
    comments += [f"{name}+net: groups spanning nodes of {name}; the source does not describe the network"
                 for name, _, _ in _VIDUR_NETWORKS.values()]
    comments += notes
    write_collectives(target, rows, comments)
    load_collectives(target)
    print(f"{target}: {len(rows)} rows")
    for line in notes:
        print(f"  {line}")
    return 0


def _import_xla_collectives(args: argparse.Namespace) -> int:
    from marssim.collectives.measured import load_collectives, write_collectives, xla_textproto_rows
    from marssim.cost.calibrated import traces_dir

    path = Path(args.origin)
    if not path.is_file():
        raise InputError(args.origin, "--from", "expected the textproto file of XLA's collective table")
    if not args.date:
        raise InputError(None, "--date", "expected the ISO date of the file's version (YYYY-MM-DD)")
    out_dir = Path(args.out) if args.out else traces_dir() / "collectives"
    rows = xla_textproto_rows(path.read_text(encoding="utf-8"), system="hgx-h100", gpu="H100", stack="xla-2025",
                              source="openxla/xla", commit=args.commit,
                              file="xla/service/gpu/model/collective_interpolator_data.h", license_="Apache-2.0",
                              date=args.date, min_bytes=2 ** 20)
    if not rows:
        raise InputError(args.origin, "entries", "no all-reduce, all-gather or reduce-scatter entries of >= 2 devices")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "xla-2025.csv"
    write_collectives(target, rows, [
        f"openxla/xla (Apache License 2.0): xla/service/gpu/model/collective_interpolator_data.h, {args.commit}; "
        "imported by `marssim calibrate import xla-collectives`: the sm_90 (NVIDIA H100 80GB HBM3) entries of one "
        "group of 8 GPUs of one host, tensors of 1 MiB and more. Measured by xla/tools/collective_perf_table_gen: "
        "each collective an XLA program on F32 tensors, 5 runs, tensor bytes over the median runtime (the program's "
        "compute time, launch included); NCCL version not recorded. date: only the year of the file is known",
    ])
    load_collectives(target)
    print(f"{target}: {len(rows)} rows")
    return 0


def _import_aiconfigurator(args: argparse.Namespace) -> int:
    """GEMM and attention timings of aiconfigurator-core into ``<out>/<GPU>-aiconfigurator.csv`` (merged)."""
    import datetime

    from marssim.calibrate.aiconfigurator import (
        AIC_GPUS, AIC_LICENSE, AIC_SOURCE, context_attention_rows, data_root, gemm_rows, generation_attention_rows,
        stack_name, table_path,
    )
    from marssim.calibrate.table import merge_rows, read_comments
    from marssim.cost.calibrated import load_table, traces_dir

    root = data_root(None if args.origin == "installed" else args.origin)
    package_version = _aic_version(root)
    gpus = [g.strip() for g in args.aic_gpus.split(",") if g.strip()]
    for g in gpus:
        if g not in AIC_GPUS:
            raise InputError(None, "--aic-gpus", f"expected some of {', '.join(AIC_GPUS)}, got {g!r}")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    for f in families:
        if f not in ("gemm", "context-attention", "generation-attention", "moe"):
            raise InputError(None, "--families", f"expected some of gemm, context-attention, generation-attention, "
                                                 f"moe, got {f!r}")
    date = args.date or datetime.date.today().isoformat()
    stack = stack_name(args.framework, args.framework_version)
    out_dir = Path(args.out) if args.out else traces_dir() / "calibration"
    kernel_families = [f for f in families if f != "moe"]
    if kernel_families:
        out_dir.mkdir(parents=True, exist_ok=True)
    subset = {} if args.shapes == "default" else {"m_values": None, "widths": None}
    for gpu in gpus:
        device = AIC_GPUS[gpu].device
        target = out_dir / f"{device}-aiconfigurator.csv"
        done = []
        for family in families:
            if family == "moe":
                done.append(_import_aic_moe(root, gpu, args, stack, package_version, date))
                continue
            if family == "gemm":
                path = table_path(root, gpu, "gemm", args.framework, args.framework_version, "gemm")
                rows = gemm_rows(path, gpu, stack, package_version, date, **subset)
                what = (f"GEMM latencies as {args.framework} {args.framework_version} runs them on {gpu}, writing "
                        "bf16; fp8 is per-tensor scaled E4M3, fp4 NVFP4, fp8_block E4M3 with 1 x 128 and 128 x 128 "
                        "block scales")
            elif family == "generation-attention":
                path = table_path(root, gpu, "attention", args.framework, args.framework_version,
                                  "generation_attention")
                rows = generation_attention_rows(path, gpu, stack, package_version, date,
                                                 **({} if args.shapes == "default" else {"head_dims": None,
                                                                                         "heads": None}))
                what = (f"decode attention as {args.framework} {args.framework_version} runs it on {gpu}, one "
                        "bf16 query per sequence over a bf16 or fp8 cache of isl + step tokens, no sliding window, "
                        "as fused attention rows of backend flash")
            else:
                path = table_path(root, gpu, "attention", args.framework, args.framework_version, "context_attention")
                every = {"head_dims": None, "min_tokens": 1, "heads": None}
                rows = context_attention_rows(path, gpu, stack, package_version, date,
                                              **({} if args.shapes == "default" else every))
                what = (f"causal context attention as {args.framework} {args.framework_version} runs it on {gpu}, "
                        "bf16 queries over a bf16 or fp8 cache, no sliding window, as fused attention rows of backend "
                        "flash")
            rel = path.relative_to(root).as_posix()
            comment = (f"# {AIC_SOURCE} {package_version} (NVIDIA, {AIC_LICENSE}): systems/data/{rel}, imported by "
                       f"`marssim calibrate import aiconfigurator --shapes {args.shapes}` as stack {stack}: {what}; "
                       "measurement date, spread and sample count not published (date: of the import, spread_s 0, "
                       "samples 1)")
            # a re-import of a source file replaces its own earlier line
            earlier = [c for c in read_comments(target) if f"systems/data/{rel}," not in c] if target.exists() else None
            merge_rows(target, rows, comment, comments=earlier)
            counts: dict[tuple[str, str], int] = {}
            for r in rows:
                counts[(r.kind, r.dtype)] = counts.get((r.kind, r.dtype), 0) + 1
            done += [f"{n:,} {d} {k}" for (k, d), n in sorted(counts.items())]
        if kernel_families:
            load_table(target)  # the full schema check of what was written
        print(f"{target if kernel_families else device}: {device}, stack {stack}: " + ", ".join(done))
    return 0


def _import_aic_moe(root: Path, gpu: str, args: argparse.Namespace, stack: str, package_version: str,
                    date: str) -> str:
    """The fused MoE operators of ``gpu`` into ``traces/moe-kernels/<GPU>-aiconfigurator-moe.csv``
    (or ``--out``'s directory); what was written, for the summary line."""
    from marssim.calibrate.aiconfigurator import (
        AIC_GPUS, AIC_LICENSE, AIC_SOURCE, MOE_DTYPES, default_moe_shapes, moe_rows, table_path,
    )
    from marssim.cost.calibrated import traces_dir
    from marssim.cost.moe_kernels import BALANCED, merge_moe_kernels

    path = table_path(root, gpu, "moe", args.framework, args.framework_version, "moe")
    default = args.shapes == "default"
    rows = moe_rows(path, gpu, stack, package_version, date, shapes=default_moe_shapes() if default else None,
                    distributions=(BALANCED,) if default else None)
    if not rows:
        raise InputError(str(path), "moe", f"expected measured MoE operators of gated experts in "
                                           f"{', '.join(MOE_DTYPES)}"
                                           + (" of the shipped presets' shapes (--shapes all: every shape)" if default
                                              else "") + ", found none")
    device = AIC_GPUS[gpu].device
    out_dir = Path(args.out) if args.out else traces_dir() / "moe-kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{device}-aiconfigurator-moe.csv"  # beside a --out directory's kernel tables
    rel = path.relative_to(root).as_posix()
    comment = (f"{AIC_SOURCE} {package_version} (NVIDIA, {AIC_LICENSE}): systems/data/{rel}, imported by `marssim "
               f"calibrate import aiconfigurator --families moe --shapes {args.shapes}` as stack {stack}: "
               f"{args.framework} {args.framework_version}'s fused MoE operators of gated experts on {gpu} (routing, "
               "permute and quantization, grouped GEMMs and activation, un-permute; the router GEMM and collectives "
               "excluded), bf16, per-tensor fp8 and nvfp4, by tokens, hidden, intermediate, top-k, experts, the GPU's "
               "expert-tensor- and expert-parallel degrees and the token distribution (default subset: the shipped "
               "presets' shapes, balanced routing); latency ms -> seconds; "
               "measurement date, spread and samples not published (date: of the import)")
    merge_moe_kernels(target, rows, comment)
    return f"{len(rows):,} MoE operators -> {target}"


def _import_aiconfigurator_collectives(args: argparse.Namespace) -> int:
    """Collective timings of aiconfigurator-core into ``<out>/aiconfigurator-<version>.csv``: the
    tables of the ``--aic-gpus`` GPUs read again, every other table's rows and comment line kept as
    the file has them (their import dates too)."""
    import datetime

    from marssim.calibrate.aiconfigurator import AIC_SOURCE, collective_table_rows, collective_tables, data_root
    from marssim.calibrate.table import read_comments
    from marssim.collectives.measured import load_collectives, write_collectives
    from marssim.cost.calibrated import traces_dir

    root = data_root(None if args.origin == "installed" else args.origin)
    package_version = _aic_version(root)
    date = args.date or datetime.date.today().isoformat()
    out_dir = Path(args.out) if args.out else traces_dir() / "collectives"
    target = out_dir / f"aiconfigurator-{package_version}.csv"
    chosen = {g.strip() for g in args.aic_gpus.split(",") if g.strip()}
    known = dict.fromkeys(gpu for gpu, _, _ in collective_tables())
    unknown = sorted(chosen - set(known))
    if unknown:
        raise InputError(None, "--aic-gpus", f"expected some of {', '.join(known)}, got {unknown[0]!r}")
    kept_rows: dict[str, list] = {}
    kept_comments: dict[str, str] = {}
    if target.is_file():
        for r in load_collectives(target):
            kept_rows.setdefault(r.file, []).append(r)
        kept_comments = {line[2:].split(": ", 1)[0]: line for line in read_comments(target)}
    rows, comments = [], []
    for gpu, stack, rel in collective_tables():
        if gpu not in chosen and f"systems/data/{rel}" in kept_rows:
            rows += kept_rows[f"systems/data/{rel}"]
            if rel in kept_comments:
                comments.append(kept_comments[rel])
            continue
        got = collective_table_rows(root, gpu, stack, rel, package_version, date)
        rows += got
        note = got[0].note if got else ""
        comments.append(f"{rel}: {len(got)} rows, stack {stack}{' (' + note + ')' if note else ''}")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_collectives(target, rows, [
        f"{AIC_SOURCE} {package_version} (NVIDIA, Apache-2.0), systems/data/<gpu>/comm/, imported by "
        "`marssim calibrate import aiconfigurator-collectives`: the half-precision (fp16; bf16 for the engines' "
        "custom all-reduces) all-reduce, all-gather and reduce-scatter of 2, 4 and 8 GPUs of one node (GB200, GB300: 2 "
        "and 4 of one NVL72 domain), 256 to 2^29 elements, the median of the package's repeated rows. The package's "
        "message_size counts elements of nccl-tests' total (bytes = 2 x elements); latency in ms. Measured by "
        "AIConfigurator's collector (nccl-tests-style loops for NCCL; the engine's own all-reduce op for the custom "
        "all-reduces); measurement date, spread and sample count not published (date: of the import)",
        *comments])
    load_collectives(target)
    print(f"{target}: {len(rows)} rows")
    for line in comments:
        print(f"  {line}")
    return 0


def _aic_version(root: Path) -> str:
    """The version of the aiconfigurator-core package whose ``systems/data`` is ``root``: from its
    dist-info (beside the package) or the installed distribution's metadata, else ``unknown``."""
    for info in sorted(root.parents[2].glob("aiconfigurator_core-*.dist-info")) if len(root.parents) > 2 else []:
        return info.name[len("aiconfigurator_core-"):-len(".dist-info")]
    try:
        from importlib.metadata import version

        return version("aiconfigurator-core")
    except Exception:  # noqa: BLE001 - not installed: the version is not known
        return "unknown"
