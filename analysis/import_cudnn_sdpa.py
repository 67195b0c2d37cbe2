"""Write the attention kernel sets of ``traces/attention-kernels/`` from NVIDIA's cuDNN frontend
benchmark results (github.com/NVIDIA/cudnn-frontend, MIT licence), read from a git directory of
that repository at the commits named below::

    python analysis/import_cudnn_sdpa.py PATH/TO/cudnn-frontend [--out traces/attention-kernels]

Each set is one published results file (or a bf16 and an FP8 file of one run) of forward and
backward TFLOP/s per backend, element type, mask and shape, rewritten as
``backend,dtype,causal,batch,heads,kv_heads,seq,head_dim,fwd_tflops,bwd_tflops`` with the source
(commit, path, date, container, cuDNN version, GPU) in its header. Backends: ``flash`` for
FlashAttention-2 (PyTorch's SDPA flash backend in the 2024-2025 files, the flash-attn package in
the later ones), ``cudnn`` for cuDNN's fused attention (through PyTorch or the frontend); other
backends (PyTorch's math path) are left out. The TFLOP/s count is the benchmark's
(``4 b s^2 h d``, halved when causal, and 2.5 times that backward) and is kept as published.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "traces" / "attention-kernels"
COLUMNS = ("backend", "dtype", "causal", "batch", "heads", "kv_heads", "seq", "head_dim", "fwd_tflops", "bwd_tflops")
GPU_NOTE_H200 = ("not stated in the file; the benchmark's README locks an H200's clocks (3,201 MHz memory, 1,980 MHz "
                 "SMs, 700 W) and the commit that published the 2025 results names H200, so an H200 SXM is assumed")


@dataclass(frozen=True)
class Source:
    """One set: its name, the commit and files it is read from, and what they do not say."""

    name: str
    commit: str
    files: tuple[str, ...]
    container: str
    cudnn: str
    gpu: str
    gpu_note: str
    flash: str = "the flash-attn package"


SOURCES = (
    Source("pytorch-24.03-h200", "b740542818f36857acf7f9853f749bbad4118c65", ("benchmark/benchmark_results.csv",),
           "nvcr.io/nvidia/pytorch:24.03-py3", "9.1.0 (the README's sample output: backend version 90100)", "H200",
           GPU_NOTE_H200, "PyTorch's scaled_dot_product_attention, its flash backend enabled"),
    Source("pytorch-24.12-h200", "7606332572705e2e89e025ac7546a8bbffbf5cab",
           ("benchmark/sdpa_benchmark/benchmark_results.csv",), "nvcr.io/nvidia/pytorch:24.12-py3",
           "not stated (the container's apt cudnn package when the image was built)",
           "H200", GPU_NOTE_H200, "PyTorch's scaled_dot_product_attention, its flash backend enabled"),
    Source("pytorch-25.09-b200", "be6c079be8aaffa0fc079fcf039887e637c289c7",
           ("benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv",
            "benchmark/sdpa_benchmark_training/artifacts/sdpa_fp8_benchmark_results_NVIDIA_B200.csv"),
           "nvcr.io/nvidia/pytorch:25.09-py3", "9.13.1 (the sample runs' backend version 91301), frontend 1.14.1",
           "B200", "NVIDIA B200, free clock (the files' names and the README)"),
    Source("pytorch-25.11-gb200", "b372d39879d44c91a8d5b342022e74802b6a8da2",
           ("benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv",
            "benchmark/sdpa_benchmark_training/artifacts/sdpa_fp8_benchmark_results_NVIDIA_GB200.csv"),
           "nvcr.io/nvidia/pytorch:25.11-py3", "9.17.0 (the sample runs' backend version 91700), frontend 1.16.0",
           "GB200", "NVIDIA GB200 (the files' names and the sample runs)"),
    Source("pytorch-25.12-h200", "df73764adb98b7445b77662ce07b1ea434c8f3ee",
           ("benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv",),
           "nvcr.io/nvidia/pytorch:25.12-py3", "9.19.1 (the file's backend version 91901), frontend 1.19.0", "H200",
           "NVIDIA H200 (the file's gpu_name column)"),
    Source("pytorch-25.12-gb200", "df73764adb98b7445b77662ce07b1ea434c8f3ee",
           ("benchmark/sdpa_benchmark_training/results/gb200_919_only_cudnn/llama3.1_20260226_174648.csv",),
           "nvcr.io/nvidia/pytorch:25.12-py3", "9.19.1 (the file's backend version 91901), frontend 1.19.0", "GB200",
           "NVIDIA GB200 (the file's gpu_name column)"),
)

_WIDE = {  # the 2024-2025 files: one row per shape, a column pair per backend
    "pytorch BF16 (TFlops/s fwd)": ("flash", "bf16", "fwd"), "pytorch BF16 (TFlops/s bwd)": ("flash", "bf16", "bwd"),
    "cudnn BF16 (TFlops/s fwd)": ("cudnn", "bf16", "fwd"), "cudnn BF16 (TFlops/s bwd)": ("cudnn", "bf16", "bwd"),
    "Pytorch FWD (TFLOPs/s)": ("flash", "bf16", "fwd"), "Pytorch BWD (TFLOPs/s)": ("flash", "bf16", "bwd"),
    "cuDNN BF16 FWD (TFLOPs/s)": ("cudnn", "bf16", "fwd"), "cuDNN BF16 BWD (TFLOPs/s)": ("cudnn", "bf16", "bwd"),
    "cuDNN FP8 FWD (TFLOPs/s)": ("cudnn", "fp8", "fwd"), "cuDNN FP8 BWD (TFLOPs/s)": ("cudnn", "fp8", "bwd"),
}
_BACKENDS = {"pyt_cudnn": "cudnn", "cudnn_fe": "cudnn", "flash_attention": "flash"}
"""Long files' backends kept (the flash-attn package, not PyTorch's copy of it, is what
Transformer Engine calls)."""


def _show(repo: Path, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def _rows(text: str) -> list[dict]:
    """One output row per (backend, dtype, shape) of a results file of either layout."""
    table = list(csv.DictReader(io.StringIO(text)))
    out = []
    for r in table:
        if "data_type" in r:  # the 2026 files: one row per backend, type, mask and shape, times in ms
            causal = {"top_left": "true", "no_mask": "false"}.get(r["attn_mask"])
            if (r["backend"] != "cudnn" or causal is None or r["q_seqlen"] != r["kv_seqlen"]
                    or r["head_dim_qk"] != r["head_dim_vo"] or r["deterministic_bwd"] != "False"
                    or r["success"] != "True" or r.get("sliding_window_size")):
                continue
            out.append({"backend": "cudnn", "dtype": {"bfloat16": "bf16"}.get(r["data_type"], r["data_type"]),
                        "causal": causal, "batch": r["batch_size"], "heads": r["num_q_heads"],
                        "kv_heads": r["num_kv_heads"], "seq": r["q_seqlen"], "head_dim": r["head_dim_qk"],
                        "fwd_tflops": float(r["fwd_tflops"]), "bwd_tflops": float(r["bwd_tflops"])})
            continue
        if "backend" in r or "precision" in r:  # long: one row per backend or precision
            backend = _BACKENDS.get(r.get("backend", "pyt_cudnn"))
            if backend is None or r["q_seqlen"] != r["kv_seqlen"]:
                continue
            out.append({"backend": backend, "dtype": r.get("precision", "bf16"), "causal": r["is_causal"].lower(),
                        "batch": r["batch_size"], "heads": r["num_q_heads"], "kv_heads": r["num_kv_heads"],
                        "seq": r["q_seqlen"], "head_dim": r["head_dim"], "fwd_tflops": float(r["fwd_tflops_per_sec"]),
                        "bwd_tflops": float(r["bwd_tflops_per_sec"])})
            continue
        heads = r.get("Number of heads") or r["Heads"]
        shape = {"causal": (r.get("causal") or r["Causal"]).strip().lower(), "batch": r["Batch"], "heads": heads,
                 "kv_heads": heads, "seq": r["Sequence length"], "head_dim": r["Head dim"]}
        pairs: dict[tuple[str, str], dict] = {}
        for column, (backend, dtype, phase) in _WIDE.items():
            if column in r:
                pairs.setdefault((backend, dtype), {})[phase] = float(r[column])
        for (backend, dtype), rate in pairs.items():
            out.append({"backend": backend, "dtype": dtype, **shape, "fwd_tflops": rate["fwd"],
                        "bwd_tflops": rate["bwd"]})
    return out


def write(repo: Path, source: Source, out: Path) -> Path:
    """Write set ``source`` read from ``repo`` into directory ``out``; its path."""
    date = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%cs", source.commit], capture_output=True,
                          text=True, check=True).stdout.strip()
    rows, seen = [], set()
    for path in source.files:  # a kernel a later file of the run measured again (bf16 beside FP8): the first
        for r in _rows(_show(repo, source.commit, path)):
            key = tuple(r[c] for c in COLUMNS[:8])
            if key not in seen and r["fwd_tflops"] > 0 and r["bwd_tflops"] > 0:  # 0: a shape that did not run
                seen.add(key)
                rows.append(r)
    header = [
        "Fused attention kernels as published by NVIDIA's cuDNN frontend benchmark (github.com/NVIDIA/cudnn-frontend,",
        f"MIT licence, the repository's LICENSE.txt) at commit {source.commit} ({date}): {', '.join(source.files)};",
        f"forward and backward throughput of scaled-dot-product attention in the {source.container} container,",
        f"cuDNN {source.cudnn}. Backend flash: FlashAttention-2 ({source.flash}); cudnn: cuDNN's fused attention.",
        f"GPU: {source.gpu_note}.",
        "TFLOP/s as the benchmark counts them: 4 x batch x seq^2 x heads x head_dim per forward (halved when causal),",
        "2.5 times that per backward. Spread and sample count: not published per row. Imported by",
        "analysis/import_cudnn_sdpa.py.",
        f"gpu: {source.gpu}",
    ]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "fwd_tflops": f"{r['fwd_tflops']:.2f}", "bwd_tflops": f"{r['bwd_tflops']:.2f}"})
    path = out / f"{source.name}.csv"
    path.write_text("".join(f"# {line}\n" for line in header) + buf.getvalue(), encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path, help="a git directory of github.com/NVIDIA/cudnn-frontend")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for source in SOURCES:
        path = write(args.repo, source, args.out)
        print(f"{path}: {sum(1 for line in path.open() if line[0] not in '#b')} rows")


if __name__ == "__main__":
    main()
