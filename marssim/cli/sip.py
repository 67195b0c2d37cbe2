"""``marssim sip``: SASS instruction-schedule tuning (stochastic instruction perturbation).

Subcommands: ``inspect`` (decode a cubin: kernels, blocks, control codes, legal moves and the
rules that refuse the others), ``apply`` (re-apply a schedule file to its cubin), ``verify``
(re-check a schedule's legality and the nvdisasm round trip of the patched cubin), ``build``
(compile a registered Triton kernel to a cubin offline, for its ``sm_90a`` or ``sm_80`` code
path), ``tune`` (anneal on a CUDA device). All but ``tune`` run on any machine.

``--widen`` (``inspect``, ``tune``) turns on widenings of the legality model that are argued
but not yet verified on a GPU (:class:`marssim.calibrate.sip.deps.LegalityOptions`):
``latency=observed``, ``reuse=clear``, ``commit_group`` or ``all``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from marssim.errors import InputError

from ._common import positive_int

VERB = "sip"
ORDER = 90


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(VERB, help="tune GPU kernels' native SASS schedules (SIP) and inspect cubins",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="sip_command", metavar="COMMAND", title="commands")

    q = s.add_parser("inspect", help="decode a cubin: kernels, basic blocks, control codes, legal moves")
    q.add_argument("cubin", metavar="CUBIN")
    q.add_argument("--kernel-name", help="only this kernel (default: all)")
    q.add_argument("--instructions", action="store_true",
                   help="list every instruction with its control code (stall, yield, scoreboards, waits, reuse)")
    q.add_argument("--widen", default="", metavar="WIDENINGS",
                   help="legality widenings, not verified on a GPU: latency=observed,reuse=clear,commit_group or all")
    q.set_defaults(func=run_inspect)

    b = s.add_parser("build", help="compile a registered Triton kernel to a cubin offline (needs triton, no GPU)",
                     description="Compile --kernel with Triton for its --target code path (sm_90a: Hopper; sm_80: "
                                 "Ampere, the SIP paper's setting) and write the cubin. A cubin runs only on GPUs "
                                 "of its own major version: --sass sm_90 assembles the sm_80 path for an H100.")
    b.add_argument("--kernel", required=True, help="gemm_leaky_relu, gemm or attention_fwd")
    b.add_argument("--shape", help="KEY=INT,... (only compile-time dims matter, e.g. HEAD_DIM)")
    b.add_argument("--target", choices=("sm_90a", "sm_80"), default="sm_90a", help="Triton code path (default sm_90a)")
    b.add_argument("--sass", default=None, metavar="SM", help="SASS architecture to assemble for (default: the target's; "
                                                              "sm_90 runs the sm_80 path on an H100)")
    b.add_argument("-o", "--out", required=True, metavar="FILE", help="cubin to write (atomically)")
    b.set_defaults(func=run_build)

    a = s.add_parser("apply", help="apply a schedule file to the cubin it was tuned on")
    a.add_argument("schedule", metavar="SCHEDULE.json")
    a.add_argument("cubin", metavar="CUBIN")
    a.add_argument("-o", "--out", required=True, metavar="FILE", help="patched cubin to write (atomically)")
    a.set_defaults(func=run_apply)

    v = s.add_parser("verify", help="re-check a schedule: sha256, legality of every swap, nvdisasm round trip")
    v.add_argument("schedule", metavar="SCHEDULE.json")
    v.add_argument("cubin", metavar="CUBIN")
    v.set_defaults(func=run_verify)

    t = s.add_parser("tune", help="anneal a kernel's schedule on a CUDA device (needs a GPU)",
                     description="Simulated annealing over legal schedules of a Triton kernel, timed on the GPU. "
                                 "Writes the original and tuned cubins, a schedule file and a result JSON into --out, "
                                 "and tuning=none / tuning=sip rows into the calibration CSV.")
    t.add_argument("--kernel", required=True, help="gemm_leaky_relu, gemm or attention_fwd")
    t.add_argument("--shape", help="KEY=INT,... (e.g. M=512,N=512,K=2048; default: the kernel's)")
    t.add_argument("--steps", type=positive_int, help="maximum annealing steps per seed (default: until T <= --t-min)")
    t.add_argument("--seeds", default="3", help="number of seeds (0..N-1) or a comma list (default 3)")
    t.add_argument("--t0", type=float, default=0.4, help="initial temperature (default 0.4)")
    t.add_argument("--cooling", type=float, default=0.003, help="multiplicative cooling per step (default 0.003)")
    t.add_argument("--t-min", dest="t_min", type=float, default=0.05, help="stop temperature (default 0.05)")
    t.add_argument("--move", choices=("sip", "swap"), default="sip",
                   help="sip: a memory instruction one slot up/down (default); swap: any adjacent pair")
    t.add_argument("--target", choices=("sm_90a", "sm_80"), default="sm_90a",
                   help="Triton code path to tune: sm_90a (Hopper, default) or sm_80 (Ampere: the SIP paper's "
                        "A100 setting; on an H100 its PTX is assembled for sm_90, as a cubin runs only on GPUs of "
                        "its major version)")
    t.add_argument("--widen", default="", metavar="WIDENINGS",
                   help="legality widenings NOT verified on a GPU (latency=observed,reuse=clear,commit_group or "
                        "all); every accepted schedule is still checked bit for bit on random inputs")
    t.add_argument("--repeats", type=positive_int, default=20, help="timed launches per candidate (median)")
    t.add_argument("--final-repeats", type=positive_int, default=200, help="timed launches of the final comparison")
    t.add_argument("--verify-launches", type=positive_int, default=8,
                   help="random-input launches compared for the final schedule (default 8)")
    t.add_argument("--cubin", help="tune this cubin instead of compiling the kernel with Triton")
    t.add_argument("--shared-bytes", dest="shared_bytes", type=int, default=None,
                   help="dynamic shared memory of --cubin's kernel (Triton's metadata.shared; default 0)")
    t.add_argument("--out", default="analysis/results/sip", help="output directory (default analysis/results/sip)")
    t.add_argument("--calibration", default=None,
                   help="CSV to merge timings into ('' for none; default traces/calibration/sip.csv for GEMM "
                        "kernels, traces/fused-attention/sip.csv for fused attention, which is not one zoo op)")
    t.set_defaults(func=run_tune)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _listings(path: str, kernel: str | None):
    from marssim.calibrate.sip.cubin import read_cubin
    from marssim.calibrate.sip.sass import NvdisasmMissing, disassemble

    cubin = read_cubin(path)
    try:
        return cubin, disassemble(cubin, kernel)
    except NvdisasmMissing as err:
        raise InputError(path, "nvdisasm", str(err)) from None


def _widen(text: str):
    from marssim.calibrate.sip.deps import LegalityOptions

    try:
        return LegalityOptions.parse(text)
    except ValueError as err:
        raise InputError(None, "--widen", str(err)) from None


def run_inspect(args: argparse.Namespace) -> int:
    from marssim.calibrate.sip.deps import Legality
    from marssim.calibrate.sip.perturb import legal_swaps, sip_move_reasons, sip_moves

    options = _widen(args.widen)
    cubin, listings = _listings(args.cubin, args.kernel_name)
    print(f"{args.cubin}: {cubin.arch}, {len(cubin.kernels)} kernel(s), sha256 {cubin.sha256[:16]}...")
    if options.widened:
        print(f"legality widened (not verified on a GPU): {', '.join(options.widened)}")
    for name, lst in listings.items():
        lg = Legality(lst, options)
        order = tuple(range(len(lst)))
        cats = Counter(i.category for i in lst.instructions)
        swaps = legal_swaps(lg, order)
        moves = sip_moves(lg, order)
        reasons = Counter(lg.check(order, p).reason or "legal" for p in range(len(lst) - 1))
        refused = sip_move_reasons(lg, order)
        any_rule = Counter(r for rules in refused for r in rules)
        sole = Counter(rules[0] for rules in refused if len(rules) == 1)
        print(f"\nkernel {name}: {len(lst)} instructions in {len(lst.blocks)} basic blocks; "
              f"{cats['memory']} memory, {cats['variable']} variable-latency, {cats['fixed']} fixed-latency, "
              f"{cats['fence']} fences; {len(lst.pinned)} pinned by .nv.info/relocations")
        print(f"  legal adjacent swaps {len(swaps)}, legal SIP moves {len(moves)} of {len(moves) + len(refused)}")
        print("  swaps refused by rule: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()) if r != "legal"))
        print("  SIP moves refused, by every rule that refuses them: "
              + ", ".join(f"{r} {n}" for r, n in any_rule.most_common()))
        print("  SIP moves refused by one rule alone: " + ", ".join(f"{r} {n}" for r, n in sole.most_common()))
        print("  blocks: " + " ".join(f"[{b.start}-{b.end - 1}]" for b in lst.blocks))
        if args.instructions:
            block_of = lst.block_of()
            for ins in lst.instructions:
                print(f"  {ins.offset:#06x} b{block_of[ins.index]:<3d} {ins.control.describe():24s} "
                      f"{ins.category:8s} {ins.text}")
    return 0


def run_apply(args: argparse.Namespace) -> int:
    from marssim.calibrate.sip.schedule_file import apply_file

    schedule = apply_file(args.schedule, args.cubin, args.out)
    print(f"wrote {args.out}: kernel {schedule.kernel}, {len(schedule.swaps)} swaps, "
          f"{schedule.moved()} of {schedule.instructions} instructions moved")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from marssim.calibrate.sip.perturb import roundtrip_mismatches
    from marssim.calibrate.sip.schedule_file import apply_schedule, load_schedule

    from marssim.calibrate.sip.deps import reuse_cleared

    schedule = load_schedule(args.schedule)
    cubin, listings = _listings(args.cubin, None)
    data = apply_schedule(schedule, cubin, None, args.schedule)
    listing = listings[schedule.kernel]
    cleared = reuse_cleared(listing, schedule.order) if schedule.legality.reuse == "clear" else frozenset()
    problems = roundtrip_mismatches(listing, data, schedule.kernel, schedule.order, cleared)
    if problems:
        print(f"{args.schedule}: the patched cubin does not read back as the same instructions:", file=sys.stderr)
        for line in problems[:20]:
            print("  " + line, file=sys.stderr)
        return 1
    prov = schedule.provenance
    print(f"{args.schedule}: ok: sha256 matches, {len(schedule.swaps)} swaps legal, nvdisasm reads the patched "
          f"{schedule.kernel} back as the same {schedule.instructions} instructions ({schedule.moved()} moved)")
    if schedule.legality.widened:
        print(f"  legality widened (not verified on a GPU): {', '.join(schedule.legality.widened)}"
              + (f"; {len(cleared)} reuse flags cleared" if cleared else ""))
    if prov:
        print(f"  tuned on {prov.get('device', '?')}: verified on {prov.get('verified_elements', '?')} output "
              f"elements, {prov.get('mismatches', '?')} mismatches")
    return 0


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        if "," in text:
            seeds = tuple(int(x) for x in text.split(",") if x.strip())
        else:
            seeds = tuple(range(int(text)))
    except ValueError:
        seeds = ()
    if not seeds or any(s < 0 for s in seeds):
        raise InputError(None, "--seeds", f"expected a positive count or a comma list of seeds >= 0, got {text!r}")
    return seeds


def run_tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from marssim.calibrate.sip.anneal import AnnealConfig
    from marssim.calibrate.sip.kernels import get_kernel, parse_shape

    spec = get_kernel(args.kernel)
    shape = parse_shape(spec, args.shape)
    seeds = _parse_seeds(args.seeds)
    legality = _widen(args.widen)
    try:
        config = AnnealConfig(args.t0, args.cooling, args.t_min, args.move, args.steps)
    except ValueError as err:
        raise InputError(None, "--t0/--cooling/--t-min", str(err)) from None
    cubin = None
    if args.cubin:
        try:
            cubin = Path(args.cubin).read_bytes()
        except OSError as err:
            raise InputError(args.cubin, "--cubin", f"cannot read: {err.strerror}") from None

    from marssim.calibrate.sip.gpu import cuda_device_available

    ok, why = cuda_device_available()
    if not ok:
        print(f"marssim sip tune: error: a CUDA device is required to time kernels ({why}); "
              "inspect, apply and verify run without one", file=sys.stderr)
        return 2
    from marssim.calibrate.sip.tune import TuneOptions, tune

    calibration = args.calibration
    if calibration is None:
        calibration = ("traces/fused-attention/sip.csv" if spec.name.startswith("attention")
                       else "traces/calibration/sip.csv")
    if legality.widened:
        print(f"marssim sip tune: legality widened, NOT verified on a GPU: {', '.join(legality.widened)}; every "
              "accepted schedule is still checked bit for bit against the original", file=sys.stderr)
    options = TuneOptions(spec, shape, seeds, config, args.repeats, 1, args.final_repeats, args.verify_launches,
                          Path(args.out), Path(calibration) if calibration else None, cubin,
                          shared_bytes=args.shared_bytes or 0, legality=legality, target=args.target)
    report = tune(options, progress=lambda line: print(line, file=sys.stderr, flush=True))
    b, t = report.baseline, report.tuned
    print(f"{report.kernel} {shape} on {report.device}")
    print(f"  baseline {b['median_s'] * 1e6:9.2f} us (IQR {b['iqr_s'] * 1e6:.2f} us, n={b['samples']})")
    print(f"  SIP      {t['median_s'] * 1e6:9.2f} us (IQR {t['iqr_s'] * 1e6:.2f} us, n={t['samples']})")
    print(f"  latency -{report.latency_reduction * 100:.2f}%  speed-up x{report.speedup:.4f}; "
          f"{report.moved_instructions} instructions moved; verified on {report.verified_elements} output elements "
          f"from {report.verified_launches} random inputs: {report.mismatches} mismatches")
    for name, path in report.files.items():
        print(f"  {name:9s} {path}")
    return 0 if report.mismatches == 0 else 1


def run_build(args: argparse.Namespace) -> int:
    from marssim.calibrate.sip.kernels import compile_cubin, get_kernel, parse_shape
    from marssim.fsutil import atomic_file

    spec = get_kernel(args.kernel)
    shape = parse_shape(spec, args.shape)
    if args.sass is not None and not (args.sass.startswith("sm_") and args.sass[3:5].isdigit()):
        raise InputError(None, "--sass", f"expected an SM architecture like sm_90, got {args.sass!r}")
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        print("marssim sip build: error: needs triton (pip install 'marssim[gpu]' or triton alone; no GPU needed)",
              file=sys.stderr)
        return 2
    data, meta = compile_cubin(spec, shape, arch=int(args.target[3:5]), sass_arch=args.sass)
    with atomic_file(args.out, "wb") as fh:
        fh.write(data)
    print(f"wrote {args.out}: {meta['kernel']} ({args.target} code path, SASS {meta['arch']}), "
          f"{meta['num_warps']} warps, {meta['shared_bytes']} bytes of shared memory, Triton {meta['triton']}")
    return 0
