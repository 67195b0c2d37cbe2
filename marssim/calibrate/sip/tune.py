"""The GPU tuning run: compile, anneal with measured times, verify, and write the results.

:func:`tune` needs a CUDA device (``marssim sip tune`` checks for one first). Per candidate
schedule it patches the cubin, loads it with ``cuModuleLoadData`` and times ``repeats`` launches
(median of CUDA-event times, L2 flushed before each). A candidate that annealing would accept
must produce bitwise the same outputs as the original kernel on ``check_launches`` fresh random
inputs. The best schedule is finally re-timed against the original, interleaved, and verified on
``verify_launches`` random inputs; every output element compared counts as one sample.

Outputs in ``out_dir``: ``<kernel>.original.cubin``, ``<kernel>.sip.cubin``,
``<kernel>.schedule.json``, ``<kernel>.result.json``; calibration rows (``tuning=none`` and
``tuning=sip``) merged into ``calibration_csv``.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from marssim.calibrate.table import short_device_name
from marssim.fsutil import atomic_file

from .anneal import AnnealConfig, anneal_seeds
from .calibration import CalibrationRow, gemm_class_shape, merge_rows
from .cubin import Cubin, parse_cubin
from .deps import Legality, LegalityOptions
from .kernels import KernelSpec, compile_cubin, sass_arch_for
from .perturb import cleared_for, patch_for, roundtrip_mismatches
from .sass import disassemble, nvdisasm_version
from .schedule_file import new_schedule, save_schedule

__all__ = ["TuneOptions", "TuneReport", "tune"]


@dataclass(frozen=True)
class TuneOptions:
    """What to tune and how hard: annealing parameters, timing repeats per candidate, random
    input launches per acceptance check, final timing repeats and verification launches."""

    spec: KernelSpec
    shape: Mapping[str, int]
    seeds: tuple[int, ...] = (0, 1, 2)
    anneal: AnnealConfig = AnnealConfig()
    repeats: int = 20
    check_launches: int = 1
    final_repeats: int = 200
    verify_launches: int = 8
    out_dir: Path = Path("analysis/results/sip")
    calibration_csv: Path | None = Path("traces/calibration/sip.csv")
    cubin: bytes | None = None
    input_seed: int = 12345
    shared_bytes: int = 0
    legality: LegalityOptions = LegalityOptions()
    target: str = "sm_90a"


@dataclass
class TuneReport:
    """Everything a tuning run measured."""

    kernel: str
    shape: dict[str, int]
    device: str
    driver: str
    baseline: dict[str, float]
    tuned: dict[str, float]
    speedup: float
    latency_reduction: float
    verified_elements: int
    verified_launches: int
    mismatches: int
    moved_instructions: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)


def _stats(times) -> dict[str, float]:
    from .gpu import summarize

    s = summarize(times)
    return {"median_s": s.median, "iqr_s": s.iqr, "min_s": s.minimum, "max_s": s.maximum, "samples": s.samples,
            "spread": s.spread}


def tune(options: TuneOptions, progress: Callable[[str], None] = lambda line: None) -> TuneReport:
    """Run SIP on one kernel and shape; see the module docstring. Needs a CUDA device."""
    from .gpu import GpuSession, outputs_match

    spec, shape = options.spec, dict(options.shape)
    if options.cubin is None:
        from .gpu import device_capability

        sass = sass_arch_for(options.target, device_capability())
        cubin_bytes, meta = compile_cubin(spec, shape, arch=int(options.target[3:5]), sass_arch=sass)
    else:
        cubin_bytes, meta = options.cubin, {"kernel": None, "shared_bytes": options.shared_bytes, "triton": "",
                                            "arch": ""}
    if meta.get("global_scratch_size") or meta.get("profile_scratch_size"):
        raise RuntimeError(f"{spec.name}: Triton asks for scratch memory; this launcher passes null scratch "
                           "pointers and supports only kernels that need none")
    cubin: Cubin = parse_cubin(cubin_bytes)
    kname = cubin.kernel(meta.get("kernel")).name
    listing = disassemble(cubin, kname)[kname]
    legality = Legality(listing, options.legality)
    rng = np.random.default_rng(options.input_seed)
    plan = spec.plan(shape, rng)

    with GpuSession() as gpu:
        gpu.upload(plan)
        original = gpu.load(cubin_bytes, kname, meta.get("shared_bytes", 0))
        progress(f"{spec.name} {shape} on {gpu.device_name()}: {len(listing)} instructions, "
                 f"{sum(1 for i in listing.instructions if i.mem)} memory")
        reference = spec.reference(plan)
        got = gpu.run(original, plan)
        ref_err = max(float(np.max(np.abs(got[n].astype(np.float32) - reference[n].astype(np.float32))))
                      for n in plan.outputs)
        progress(f"original kernel vs numpy reference: max abs difference {ref_err:.3g}")

        def fresh_inputs() -> None:
            nonlocal plan
            plan = spec.plan(shape, rng)
            gpu.refill(plan)

        def measure(order) -> float:
            k = gpu.load(patch_for(legality, cubin, order), kname, meta.get("shared_bytes", 0))
            try:
                return float(np.median(gpu.time(k, plan, options.repeats, warmup=2)))
            finally:
                gpu.unload(k)

        def check(order) -> bool:
            k = gpu.load(patch_for(legality, cubin, order), kname, meta.get("shared_bytes", 0))
            try:
                for _ in range(options.check_launches):
                    fresh_inputs()
                    ok, _bad = outputs_match(gpu.run(original, plan), gpu.run(k, plan))
                    if not ok:
                        return False
                return True
            finally:
                gpu.unload(k)

        def on_step(seed, step, total, temperature, current, best) -> None:
            if step % 25 == 0 or step == total:
                progress(f"seed {seed} step {step}/{total} T={temperature:.3f} current {current * 1e6:.2f} us "
                         f"best {best * 1e6:.2f} us")

        result = anneal_seeds(legality, measure, check, options.seeds, options.anneal, on_step)
        best = result.best

        # final: interleaved timing of original and tuned, then verification on fresh inputs
        tuned_bytes = patch_for(legality, cubin, best.best_order)
        tuned = gpu.load(tuned_bytes, kname, meta.get("shared_bytes", 0))
        base_times, tuned_times = [], []
        for _ in range(10):
            base_times += gpu.time(original, plan, options.final_repeats // 10, warmup=2)
            tuned_times += gpu.time(tuned, plan, options.final_repeats // 10, warmup=2)
        mismatches = elements = 0
        for _ in range(options.verify_launches):
            fresh_inputs()
            ok, bad = outputs_match(gpu.run(original, plan), gpu.run(tuned, plan))
            mismatches += bad
            elements += sum(plan.args[plan.arg_names.index(n)].size for n in plan.outputs)
        device, driver, cuda = gpu.device_name(), gpu.nvidia_driver(), gpu.driver_version()
        sms = gpu.sm_count()

    base, tun = _stats(base_times), _stats(tuned_times)
    date = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    import marssim

    provenance = {
        "marssim": marssim.__version__, "triton": meta.get("triton", ""), "nvdisasm": nvdisasm_version(),
        "python": platform.python_version(), "device": device, "driver": driver, "cuda": cuda, "date": date,
        "kernel": spec.name, "shape": shape, "seeds": list(options.seeds), "anneal": asdict(options.anneal),
        "repeats_per_candidate": options.repeats, "check_launches": options.check_launches,
        "best_seed": best.seed, "steps": [r.steps for r in result.runs], "baseline": base, "tuned": tun,
        "verified_launches": options.verify_launches, "verified_elements": elements, "mismatches": mismatches,
        "loader": "cuda-python cuModuleLoadData + cuLaunchKernel",
        "target": meta.get("target", options.target), "sass_arch": meta.get("arch", ""),
        "legality": options.legality.to_json(),
        "unverified_widenings": list(options.legality.widened),
    }
    out = Path(options.out_dir)
    stem = f"{spec.name}." + "_".join(f"{k}{v}" for k, v in shape.items()) \
        + ("" if options.target == "sm_90a" else f".{options.target}")
    files = {"original": str(out / f"{stem}.original.cubin"), "tuned": str(out / f"{stem}.sip.cubin"),
             "schedule": str(out / f"{stem}.schedule.json"), "result": str(out / f"{stem}.result.json")}
    problems = roundtrip_mismatches(listing, tuned_bytes, kname, best.best_order,
                                    cleared_for(legality, best.best_order))
    if problems:
        raise RuntimeError(f"patched cubin does not read back: {problems[:3]}")
    with atomic_file(files["original"], "wb") as fh:
        fh.write(cubin_bytes)
    with atomic_file(files["tuned"], "wb") as fh:
        fh.write(tuned_bytes)
    schedule = new_schedule(cubin, kname, best.best_swaps, best.best_order, provenance, options.legality)
    save_schedule(schedule, files["schedule"])
    report = TuneReport(spec.name, shape, device, driver, base, tun, base["median_s"] / tun["median_s"],
                        1.0 - tun["median_s"] / base["median_s"], elements, options.verify_launches, mismatches,
                        schedule.moved(), [
                            {"seed": r.seed, "steps": r.steps, "accepted": r.accepted,
                             "check_failures": r.check_failures, "initial_s": r.initial_time, "best_s": r.best_time}
                            for r in result.runs], files, provenance)
    with atomic_file(files["result"]) as fh:
        json.dump(asdict(report), fh, indent=1, default=str)
        fh.write("\n")
    if options.calibration_csv is not None and mismatches == 0:
        # the code path is the backend: the sm_90a and sm_80 builds of one shape are two kernels
        common = dict(dtype="fp16", device=short_device_name(device), sms=sms, driver=driver, cuda=cuda, date=date[:10],
                      kernel=spec.name, backend=f"triton-{meta.get('target', options.target)}",
                      **gemm_class_shape(spec.name, shape))
        merge_rows(options.calibration_csv, [
            CalibrationRow(tuning="none", median_s=base["median_s"], spread_s=base["iqr_s"],
                           samples=int(base["samples"]), note=f"compiler schedule on {device}", **common),
            CalibrationRow(tuning="sip", median_s=tun["median_s"], spread_s=tun["iqr_s"], samples=int(tun["samples"]),
                           note=f"schedule {Path(files['schedule']).name}; verified on {elements} output elements"
                                + (f"; legality widened ({', '.join(options.legality.widened)})"
                                   if options.legality.widened else ""), **common),
        ])
    return report
