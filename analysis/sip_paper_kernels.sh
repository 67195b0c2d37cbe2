#!/usr/bin/env bash
# SIP on the paper's two kernels, on a CUDA device (H100/H200 for the sm_90a Triton kernels).
# Needs: pip install -e ".[gpu]" (cuda-python, triton, nvdisasm). Writes into analysis/results/sip/
# the original and tuned cubins, schedule files and result JSON, merges tuning=none/sip rows into
# traces/calibration/sip.csv, and prints a summary table to analysis/results/sip_paper_kernels.txt.
# Paper settings: T0=0.4, cooling 0.003 per step, stop at T<=0.05 (693 steps), several seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
marssim sip tune --kernel gemm_leaky_relu --shape M=512,N=512,K=2048 --seeds 4 --repeats 20 \
    --final-repeats 400 --verify-launches 8 --out analysis/results/sip
marssim sip tune --kernel attention_fwd --shape Z=4,H=48,N_CTX=4096,HEAD_DIM=64 --seeds 2 --repeats 10 \
    --final-repeats 100 --verify-launches 2 --out analysis/results/sip
python analysis/sip_results_table.py analysis/results/sip | tee analysis/results/sip_paper_kernels.txt
