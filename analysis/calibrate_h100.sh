#!/usr/bin/env bash
# Measure marssim's GPU calibration tables on an NVIDIA H100 or H200, fit them, write the report
# and commit the results. Run from anywhere inside the checkout, on the machine with the GPU:
#
#     pip install -e '.[gpu]'          # torch with CUDA, triton, cuda-python
#     analysis/calibrate_h100.sh       # COMMIT=0 to leave the results uncommitted
#
# The grid (the zoo's layer shapes plus a sweep around them) is split into chunks whose
# estimated timing fits well inside 10 minutes; each chunk runs as its own command under a
# 600 s timeout and stops by itself before 540 s. A chunk cut short is resumed by running it
# again (kernels already in the table are skipped), up to three times. Then the LLM grid
# (`marssim calibrate measure --llm`: the kernels GPT-3 175B/13B and Llama 3 8B/70B layers run
# in training, prefill and decode at tensor-parallel degrees 1, 2, 4, 8 -- forward, input- and
# weight-gradient GEMMs, attention products and fused attention per scaled-dot-product backend,
# norms, activations and their gradients, AdamW) goes into the same table, chunk by chunk
# (LLM=0 leaves it out).
#
# Outputs:
#   traces/calibration/<GPU>.csv          per-op kernel timings (the dgx-h100 design reads H100.csv)
#   traces/calibration/<GPU>.fit.json     fitted efficiency-curve parameters, held-out errors
#   traces/fused-attention/<GPU>.csv      fused attention (torch SDPA) timings, for comparison
#   analysis/results/calibration_<GPU>.txt  held-out error per kind/dtype; ResNet-50 and BERT-base
#                                         simulated on dgx-h100 against the measured layer times
#   traces/held-out/<GPU>-shards.csv      bf16/fp32 layer shards kept out of the table
#   analysis/results/shard_prediction.txt the model's error on them (H100)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

WORKLOADS="${WORKLOADS:-resnet50,bert-base,gpt2,vit-b16,mobilenetv2,vgg16}"
KINDS="${KINDS:-gemm,conv,attention,elementwise,norm,softmax,pool,embedding,fused-attention}"
DTYPES="${DTYPES:-bf16,fp16,fp32}"
CHUNK_SECONDS="${CHUNK_SECONDS:-240}"
COMMIT="${COMMIT:-1}"
LLM="${LLM:-1}"

GPU=$(python - <<'EOF'
import sys
from marssim.calibrate.device import torch_cuda_status
from marssim.calibrate.table import short_device_name
ok, name = torch_cuda_status()
if not ok:
    sys.exit(f"no CUDA device: {name}")
print(short_device_name(name))
EOF
)
case "$GPU" in
  H100|H200) ;;
  *) if [ "${ANY_GPU:-0}" != 1 ]; then
       echo "found a $GPU; the tables are meant for H100/H200 (ANY_GPU=1 measures it anyway)" >&2
       exit 2
     fi ;;
esac
TABLE="traces/calibration/$GPU.csv"
FUSED="traces/fused-attention/$GPU.csv"
REPORT="analysis/results/calibration_$GPU.txt"
GRID=(--workloads "$WORKLOADS" --kinds "$KINDS" --dtype "$DTYPES" --chunk-seconds "$CHUNK_SECONDS")

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv || true

# measure_chunks GRID-FLAGS...: every chunk of that grid, each resumed up to three times
measure_chunks() {
  marssim calibrate grid "$@"
  local chunks i attempt rc
  chunks=$(marssim calibrate grid "$@" | grep -c '^  chunk ')
  for ((i = 1; i <= chunks; i++)); do
    for attempt in 1 2 3; do
      echo "== chunk $i of $chunks, attempt $attempt" >&2
      set +e
      timeout 600 marssim calibrate measure "$@" --chunk "$i" --out "$TABLE" --fused-out "$FUSED"
      rc=$?
      set -e
      if [ "$rc" -eq 0 ]; then break; fi
      # 3: stopped at the time limit with kernels left; 124: killed by timeout (rows so far are kept)
      if [ "$rc" -ne 3 ] && [ "$rc" -ne 124 ]; then exit "$rc"; fi
    done
  done
}

measure_chunks "${GRID[@]}"
if [ "$LLM" = 1 ]; then
  # cuBLAS only (--no-triton): the cost model prefers the vendor rows of a shape anyway
  measure_chunks --llm --no-triton --chunk-seconds "$CHUNK_SECONDS"
  marssim calibrate check "$TABLE" --workloads "gpt3-175b:mode=train,layers=2,llama3-70b:mode=train,seq=4096,layers=2"
fi

# the fp16 shards of the GEMM-class layers (the zoo's dtype) go into the table, so that
# model-parallel mappings are charged measured times for 2-, 4- and 8-way splits; the bf16 and
# fp32 shards are kept apart, to test the model on shapes it never saw (shard_prediction.py)
SHARDS=(--workloads "$WORKLOADS" --kinds gemm,conv,attention --no-sweep --shards 2,4,8)
HELD_OUT="traces/held-out/$GPU-shards.csv"
mkdir -p traces/held-out
timeout 600 marssim calibrate measure "${SHARDS[@]}" --dtype fp16 --out "$TABLE" --max-seconds 540
timeout 600 marssim calibrate measure "${SHARDS[@]}" --dtype bf16,fp32 --out "$HELD_OUT" --max-seconds 540

marssim calibrate check "$TABLE" --workloads resnet50,bert-base
marssim calibrate fit "$TABLE"
if [ "$GPU" = H100 ]; then
  python analysis/calibration_report.py "$TABLE" > "$REPORT"
  python analysis/shard_prediction.py --table "$TABLE" --held-out "$HELD_OUT" > analysis/results/shard_prediction.txt
else  # the shipped dgx-h100 design reads H100: for another GPU, report the fit only
  python analysis/calibration_report.py "$TABLE" --workloads "" > "$REPORT"
fi
cat "$REPORT"

if [ "$COMMIT" = 1 ]; then
  git add "$TABLE" "${TABLE%.csv}.fit.json" "$REPORT" "$HELD_OUT"
  if [ "$GPU" = H100 ]; then git add analysis/results/shard_prediction.txt; fi
  [ -f "$FUSED" ] && git add "$FUSED"
  git commit -m "Calibration tables measured on $GPU, fitted, with the held-out error report"
fi
