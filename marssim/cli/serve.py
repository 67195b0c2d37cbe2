"""``marssim serve``: simulate a stream of LLM requests served by a deployment of model replicas
(continuous batching, paged KV cache, disaggregated prefill and decode), or a rate sweep of it."""

from __future__ import annotations

import argparse
import contextlib
import math

from marssim.errors import InputError

from ._common import (add_cost_args, check_output_dir, check_output_file, cost_model, positive_float, positive_int,
                      refuse_llm_off_gpus, refuse_missing_precision, request_flags, seed_arg)

VERB = "serve"
ORDER = 47

_DESCRIPTION = """\
Serve requests with a deployment of LLM replicas and report time to first token (TTFT), time per
output token (TPOT), time between tokens (TBT), end-to-end latency (E2E), throughput and goodput.
Every engine iteration is timed by the cost model for its exact batch, with tensor parallelism as
the parallel lowering splits it; pipeline transfers and KV-cache moves are flows of the network.

A deployment is one or more --pool settings (or a --deployment YAML file):
  --pool replicas=16,tp=4                          16 replicas of 4 GPUs, vLLM-style continuous batching
  --pool replicas=8,tp=8,scheduler=chunked,max_batched_tokens=2048
  --pool role=prefill,replicas=2,tp=4 --pool role=decode,replicas=6,tp=4   disaggregated prefill/decode
Pool keys: role, replicas, tp, pp, gpu, scheduler (static|continuous|chunked), max_num_seqs,
max_batched_tokens, mixed, scheduler_steps (vLLM's multi-step scheduling), block_size, watermark, gpu_memory_utilization (or TensorRT-LLM's
kv_cache_free_gpu_mem_fraction: the KV cache's share of the memory the weights leave), preemption
(recompute|swap), swap_space, prefix_caching, and speculative decoding: spec_method (draft|mtp),
spec_model (the draft model), spec_layers (MTP head blocks), spec_k, spec_alpha (see docs/serving.md).

Requests: --replay azure-conv-2023 (a shipped trace, or a CSV of arrival_s,prompt_tokens,output_tokens),
or --arrival poisson:rate=4 | gamma:rate=4,cv=2 | offline with --prompt and --output lengths
(512, uniform:128-2048, zipf:a=1.2,low=16,high=4096, trace:NAME); --rate sets the mean rate.
Benchmark modes: open loop (the arrivals above), --arrival offline (every request at time 0, the
engines' throughput benchmark), --concurrency N [--duration T] (a closed loop of N users, the
engines' serving benchmarks at a fixed concurrency).
--rates 1,2,4,8 sweeps the rate (on --workers processes or a --dask cluster) instead of one run.
"""


def _request_count(text: str) -> int:
    from marssim.serve.inputs import MAX_REQUESTS

    value = positive_int(text)
    if value > MAX_REQUESTS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_REQUESTS:,} requests (a simulation serves thousands "
                                         f"a second), got {value:,}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(VERB, help="simulate LLM serving: requests, continuous batching, paged KV cache, "
                                  "disaggregated prefill/decode; latency percentiles, throughput, goodput",
                       description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", metavar="SYSTEM", help="system YAML or shipped name (e.g. dgx-h100-cluster:nodes=8)")
    p.add_argument("--model", metavar="SPEC", help="the LLM served (llama3-70b, llama3-8b:attention=flash, gpt:...)")
    p.add_argument("--deployment", metavar="FILE",
                   help="deployment YAML: model, system, pools, router, requests, slo (flags override it)")
    p.add_argument("--pool", action="append", metavar="SETTINGS", help="a pool of replicas (repeat for several)")
    p.add_argument("--router", choices=("round_robin", "least_tokens", "least_requests", "random"),
                   help="how requests pick a replica (default least_tokens)")
    p.add_argument("--decode-router", dest="decode_router",
                   choices=("round_robin", "least_tokens", "least_requests", "random"),
                   help="disaggregated pools: how a prefilled request picks its decode replica (default least_tokens)")
    p.add_argument("--context-bucket", dest="context_bucket", type=positive_int, metavar="TOKENS",
                   help="time decode attention at the batch's mean context rounded to this many tokens "
                        "(default 1: exact; larger is faster, see docs/serving.md for the error)")
    p.add_argument("--tp-comm", dest="tp_comm", choices=("closed", "network"),
                   help="an iteration's tensor-parallel collectives: closed (on their routes, no contention; "
                        "default) or network (flows sharing links with KV moves and pipeline transfers)")
    g = p.add_argument_group("requests")
    g.add_argument("--replay", metavar="TRACE", help="arrivals and lengths of a request trace (shipped name or CSV)")
    g.add_argument("--arrival", metavar="SPEC", help="poisson:rate=R, gamma:rate=R,cv=C, trace:NAME, offline")
    g.add_argument("--prompt", metavar="SPEC", help="prompt lengths: N, uniform:LOW-HIGH, zipf:a=A,low=L,high=H, "
                                                    "trace:NAME")
    g.add_argument("--output", metavar="SPEC", help="output lengths (generated tokens, the first included)")
    g.add_argument("--concurrency", type=positive_int, metavar="N",
                   help="a closed loop of N users, each sending its next request when the previous one ends "
                        "(the engines' serving benchmarks at a fixed concurrency); with --prompt and --output")
    g.add_argument("--duration", type=positive_float, metavar="SECONDS",
                   help="with --concurrency: users send requests until this simulated time (--requests is then "
                        "a starting cap, grown as needed)")
    g.add_argument("--requests", type=_request_count, metavar="N",
                   help="number of requests (default 1000; a replayed trace: all its rows)")
    g.add_argument("--rate", type=positive_float, metavar="R",
                   help="mean arrival rate in requests/s (Poisson, or the replayed trace sped up to it)")
    g.add_argument("--prefix", metavar="SETTINGS",
                   help="shared prompt prefixes, put before the prompts: tokens=T,groups=G,share=S (for "
                        "prefix_caching)")
    g.add_argument("--seed", type=seed_arg, help="random seed of the requests and the random router (default: the "
                                            "file's requests.seed, else 0)")
    p.add_argument("--slo", metavar="BOUNDS",
                   help="service-level objectives: bounds on every request, counted by the goodput (ttft=2s,"
                        "tpot=100ms,e2e=30s), and bounds on the run's statistics, METRIC_STAT=TIME (ttft_p99=2s, "
                        "tbt_p99=100ms: reported as met or missed; their TTFT, TPOT and E2E bounds count in the "
                        "goodput too)")
    s = p.add_argument_group("rate sweep")
    s.add_argument("--rates", metavar="R1,R2,...", help="simulate each arrival rate (requests/s): a latency-vs-load curve")
    s.add_argument("--workers", type=positive_int, metavar="N", help="sweep on N processes (default: the CPU count)")
    s.add_argument("--dask", metavar="ADDRESS", help="sweep on a Dask cluster (scheduler address; needs marssim[dask])")
    s.add_argument("--dask-timeout", dest="dask_timeout", type=positive_float, metavar="SECONDS",
                   help="seconds to wait for the Dask scheduler to answer (default 10)")
    o = p.add_argument_group("outputs")
    o.add_argument("--out", metavar="DIR", help="write summary.json and CSV tables (requests, iterations, replicas, "
                                                "transfers; a sweep: sweep.csv, sweep.json) into DIR")
    o.add_argument("--trace", metavar="FILE", help="write a Perfetto trace (.json or .json.gz): a track per engine")
    o.add_argument("--plot", metavar="FILE",
                   help="write figures (PNG and SVG): latency CDFs and FILE-timeline (a sweep: throughput and "
                        "latency against the rate)")
    add_cost_args(p)
    p.set_defaults(func=run)


# ---------------------------------------------------------------------- inputs
def _rates(text: str | None) -> list[float] | None:
    if not text:
        return None
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not value > 0 or value == math.inf:
            raise InputError(None, "--rates", f"expected positive request rates like 1,2,4,8, got {part.strip()!r}")
        out.append(value)
    if len(set(out)) != len(out):
        raise InputError(None, "--rates", "a rate is given twice")
    return out


@contextlib.contextmanager
def _executor(args: argparse.Namespace, points: int):
    from ._searching import open_executor

    if args.dask and args.workers:
        raise InputError(None, "--workers", "give --workers (local processes) or --dask (a cluster), not both")
    workers = args.workers if args.workers is not None else None
    if workers is None and not args.dask:
        import os

        workers = min(points, os.cpu_count() or 1)
    with open_executor(args, workers) as executor:
        yield executor


# ---------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    from marssim.fsutil import staged_dir
    from marssim.serve import outputs
    from marssim.serve.model import load_model
    from marssim.system import load_system

    check_output_dir(args.out)
    check_output_file(args.trace, "--trace", (".json", ".json.gz"))
    check_output_file(args.plot, "--plot", (".png",))
    from marssim.serve.inputs import (DeploymentFlags, check_context, constraints_of, deployment_of,
                                      read_deployment_file, request_seed, request_spec)

    file = read_deployment_file(args.deployment)
    model_spec = args.model or file.model
    system_spec = args.system or file.system
    if not model_spec:
        raise InputError(None, "--model", "give the model served (e.g. --model llama3-70b)")
    if not system_spec:
        raise InputError(None, "--system", "give the system (e.g. --system dgx-h100-cluster:nodes=8)")
    model = load_model(str(model_spec))
    system = load_system(str(system_spec))
    refuse_llm_off_gpus(system, str(model_spec), "--system" if args.system else "system")
    refuse_missing_precision(model, system, str(model_spec), "--model" if args.model else "model")
    deployment = deployment_of(DeploymentFlags(tuple(args.pool or ()), args.router, args.decode_router,
                                               args.context_bucket, args.tp_comm), file)
    spec = request_spec(request_flags(args), file)
    constraints = constraints_of(args.slo, file)
    slo = constraints.request_slo()
    args.seed = request_seed(args.seed, file)
    rates = _rates(args.rates)
    if not rates:
        for flag, dest in (("--workers", "workers"), ("--dask", "dask")):
            if getattr(args, dest) is not None:
                raise InputError(None, flag, "runs the points of a rate sweep; give --rates R1,R2,... or drop it")
    if args.dask_timeout is not None and not args.dask:
        raise InputError(None, "--dask-timeout", "applies to --dask; drop it, or give --dask ADDRESS")
    check_context(model, spec, args.seed)
    cost = cost_model(args)
    if rates:
        if spec.arrivals.kind == "closed":
            raise InputError(None, "--rates", "a closed loop's users set the rate; sweep --concurrency in separate "
                                              "runs, or drop --concurrency")
        if args.trace:
            raise InputError(None, "--trace", "a rate sweep writes no trace; drop --trace or --rates")
        from marssim.plan import serve_rates

        with _executor(args, len(rates)) as executor:
            rows = serve_rates(deployment, model, system, cost, spec, rates, seed=args.seed, slo=slo,
                               executor=executor)
        print(f"{model.name} on {system.spec}: {deployment.text()}")
        print(f"requests: {spec.text()}; SLO {slo.text()}")
        print("\n".join(outputs.sweep_lines(rows)))
        lines = []
        if args.out:
            import json

            with staged_dir(args.out) as tmp:
                with open(tmp / "sweep.json", "w", encoding="utf-8") as f:
                    json.dump(outputs.json_clean(rows), f, indent=1, sort_keys=True)
                    f.write("\n")
                _sweep_csv(rows, tmp / "sweep.csv")
            lines.append(f"sweep     {_dir(args.out)} (sweep.csv, sweep.json)")
        if args.plot:
            for path in outputs.plot_sweep(rows, args.plot, f"{model.name}: {deployment.text()}"):
                lines.append(f"figure    {path}")
        if lines:
            print()
            print("\n".join(lines))
        return 0
    from marssim.plan import serve_stream

    from marssim.serve.launch import SGLANG_SCRIPT, VLLM_SCRIPT, launch_commands, launch_lines, write_launch_scripts

    result = serve_stream(deployment, model, system, cost, spec, seed=args.seed, slo=slo, trace=bool(args.trace))
    print("\n".join(outputs.report_lines(result)))
    if constraints.bounds:
        missed = constraints.violations(result.summary)
        print(f"constraints {', '.join(b.text() for b in constraints.bounds)}: "
              + (f"missed ({'; '.join(missed)})" if missed else "met"))
    commands = launch_commands(deployment, model, str(model_spec))
    print()
    print("launch settings (one command per replica; docs/serving.md):")
    print("\n".join(launch_lines(commands)))
    lines = []
    if args.out:
        with staged_dir(args.out) as tmp:
            outputs.write_tables(result, tmp)
            write_launch_scripts(commands, deployment, tmp)
        lines.append(f"result    {_dir(args.out)} (summary.json, requests.csv, iterations.csv, replicas.csv, "
                     f"{VLLM_SCRIPT}, {SGLANG_SCRIPT})")
    if args.trace:
        size = outputs.write_trace(result, args.trace)
        lines.append(f"trace     {args.trace} ({size / 2**20:.2f} MiB; open in https://ui.perfetto.dev)")
    if args.plot:
        for path in outputs.plot_run(result, args.plot):
            lines.append(f"figure    {path}")
    if lines:
        print()
        print("\n".join(lines))
    return 0


def _dir(path: str) -> str:
    """A directory as the report names it: its path with one trailing separator."""
    import os

    stripped = path.rstrip("/" + os.sep)
    return (stripped or path[:1]) + ("" if not stripped else "/")


def _sweep_csv(rows: list[dict], path) -> None:
    import csv

    keys = ["throughput_rps", "output_tokens_per_s", "goodput_rps", "slo_attained", "completed", "rejected",
            "preemptions"]
    stats = ["ttft_s", "tpot_s", "tbt_s", "e2e_s", "queue_s"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["rate_rps"] + keys + [f"{s}_{q}" for s in stats for q in ("mean", "p50", "p90", "p99")])
        for r in rows:
            s = r["summary"]
            w.writerow([f"{r['rate']:.9g}"] + [f"{s[k]:.9g}" if isinstance(s[k], float) else s[k] for k in keys]
                       + [f"{s[st][q]:.9g}" for st in stats for q in ("mean", "p50", "p90", "p99")])
