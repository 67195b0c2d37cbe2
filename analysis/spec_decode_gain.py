"""Speculative decoding's TPOT gain on a memory-bound decode: Llama-3 70B, tp 4 on one DGX H100 node.

Variants: no speculation; an 8B draft model (Llama-3 8B at tp 4, ``spec_k=4``, ``spec_alpha=0.7``);
a one-block MTP head (``spec_k=2``, ``spec_alpha=0.8``). Requests: 1,024-token prompts, 256-token
outputs, a closed loop of 1 user (each request alone) and of 16 users, 16-token context buckets.

Per variant: the iteration model's times at the mean decode context (1,024 + 128 tokens) of one
draft pass ``t_d``, one verification of ``k + 1`` tokens ``t_v`` (one decode step without
speculation), the closed form of the lone request's TPOT, ``(k t_d + t_v) / E[T]`` with
``E[T] = (1 - alpha^(k+1)) / (1 - alpha)``, against the simulated mean TPOT at concurrency 1, and the
simulated TPOT and output tokens/s at concurrency 16; the CPU seconds of the whole script.

Usage: ``python analysis/spec_decode_gain.py``. Prints a table; the committed output is
``analysis/results/spec_decode_gain.txt``.
"""

from __future__ import annotations

import os
import platform
import resource
from dataclasses import replace


def main() -> None:
    from marssim.cost import default_cost_model
    from marssim.serve import Deployment, Lengths, Pool, RequestSpec, SchedulerConfig, load_model, simulate_serving
    from marssim.serve.requests import closed_loop
    from marssim.serve.simulate import iteration_model, place_replicas
    from marssim.serve.speculative import expected_tokens_per_step
    from marssim.system import load_system

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    model = load_model("llama3-70b")
    system = load_system("dgx-h100-cluster:nodes=1")
    cost = default_cost_model()
    variants = [
        ("none", SchedulerConfig(), None),
        ("draft llama3-8b k4 a0.7", SchedulerConfig(spec_method="draft", spec_model="llama3-8b", spec_k=4,
                                                    spec_alpha=0.7), load_model("llama3-8b")),
        ("mtp 1 block k2 a0.8", SchedulerConfig(spec_method="mtp", spec_k=2, spec_alpha=0.8),
         replace(model, layers=1)),
    ]
    prompt, output, bucket = 1024, 256, 16
    ctx = prompt + output // 2
    fixed_p, fixed_o = Lengths("fixed", value=prompt), Lengths("fixed", value=output)
    print("llama3-70b tp 4 on dgx-h100-cluster:nodes=1; prompts 1,024, outputs 256 tokens; context bucket 16")
    print(f"{'speculation':<26}{'t_d ms':>8}{'t_v ms':>8}{'E[T]':>7}{'closed ms':>10}{'sim c=1':>9}{'gain':>7}"
          f"{'sim c=16':>10}{'tok/s c=16':>11}{'KV blocks':>10}")
    base = None
    for name, cfg, draft in variants:
        dep = Deployment((Pool(replicas=1, tp=4, scheduler=cfg),), context_bucket=bucket)
        stages = place_replicas(system, dep)[0][1]
        target = iteration_model(model, system, stages, cost, bucket)
        k = cfg.spec_k
        if draft is None:
            t_d = 0.0
            t_v = target.stage_times((1, 1), (0, 0), (), 1, ctx, 1)[0]
            closed = t_v
        else:
            dm = iteration_model(draft, system, stages, cost, bucket)
            t_d = dm.stage_times((1, 1), (0, 0), (), 1, ctx, 1)[0]
            vctx = target.decode_context(1, ctx + k)
            t_v = target.stage_times((1, k + 1), (1, k + 1), ((1, k + 1, vctx),), 0, 0, k + 1)[0]
            closed = (k * t_d + t_v) / expected_tokens_per_step(k, cfg.spec_alpha)
        lone = simulate_serving(dep, model, system, cost,
                                RequestSpec(closed_loop(1), fixed_p, fixed_o, 16).draw(1), seed=1)
        busy = simulate_serving(dep, model, system, cost,
                                RequestSpec(closed_loop(16), fixed_p, fixed_o, 64).draw(1), seed=1)
        tpot1 = lone.summary["tpot_s"]["mean"]
        base = base or tpot1
        et = expected_tokens_per_step(k, cfg.spec_alpha) if draft is not None else 1.0
        print(f"{name:<26}{t_d * 1e3:>8.2f}{t_v * 1e3:>8.2f}{et:>7.3f}{closed * 1e3:>10.2f}{tpot1 * 1e3:>9.2f}"
              f"{base / tpot1:>7.2f}{busy.summary['tpot_s']['mean'] * 1e3:>10.2f}"
              f"{busy.summary['output_tokens_per_s']:>11,.0f}{lone.replicas[0].memory.blocks:>10,}")
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU: {use.ru_utime + use.ru_stime:.1f} s (user + sys); max RSS {use.ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
