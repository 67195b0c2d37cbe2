"""``marssim serve``: simulate a stream of LLM requests served by a deployment of model replicas
(continuous batching, paged KV cache, disaggregated prefill and decode), or a rate sweep of it."""

from __future__ import annotations

import argparse
import contextlib
import math

from marssim.errors import InputError

from ._common import (add_cost_args, check_output_dir, check_output_file, cost_model, positive_float, positive_int,
                      refuse_llm_off_gpus, refuse_missing_precision, seed_arg)

VERB = "serve"
ORDER = 47

MAX_REQUESTS = 10_000_000
"""The most requests of one run (each is drawn and simulated: thousands a second)."""

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
max_batched_tokens, mixed, block_size, watermark, gpu_memory_utilization, preemption
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
def _file_sections(path: str | None) -> dict:
    if not path:
        return {}
    from marssim.schema import read_yaml

    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError(path, "", "expected a mapping with pools (and model, system, router, requests, slo)")
    allowed = ("model", "system", "pools", "router", "decode_router", "context_bucket", "tp_comm", "requests", "slo")
    for key in data:
        if key not in allowed:
            raise InputError(path, str(key), f"unknown key; expected one of: {', '.join(allowed)}")
    return data


def _deployment(args: argparse.Namespace, data: dict):
    from marssim.serve.deployment import Deployment, check_deployment, deployment_from_dict, parse_pool

    if args.pool:
        pools = tuple(parse_pool(text, "--pool") for text in args.pool)
        base = Deployment(pools)
        if data.get("pools") is not None:
            raise InputError(None, "--pool", f"{args.deployment} already lists pools; give them in one place")
        dep_data = {k: v for k, v in data.items() if k in ("router", "decode_router", "context_bucket", "tp_comm")}
        if dep_data:
            base = deployment_from_dict({"pools": [{}], **dep_data}, args.deployment).with_(pools=pools)
    elif data.get("pools") is not None:
        base = deployment_from_dict({k: v for k, v in data.items()
                                     if k in ("pools", "router", "decode_router", "context_bucket", "tp_comm")},
                                    args.deployment)
    else:
        raise InputError(None, "--pool", "give the replicas: --pool replicas=N,tp=T (repeatable) or --deployment FILE")
    changes = {}
    for flag in ("router", "decode_router", "context_bucket", "tp_comm"):
        value = getattr(args, flag)
        if value is not None:
            changes[flag] = value
    dep = base.with_(**changes) if changes else base
    check_deployment(dep, args.deployment or "--pool")
    if not dep.disaggregated and (args.decode_router is not None or "decode_router" in data):
        where = (None, "--decode-router") if args.decode_router is not None else (args.deployment, "decode_router")
        raise InputError(*where, "applies to disaggregated pools (role=prefill and role=decode); these pools "
                                 "prefill and decode on the same replicas")
    return dep


def _requests(args: argparse.Namespace, data: dict):
    from marssim.serve.requests import Arrivals, RequestSpec, parse_arrivals, parse_lengths, parse_prefix
    from marssim.serve.traces import load_trace

    file = args.deployment
    section = data.get("requests") or {}
    if not isinstance(section, dict):
        raise InputError(file, "requests", "expected a mapping (arrival, prompt, output, count, replay, prefix, seed)")
    keys = ("arrival", "prompt", "output", "count", "replay", "rate", "prefix", "seed", "concurrency", "duration")
    for key in section:
        if key not in keys:
            raise InputError(file, f"requests.{key}", f"unknown key; expected one of: {', '.join(keys)}")

    def pick(flag: str, key: str):
        value = getattr(args, flag, None)
        if value is not None:
            return value, f"--{flag}"
        return section.get(key), f"requests.{key}"

    replay, _ = pick("replay", "replay")
    arrival, arrival_where = pick("arrival", "arrival")
    prompt, prompt_where = pick("prompt", "prompt")
    output, output_where = pick("output", "output")
    count, _ = pick("requests", "count")
    rate, _ = pick("rate", "rate")
    prefix, prefix_where = pick("prefix", "prefix")
    concurrency, concurrency_where = pick("concurrency", "concurrency")
    duration, duration_where = pick("duration", "duration")
    try:
        if concurrency is not None or duration is not None:
            arrivals = _closed_loop(concurrency, concurrency_where, duration, duration_where, file,
                                    {"--replay": replay, "--arrival": arrival, "--rate": rate})
        elif replay:
            if arrival:
                raise InputError(None, "--arrival", "--replay takes the trace's arrivals; drop one of them")
            for given, where in ((prompt, prompt_where), (output, output_where)):
                if given is not None and not str(given).startswith("trace:"):
                    raise InputError(None, where, "--replay takes the trace's prompt and output lengths with its "
                                                  "arrivals; drop one of them (or give --arrival with --prompt "
                                                  "and --output)")
            load_trace(str(replay))
            arrivals = Arrivals("trace", trace=str(replay))
            prompt = prompt or f"trace:{replay}"
            output = output or f"trace:{replay}"
        elif arrival:
            arrivals = parse_arrivals(str(arrival), arrival_where)
            if arrivals.kind == "offline" and rate is not None:
                raise InputError(None, "--rate", "offline arrivals all come at time 0: a rate does nothing; drop "
                                                 "--rate, or give --arrival poisson:rate=R")
        elif rate is not None:
            arrivals = Arrivals("poisson", rate=float(rate))
        else:
            raise InputError(None, "--arrival", "give --replay TRACE, or --arrival (or --rate) with --prompt and --output")
        if prompt is None or output is None:
            raise InputError(None, "--prompt" if prompt is None else "--output",
                             "give the prompt and output lengths (e.g. --prompt uniform:128-2048 --output 256, or "
                             "trace:azure-conv-2023)")
        p = parse_lengths(prompt, prompt_where)
        o = parse_lengths(output, output_where)
    except InputError as err:
        if err.file is None and file and not any(getattr(args, f) for f in ("replay", "arrival", "prompt", "output")):
            raise InputError(file, problems=err.problems) from None
        raise
    if count is None:
        count = len(load_trace(arrivals.trace)) if arrivals.kind == "trace" else \
            max(1000, arrivals.concurrency) if arrivals.kind == "closed" and not arrivals.duration else 1000
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_REQUESTS:
        where = (None, "--requests") if args.requests is not None else (file, "requests.count")
        raise InputError(*where, f"expected a number of requests from 1 to {MAX_REQUESTS:,} (a simulation serves "
                                 f"thousands of requests a second), got {count!r}")
    spec = RequestSpec(arrivals, p, o, int(count))
    if prefix:
        tokens, groups, share = parse_prefix(str(prefix), prefix_where)
        from dataclasses import replace

        spec = replace(spec, prefix_tokens=tokens, prefix_groups=groups, prefix_share=share)
    if rate is not None and (arrivals.kind == "trace" or arrival):
        spec = spec.with_rate(float(rate))
    return spec


def check_context(model, spec, seed: int) -> None:
    """InputError when a request of ``spec`` (drawn with ``seed``; its prompt, shared prefix and
    output tokens together) is longer than ``model``'s context (``max_positions``), which no
    engine serves (vLLM refuses such a prompt unless ``--max-model-len`` truncates it)."""
    import numpy as np

    requests = spec.draw(seed)
    total = requests.prompt + requests.output
    over = np.flatnonzero(total > model.max_positions)
    if len(over):
        i = int(over[np.argmax(total[over])])
        where = "--replay" if spec.arrivals.kind == "trace" and spec.prompt.kind == "trace" else "--prompt"
        raise InputError(None, where, f"{len(over):,} of {len(total):,} requests need more tokens than the model's "
                                      f"context of {model.max_positions:,} (the longest: prompt "
                                      f"{int(requests.prompt[i]):,} + output {int(requests.output[i]):,}); give "
                                      "shorter --prompt and --output lengths, or a model with a longer context "
                                      "(max_positions=)")


def _closed_loop(concurrency, concurrency_where: str, duration, duration_where: str, file: str | None,
                 others: dict):
    """The closed loop's arrivals from ``--concurrency``/``--duration`` (or the file's
    ``requests.concurrency``/``requests.duration``)."""
    from marssim import units
    from marssim.serve.requests import closed_loop

    def where(key_where: str) -> tuple[str | None, str]:
        return (None, key_where) if key_where.startswith("--") else (file, key_where)

    if concurrency is None:
        raise InputError(*where(duration_where), "a duration bounds a closed loop; give --concurrency N too")
    for flag, value in others.items():
        if value:
            raise InputError(None, flag, "a closed loop (--concurrency) sends each request when a user's previous "
                                         "one ends; drop " + flag + " (lengths: --prompt and --output)")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(*where(concurrency_where), f"expected a positive integer (users), got {concurrency!r}")
    seconds = 0.0
    if duration is not None:
        try:
            seconds = duration if isinstance(duration, float) else units.parse(duration, "time", require_unit=True, bounded=True)
        except units.UnitError as err:
            raise InputError(*where(duration_where), str(err)) from None
        if not seconds > 0:
            raise InputError(*where(duration_where), f"expected a positive time, got {duration!r}")
    return closed_loop(concurrency, seconds)


def request_seed(args: argparse.Namespace, data: dict) -> int:
    """The seed of the requests and the random router: --seed, else the file's requests.seed,
    else 0."""
    if args.seed is not None:
        return args.seed
    value = (data.get("requests") or {}).get("seed", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InputError(args.deployment, "requests.seed", f"expected an integer from 0 to 2^63-1, got {value!r}")
    return value


def _slo(args: argparse.Namespace, data: dict):
    """The constraints of the file's ``slo`` section with ``--slo``'s bounds over them (one
    grammar: :mod:`marssim.serve.slo`)."""
    from marssim.serve.slo import Constraints, parse_slo, slo_from_mapping

    constraints = slo_from_mapping(data["slo"], args.deployment) if data.get("slo") is not None else Constraints()
    if args.slo is not None:
        constraints = constraints.overridden_by(parse_slo(args.slo))
    return constraints


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
    from marssim.search.parallel import open_executor

    if args.dask and args.workers:
        raise InputError(None, "--workers", "give --workers (local processes) or --dask (a cluster), not both")
    workers = args.workers if args.workers is not None else None
    if workers is None and not args.dask:
        import os

        workers = min(points, os.cpu_count() or 1)
    try:
        opened = open_executor(workers, args.dask, dask_timeout=args.dask_timeout or 10.0)
        executor = opened.__enter__()
    except (ImportError, ConnectionError) as exc:
        raise InputError(None, "--dask", str(exc)) from None
    with contextlib.ExitStack() as stack:
        stack.push(opened)
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
    data = _file_sections(args.deployment)
    model_spec = args.model or data.get("model")
    system_spec = args.system or data.get("system")
    if not model_spec:
        raise InputError(None, "--model", "give the model served (e.g. --model llama3-70b)")
    if not system_spec:
        raise InputError(None, "--system", "give the system (e.g. --system dgx-h100-cluster:nodes=8)")
    model = load_model(str(model_spec))
    system = load_system(str(system_spec))
    refuse_llm_off_gpus(system, str(model_spec), "--system" if args.system else "system")
    refuse_missing_precision(model, system, str(model_spec), "--model" if args.model else "model")
    deployment = _deployment(args, data)
    spec = _requests(args, data)
    constraints = _slo(args, data)
    slo = constraints.request_slo()
    args.seed = request_seed(args, data)
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
        from marssim.serve.simulate import place_replicas

        place_replicas(system, deployment)  # the deployment fits the system before any worker starts
        from marssim.serve.sweep import rate_sweep

        with _executor(args, len(rates)) as executor:
            rows = rate_sweep(deployment, model, system, cost, spec, rates, seed=args.seed, slo=slo,
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
    from marssim.serve.simulate import simulate_spec

    from marssim.serve.launch import SGLANG_SCRIPT, VLLM_SCRIPT, launch_commands, launch_lines, write_launch_scripts

    result = simulate_spec(deployment, model, system, cost, spec, seed=args.seed, slo=slo, trace=bool(args.trace))
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
