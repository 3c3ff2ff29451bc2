#!/usr/bin/env bash
# The measurements behind docs/results/h200.md "Measuring without disturbing the job", on one GPU
# with TE installed. Sections: ONLY=tests|cost|breakdown|owners|paired|clocks|cupti|kernels|fit|interleaved|clean|sweep|recipes
# (default: all but recipes).
#   ONLY=fit bash benchmarks/h200_undisturbed.sh OUTDIR
set -uo pipefail
out=${1:-runs/undisturbed}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: some sections run from benchmarks/
export PYTHONUNBUFFERED=1 TE_GEMM_CACHE="$out/cache.json"
quiet() { grep -v -i -E "warn|flash-attn|pip install|git clone|cd flash|litlogger|tpu|gpu available|cuda_visible|^ *$" || true; }
TIMEFORMAT='wall %R s'
only=${ONLY:-tests,cost,breakdown,owners,paired,clocks,cupti,kernels,fit,interleaved,clean,sweep}
has() { [[ ",$only," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python -c "import torch, transformer_engine as t; print('torch', torch.__version__, 'TE', t.__version__)" 2>&1 | quiet
if has tests; then
    echo "== GPU tests"
    python -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -3
fi
if has cost; then
    echo "== host cost per instrument"
    python benchmarks/instrument_cost.py --json "$out/instrument_cost.json" 2>&1 | quiet
fi
if has breakdown; then
    echo "== host cost of each part of an instrumented step, host-bound stack"
    for r in BF16 Float8CurrentScaling; do
        (cd benchmarks && python instrument_breakdown.py --recipe $r --json "$out/breakdown_$r.json") 2>&1 | quiet \
            | grep -E "^breakdown|^cprofile|Error" | head -40
    done
fi
if has owners; then
    echo "== instrumented steps by launch order, and the TE wrapper per call, host-bound stack"
    (cd benchmarks && python owners_by_order.py --recipes BF16,Float8CurrentScaling,DelayedScaling \
        --json "$out/owners.json") 2>&1 | quiet | grep -E "^owners|Error"
fi
if has paired; then
    echo "== instrumented steps by launch order against nothing attached, step for step, host-bound stack"
    (cd benchmarks && python paired_steps.py --recipes BF16,Float8CurrentScaling --pairs 150 \
        --json "$out/paired.json") 2>&1 | quiet | grep -E "^paired|Error"
fi
if has clocks; then
    echo "== the NVML clock-sampling thread alone, host-bound plain torch stack"
    (cd benchmarks && python clock_sampler_cost.py --rounds 12) 2>&1 | quiet
fi
if has cupti; then
    echo "== what a profiled window leaves behind: launch cost, then plain steps after each kind of window"
    python benchmarks/cupti_teardown.py plain 2>&1 | quiet
    python benchmarks/cupti_teardown.py ours --until 30 2>&1 | quiet
    python benchmarks/cupti_teardown.py none --until 30 2>&1 | quiet  # control: the same probes, no session
    python benchmarks/undisturbed.py cupti --model hostbound --recipes BF16,Float8CurrentScaling --steps 20 --rounds 4 \
        --json "$out/cupti.json" 2>&1 | quiet | grep -E "^cupti|Error"
fi
if has kernels; then
    echo "== per-GEMM kernel records vs torch.profiler"
    python benchmarks/undisturbed.py kernels --model hostbound --model codonfm --recipes BF16,Float8CurrentScaling \
        --json "$out/kernels.json" 2>&1 | quiet | grep -E "^kernels|Error"
fi
if has fit; then
    echo "== Lightning fits with and without the callback, host-bound stack"
    { time python benchmarks/undisturbed.py fit --model hostbound --recipes BF16,Float8CurrentScaling \
        --out "$out/fit" --json "$out/fit.json" 2>&1 | quiet | grep -E "^fit|Error" ; } 2>&1
    python benchmarks/undisturbed.py fit --model codonfm --recipes BF16 --reps 2 --clean 10 --instrumented 4 \
        --out "$out/fit" --json "$out/fit_codonfm.json" 2>&1 | quiet | grep -E "^fit|Error"
fi
if has interleaved; then
    echo "== one fit, profiled windows between plain blocks, host-bound stack"
    python benchmarks/undisturbed.py interleaved --model hostbound --recipes BF16,Float8CurrentScaling \
        --blocks 20 --block 12 --instrumented 4 --json "$out/interleaved.json" 2>&1 | quiet | grep -E "^interleaved|Error"
fi
if has clean; then
    echo "== clean steps against plain ones in short windows (pairs 0.35 s apart), with and without a kernels session before them"
    python benchmarks/undisturbed.py interleaved --model hostbound --recipes BF16,Float8CurrentScaling \
        --blocks 100 --block 6 --instrumented 1 --json "$out/clean.json" 2>&1 | quiet | grep -E "^interleaved|Error"
    python benchmarks/undisturbed.py interleaved --model hostbound --recipes BF16,Float8CurrentScaling \
        --blocks 100 --block 6 --instrumented 1 --no-kernels --json "$out/clean_no_kernels.json" 2>&1 | quiet \
        | grep -E "^interleaved|Error"
    python benchmarks/undisturbed.py interleaved --model hostbound --recipes BF16,Float8CurrentScaling \
        --blocks 100 --block 8 --instrumented 3 --json "$out/clean_after_order.json" 2>&1 | quiet \
        | grep -E "^interleaved|Error"
fi
if has sweep; then
    echo "== in-job sweep (alternating rounds) vs plain loop"
    python benchmarks/undisturbed.py sweep --model hostbound --recipes BF16,Float8CurrentScaling --steps 4 \
        --sweep-rounds 8 --rounds 6 --out "$out/sweep" --json "$out/sweep_hostbound.json" 2>&1 | quiet | grep -E "^sweep|Error"
    python benchmarks/undisturbed.py sweep --model hf --recipes BF16,DelayedScaling --steps 5 --sweep-rounds 4 \
        --rounds 4 --out "$out/sweep" --json "$out/sweep_hf.json" 2>&1 | quiet | grep -E "^sweep|Error"
    python benchmarks/undisturbed.py sweep --model moe --recipes BF16,DelayedScaling,Float8CurrentScaling --steps 5 \
        --sweep-rounds 3 --rounds 2 --out "$out/sweep" --json "$out/sweep_moe.json" 2>&1 | quiet | grep -E "^sweep|Error"
    python benchmarks/sweep_rounds_detail.py "$out/sweep" 2>&1 | quiet
fi
if has recipes; then
    for r in "hf.py --precision transformer-engine --sweep BF16,DelayedScaling" \
             "moe.py --sweep BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling --seq-len 2048 --micro-batch-size 2" \
             "dense.py --layers 4 --sweep all"; do
        name=${r%%.py*}
        echo "== recipes/$r"
        { time timeout 280 python recipes/$r --out "$out/$name" > "$out/$name.txt" 2>&1 ; } 2>&1
        grep -E "GEMM-bound|eats|better than|no gain|fallback|step times from|host-bound|Error" "$out/$name.txt" | cut -c1-300 | head -12
    done
fi
