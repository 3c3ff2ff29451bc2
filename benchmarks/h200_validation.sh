#!/usr/bin/env bash
# Everything docs/results/h200.md reports, in one run on a GPU host with TE installed.
#   bash benchmarks/h200_validation.sh OUTDIR            # all sections
#   ONLY=bench bash benchmarks/h200_validation.sh OUTDIR # only the microbenchmark sections
#   ONLY=report bash benchmarks/h200_validation.sh OUTDIR # sweep vs plain loop, recipes (issues 4, 5)
#   VISITS=2 ONLY=spread bash benchmarks/h200_validation.sh OUTDIR # three-run spread and bench vs job only
#   (DUTY=0.8: microbenchmark GEMM duty; JOBDUTY=1: bench vs job at each job's own GEMM share)
#   ONLY=diagnose bash benchmarks/h200_validation.sh OUTDIR # why bench and job differ: kernels, boost (~2 min)
set -uo pipefail
out=${1:-runs/h200}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TE_GEMM_CACHE="$out/cache.json"
quiet() { grep -v -i -E "warn|flash-attn|pip install|git clone|cd flash|^ *$" || true; }
TIMEFORMAT='wall %R s'
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python -c "import torch, transformer_engine as t; print('torch', torch.__version__, 'TE', t.__version__)" 2>&1 | quiet

only=${ONLY:-all}
if [ "$only" = all ]; then
echo "== pytest (CPU and GPU tests)"
python -m pytest -q -p no:cacheprovider tests 2>&1 | tail -4
fi

if [ "$only" = diagnose ]; then
    echo "== the kernel each side launches per GEMM, and what overlaps the job's GEMMs"
    timeout 240 python benchmarks/kernel_match.py --layers 4 --steps 3 --json "$out/kernel_match.json" 2>&1 | quiet \
        | grep -E "job GEMM kernels|overlapping|same kernel in"
    echo "== a GEMM's time along a long burst after idle; how much idle gives the boost back"
    timeout 120 python benchmarks/burst_profile.py --calls 400 --json "$out/burst.json" 2>&1 | quiet | grep -v "clock (s"
    timeout 120 python benchmarks/burst_profile.py --recovery 2 --json "$out/recovery.json" 2>&1 | quiet | cut -c1-160
    exit 0
fi

if [ "$only" = report ]; then
    echo "== does the sweep change the next training step? our autocast inside a plugin's"
    timeout 200 python benchmarks/sweep_probe.py --json "$out/sweep_probe.json" 2>&1 | quiet | grep -E "^state|^nesting|Error"
    echo "== in-job sweep vs plain loop, training state"
    timeout 240 python benchmarks/sweep_vs_plain_loop.py --layers 4 --steps 8 --out "$out/sweep_check" \
        --json "$out/sweep_vs_loop.json" 2>&1 | quiet | grep -E "sweep|state|Error" | tail -8
    echo "== dense recipe, 4 layers, whole run"
    { time timeout 300 python recipes/dense.py --layers 4 --sweep all --out "$out/dense" > "$out/dense.txt" 2>&1 ; } 2>&1
    grep -E "GEMM-bound|eats|better than|no gain|fallback|Error" "$out/dense.txt" | head -12
    echo "== MoE recipe: 8 experts, top-2, hidden 4096, expert intermediate 14336, 1 layer"
    { time timeout 240 python recipes/moe.py --sweep BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling \
        --seq-len 2048 --micro-batch-size 2 --out "$out/moe" > "$out/moe.txt" 2>&1 ; } 2>&1
    grep -E "rows per local|capture:|GEMM-bound|eats|better than|no gain|fallback|Error" "$out/moe.txt" | head -12
    for prec in bf16-mixed transformer-engine; do
        echo "== HF Llama, precision $prec"
        sw=BF16; [ "$prec" = transformer-engine ] && sw=BF16,DelayedScaling
        { time timeout 200 python recipes/hf.py --precision $prec --layers 4 --sweep $sw --out "$out/hf-$prec" \
            > "$out/hf-$prec.txt" 2>&1 ; } 2>&1
        grep -E "capture:|GEMM-bound|eats|better than|no gain|fallback|Error" "$out/hf-$prec.txt" | head -8
    done
    exit 0
fi

if [ "$only" = all ]; then
echo "== capture vs torch.profiler"
python benchmarks/validate_capture.py --layers 4 --steps 10 --json "$out/validate.json" 2>&1 | quiet

echo "== capture overhead"
python benchmarks/overhead.py --layers 4 --reps 16 --block 3 \
    --recipes BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling --json "$out/overhead.json" 2>&1 | quiet
fi

if [ "$only" = all ]; then
echo "== where a cold command's wall time goes (imports, CUDA context)"
python benchmarks/bench_wall_breakdown.py --json "$out/wall_breakdown.json" 2>&1 | quiet
fi

CODONFM="--hidden_size 4096 --intermediate_size 16384 --num_attention_heads 32 --num_hidden_layers 24 --micro_batch_size 31 --sequence_length 512"
for mode in autocast prequantized; do
    flag=""; [ "$mode" = prequantized ] && flag="--pre-quantize"
    for i in 1 2 3; do
        echo "== CodonFM config, $mode, run $i (whole command, cold process, no cache)"
        { time python scripts/benchmark.py $CODONFM $flag ${VISITS:+--visits $VISITS} ${DUTY:+--gemm_duty $DUTY} --no_cache --json "$out/codonfm_${mode}_$i.json" \
            -o "$out/codonfm_${mode}_$i.png" > "$out/codonfm_${mode}_$i.txt" 2>&1 ; } 2>&1
        grep -E "speedup|skipped" "$out/codonfm_${mode}_$i.txt" | head -8
        python - "$out/codonfm_${mode}_$i.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["meta"]
t = m.get("timeline_s", {})
print(f"  measurement {m['wall_s']:.2f} s: TE import and recipe checks {t.get('import_and_checks', 0):.2f}, conditions {t.get('conditions', 0):.2f}, warm-up {t.get('warm_up', 0):.2f}, "
      f"peaks {t.get('peaks', 0):.2f}, {len(t.get('jobs', []))} jobs {t.get('jobs_total', 0):.2f} on the GPU (host {t.get('host_total', 0):.2f}, setup {t.get('setup_total', 0):.2f}), "
      f"heat {t.get('heat', {}).get('heat_s', 0):.2f} s in {t.get('heat', {}).get('idle_holds', 0)} of {t.get('heat', {}).get('holds', 0)} holds, "
      f"holds {t.get('heat', {}).get('hold_s', 0):.2f} s")
for j in t.get("jobs", []):
    print(f"    {j['precision']:22s} {j['item']:20s} GPU {j['s']:.3f} s host {j.get('host_s', 0):.3f} s setup {j.get('setup_s', 0):.3f} s heat {j.get('heat_s', 0):.3f} s "
          f"clock {j.get('sm_clock_mhz', 0):.0f} MHz {j.get('power_w', 0):.0f} W")
PY
    done
done
python - "$out" <<'PY'
import json, sys, itertools
out = sys.argv[1]
for mode in ("autocast", "prequantized"):
    runs = [json.load(open(f"{out}/codonfm_{mode}_{i}.json"))["results"] for i in (1, 2, 3)]
    spreads = []
    for cells in zip(*runs):
        t = [c["median_ms"] for c in cells if c["median_ms"]]
        if len(t) == 3:
            spreads.append(max(t) / min(t) - 1)
    spreads.sort()
    print(f"{mode}: per-cell spread over three runs (max/min - 1): worst {100 * spreads[-1]:.2f}%, "
          f"median {100 * spreads[len(spreads) // 2]:.2f}%, cells within 2%: {sum(s <= 0.02 for s in spreads)}/{len(spreads)}")
PY

if [ "$only" != spread ]; then
echo "== real backward vs swapped-size forward (pre-quantized)"
python -m te_gemm_callback.cli bench --hidden-size 4096 --intermediate-size 16384 --num-attention-heads 32 \
    --num-hidden-layers 24 --micro-batch-size 31 --sequence-length 512 --pre-quantize --compare-swapped \
    --precisions BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling > "$out/swapped.txt" 2>&1
sed -n '/swapped sizes/,$p' "$out/swapped.txt"
fi

echo "== microbenchmark vs in-job GEMM time"
python benchmarks/bench_vs_job.py --layers 4 --steps 6 ${VISITS:+--visits $VISITS} ${DUTY:+--gemm-duty $DUTY} ${JOBDUTY:+--duty-from-job} --json "$out/bench_vs_job.json" 2>&1 | quiet
[ "$only" = spread ] && exit 0
echo "== the same with biases in the job's layers (TE's default; the bench times bias-free GEMMs)"
python benchmarks/bench_vs_job.py --layers 4 --steps 6 --bias --json "$out/bench_vs_job_bias.json" 2>&1 | quiet | tail -2
if [ "$only" = all ]; then

echo "== bundled demo (README main command)"
{ time python -m te_gemm_callback.cli run --out "$out/demo" --steps 5 > "$out/demo.txt" 2>&1 ; } 2>&1
tail -6 "$out/demo.txt"
fi
