#!/usr/bin/env bash
# The observed column on one H200: the report's whole-step speedups for every Hopper recipe against a
# plain loop with its optimizer step (an HF Qwen2 through Lightning's TE plugin, GPU-bound and
# host-bound), and the README's main command's wall time. Results: docs/results/h200.md.
#
#   bash benchmarks/h200_observed.sh OUT [observed|main|all]
#
# Needs transformers on the host (offline: pip install --no-index --find-links WHEELS transformers).
set -uo pipefail
out=$(realpath -m "${1:?output folder}"); what=${2:-all}
mkdir -p "$out"
quiet() { grep -v -i -E "warn|litlogger|tpu|gpu available|cuda_visible|^ *$" || true; }
if [[ $what == observed || $what == all ]]; then
    for m in gpu host; do
        python benchmarks/observed_vs_plain.py --model "$m" --fits 1 --json "$out/observed_$m.json" 2>&1 | quiet \
            | grep -E "fit [0-9]|Error|error" 
    done
fi
if [[ $what == main || $what == all ]]; then
    start=$(date +%s.%N)
    te-gemm run --out "$out/demo" > "$out/demo.log" 2>&1 || python -m te_gemm_callback.cli run --out "$out/demo" > "$out/demo.log" 2>&1
    echo "main command: $(echo "$(date +%s.%N) - $start" | bc) s"
    grep -E "rounds|Delayed|Float8|BF16" "$out/demo.log" | tail -25
fi
