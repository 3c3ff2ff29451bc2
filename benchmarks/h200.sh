#!/usr/bin/env bash
# Every table of docs/results/h200.md, on one GPU host with Transformer Engine installed (the page:
# one H200). Each section is one of the page's claims and runs alone:
#   bash benchmarks/h200.sh OUT                     # every section (a few hours)
#   bash benchmarks/h200.sh OUT clean,paired        # some of them
# Sections: observed main replay clean interleaved fit paired cost kernels teardown capture recipes plan jobs
#           bench swapped diagnose nsys nsys-size layer5b tests
# observed needs transformers (offline: pip install --no-index --find-links WHEELS transformers).
set -uo pipefail
out=$(realpath -m "${1:?output folder}")
only=${2:-observed,main,replay,clean,interleaved,fit,paired,cost,kernels,teardown,capture,recipes,plan,jobs,bench,swapped,diagnose,nsys,nsys-size,layer5b,tests}
mkdir -p "$out"
# The bundled jobs import as te_gemm_callback.recipes, a name the install maps onto recipes/: a
# checkout on PYTHONPATH alone fails in te-gemm run and the GPU tests.
python -c "import te_gemm_callback.recipes" 2>/dev/null || {
    echo "te_gemm_callback.recipes does not import: install this checkout first (pip install --no-deps -e .)"; exit 2; }
export PYTHONUNBUFFERED=1 TE_GEMM_CACHE="$out/cache.json"
has() { [[ ",$only," == *",$1,"* ]]; }
quiet() { grep -v -i -E "warn|flash-attn|pip install|git clone|cd flash|litlogger|tpu|gpu available|cuda_visible|^ *$" || true; }
TIMEFORMAT='wall %R s'
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python -c "import torch, transformer_engine as t; print('torch', torch.__version__, 'TE', t.__version__)" 2>&1 | quiet
# nsys on PATH, else the one inside an Nsight Compute install (the H200 host has no other).
nsys_bin() { command -v nsys || find /opt/nvidia -name nsys -type f 2>/dev/null | head -1; }
ub() { python benchmarks/undisturbed.py "$@" 2>&1 | quiet | grep -E "^(interleaved|fit|kernels|teardown)|Error"; }

if has observed; then
    echo "== observed speedups against a plain loop with its optimizer step (HF Qwen2, Lightning's TE plugin)"
    python benchmarks/observed_vs_plain.py --model gpu --fits 1 --json "$out/observed_gpu.json" 2>&1 | quiet \
        | grep -E "fit [0-9]|Error"
    python benchmarks/observed_vs_plain.py --model host --fits 4 --json "$out/observed_host.json" 2>&1 | quiet \
        | grep -E "fit [0-9]|Error"
fi
if has main; then
    echo "== the README's main command"
    start=$(date +%s.%N)
    python -m te_gemm_callback.cli run --out "$out/demo" > "$out/demo.log" 2>&1  # te-gemm run
    echo "main command: $(echo "$(date +%s.%N) - $start" | bc) s"
    grep -E "rounds|Delayed|Float8|BF16" "$out/demo.log" | tail -25
fi
if has replay; then
    echo "== the replay against the sweep, and the module benchmark's share of the bench (each with its own empty cache)"
    TE_GEMM_CACHE="$out/replay-main-cache.json" python -m te_gemm_callback.cli run --out "$out/replay-main" \
        > "$out/replay-main.log" 2>&1
    TE_GEMM_CACHE="$out/replay-dense-cache.json" python recipes/dense.py --layers 16 --hidden-size 1024 \
        --intermediate-size 4096 --heads 16 --seq-len 256 --micro-batch-size 2 --vocab-size 128 \
        --out "$out/replay-dense_host" > "$out/replay-dense_host.log" 2>&1
    python benchmarks/replay_summary.py "$out/replay-main" "$out/replay-dense_host" --json "$out/replay.json"
fi
if has clean; then
    echo "== clean steps against plain blocks, short windows (with, without a kernels session; two by-order steps)"
    ub interleaved --model hostbound --recipes BF16,Float8CurrentScaling --blocks 100 --block 6 --instrumented 1 \
        --json "$out/clean.json"
    ub interleaved --model hostbound --recipes BF16,Float8CurrentScaling --blocks 100 --block 6 --instrumented 1 \
        --no-kernels --json "$out/clean_no_kernels.json"
    ub interleaved --model hostbound --recipes BF16,Float8CurrentScaling --blocks 100 --block 8 --instrumented 3 \
        --json "$out/clean_after_order.json"
fi
if has interleaved; then
    echo "== 12-step profiled windows between plain blocks (three runs: 60 windows per recipe)"
    for run in 1 2 3; do
        ub interleaved --model hostbound --recipes BF16,Float8CurrentScaling --blocks 20 --block 12 --instrumented 4 \
            --json "$out/interleaved_$run.json"
    done
fi
if has fit; then
    echo "== fits with and without the callback"
    ub fit --model codonfm --recipes BF16 --reps 2 --clean 10 --instrumented 4 --out "$out/fit" --json "$out/fit_codonfm.json"
    ub fit --model hostbound --recipes BF16,Float8CurrentScaling --out "$out/fit" --json "$out/fit_hostbound.json"
fi
if has paired; then
    echo "== instrumented steps by launch order against nothing attached, step for step"
    python benchmarks/paired_steps.py --recipes BF16,Float8CurrentScaling --pairs 150 --json "$out/paired.json" 2>&1 \
        | quiet | grep -E "^paired|Error"
fi
if has cost; then
    echo "== what each instrument costs the host"
    python benchmarks/instrument_cost.py calls --layers 32 --reps 3 --json "$out/cost_calls.json" 2>&1 | quiet
    for r in BF16 Float8CurrentScaling; do
        python benchmarks/instrument_cost.py parts --recipe $r --json "$out/cost_parts_$r.json" 2>&1 | quiet \
            | grep -E "^parts|Error"
    done
    python benchmarks/instrument_cost.py wrapper --recipes BF16,Float8CurrentScaling,DelayedScaling \
        --json "$out/cost_wrapper.json" 2>&1 | quiet | grep -E "^wrapper|Error"
    python benchmarks/instrument_cost.py sampler --rounds 12 2>&1 | quiet
fi
if has kernels; then
    echo "== per-GEMM kernel records against torch.profiler"
    ub kernels --model hostbound --model codonfm --recipes BF16,Float8CurrentScaling --json "$out/kernels.json"
fi
if has teardown; then
    echo "== launch cost after one kernels-only session (a fresh process each)"
    for s in plain restored ours; do ub teardown $s; done
    ub teardown none --until 30  # control: the same probes, no session
fi
if has capture; then
    echo "== shapes and precisions read from the operands; capture against torch.profiler"
    python benchmarks/validate_capture.py --layers 4 --steps 10 --json "$out/capture.json" 2>&1 | quiet
fi
if has recipes; then
    for r in "hf.py --precision transformer-engine --sweep BF16,DelayedScaling" \
             "moe.py --sweep BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling --seq-len 2048 --micro-batch-size 2" \
             "dense.py --layers 4 --sweep all"; do
        name=${r%%.py*}
        echo "== recipes/$r"
        { time timeout 600 python recipes/$r --out "$out/$name" > "$out/$name.txt" 2>&1 ; } 2>&1
        grep -E "GEMM-bound|eats|better than|undecided|no gain|fallback|host-bound|Error" "$out/$name.txt" | cut -c1-300 | head -12
    done
fi
if has plan; then
    # Per model: a run that sweeps every recipe and benches its shapes, `te-gemm plan` on it, then the
    # same job sweeping the plan right after its own recipe, beside the single recipes.
    for model in "mixed --hidden-size 1024 --heads 16 --layers 12 --seq-len 256 --micro-batch-size 2" \
                 "wide --hidden-size 1024 --heads 16 --layers 12 --seq-len 1024 --micro-batch-size 2" \
                 "codonfm --layers 4"; do
        name=${model%% *}
        flags=${model#* }
        echo "== precision plan: $name"
        python recipes/dense.py $flags --sweep all --out "$out/plan-$name" > "$out/plan-$name.txt" 2>&1 \
            || { tail -5 "$out/plan-$name.txt"; continue; }
        python -m te_gemm_callback.cli plan "$out/plan-$name" | tail -20  # te-gemm plan
        python recipes/dense.py $flags --sweep all --sweep-plan "$out/plan-$name/precision_plan.json" \
            --out "$out/plan-$name-plan" > "$out/plan-$name-plan.txt" 2>&1 || { tail -5 "$out/plan-$name-plan.txt"; continue; }
        grep -E "^plan|plan:|best single|predicted step speedup" "$out/plan-$name-plan.txt" | cut -c1-300 | head -8
    done
fi
if has jobs; then
    echo "== CUDA graphs, te.ops, torch.compile"
    python benchmarks/jobs_check.py graphs --recipes BF16,DelayedScaling --json "$out/graphs.json" 2>&1 | quiet
    python benchmarks/jobs_check.py ops --recipes BF16,Float8CurrentScaling --json "$out/ops.json" 2>&1 | quiet
    python benchmarks/jobs_check.py compile --json "$out/compile.json" 2>&1 | quiet
fi
if has bench; then
    CODONFM="--hidden_size 4096 --intermediate_size 16384 --num_attention_heads 32 --num_hidden_layers 24 --micro_batch_size 31 --sequence_length 512"
    for mode in autocast prequantized; do
        flag=""; [ "$mode" = prequantized ] && flag="--pre-quantize"
        for i in 1 2 3; do
            echo "== CodonFM-5B config, $mode, run $i (whole command, cold process, no cache)"
            { time python scripts/benchmark.py $CODONFM $flag --no_cache --json "$out/codonfm_${mode}_$i.json" \
                -o "$out/codonfm_${mode}_$i.png" > "$out/codonfm_${mode}_$i.txt" 2>&1 ; } 2>&1
            grep -E "speedup|skipped" "$out/codonfm_${mode}_$i.txt" | head -8
            python -c "import json, sys; m = json.load(open(sys.argv[1]))['meta']; t = m.get('timeline_s', {}); \
print(f\"  TE import and recipe checks {t.get('import_and_checks', 0):.2f} s, GPU work {t.get('jobs_total', 0):.2f} s\")" \
                "$out/codonfm_${mode}_$i.json"
        done
    done
    python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for mode in ("autocast", "prequantized"):
    runs = [json.load(open(f"{out}/codonfm_{mode}_{i}.json"))["results"] for i in (1, 2, 3)]
    spreads = sorted(max(t) / min(t) - 1 for t in ([c["median_ms"] for c in cells if c["median_ms"]]
                                                  for cells in zip(*runs)) if len(t) == 3)
    print(f"{mode}: per-cell spread over three runs (max/min - 1): worst {100 * spreads[-1]:.2f}%, "
          f"median {100 * spreads[len(spreads) // 2]:.2f}%, cells within 2%: {sum(s <= 0.02 for s in spreads)}/{len(spreads)}")
PY
    echo "== microbenchmark against in-job GEMM time"
    python benchmarks/bench_vs_job.py times --layers 4 --steps 6 --json "$out/bench_vs_job.json" 2>&1 | quiet
fi
if has swapped; then
    echo "== real backward GEMMs against swapped-size forwards (pre-quantized)"
    python -m te_gemm_callback.cli bench --hidden-size 4096 --intermediate-size 16384 --num-attention-heads 32 \
        --num-hidden-layers 24 --micro-batch-size 31 --sequence-length 512 --pre-quantize --compare-swapped \
        --precisions BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling > "$out/swapped.txt" 2>&1
    sed -n '/swapped sizes/,$p' "$out/swapped.txt"
fi
if has diagnose; then
    echo "== the kernel each side launches per GEMM; a GEMM's time along a burst after idle"
    python benchmarks/bench_vs_job.py kernels --layers 4 --steps 3 --json "$out/bench_kernels.json" 2>&1 | quiet \
        | grep -E "job GEMM kernels|overlapping|same kernel in"
    python benchmarks/bench_vs_job.py burst --calls 400 --json "$out/burst.json" 2>&1 | quiet | grep -v "clock (s"
    python benchmarks/bench_vs_job.py burst --recovery 2 --json "$out/recovery.json" 2>&1 | quiet | cut -c1-160
fi
if has nsys; then (
    # NSYS_LIBS: a folder with elfutils' libdw.so.1, which the host's nsys importer lacks; with it nsys
    # writes a .nsys-rep, and the check sets nsys's own projection of each GEMM range beside ours.
    [ -n "${NSYS_LIBS:-}" ] && export LD_LIBRARY_PATH="$NSYS_LIBS:${LD_LIBRARY_PATH:-}"
    echo "== under Nsight Systems: per-GEMM times against the runs without it and nsys's own, the file, our ranges"
    python benchmarks/nsys_check.py --out "$out/nsys" --nsys "$(nsys_bin)" --nsys-flags "-s none --cpuctxsw=none" \
        --rounds 3 2>&1 | quiet | grep -v -E "^   .* instances\)$"
    python benchmarks/nsys_check.py --job small --out "$out/nsys-small" --nsys "$(nsys_bin)" \
        --nsys-flags "-s none --cpuctxsw=none" --rounds 2 2>&1 | quiet
    echo "== event pairs against kernel records: the gate, the spin, bare; with and without nsys"
    python benchmarks/event_floor.py --json "$out/event_pairs.json" 2>&1 | quiet | cut -c1-200
    "$(nsys_bin)" profile -t cuda -s none --cpuctxsw=none -f true -o "$out/event_pairs_nsys" \
        python benchmarks/event_floor.py --events-only --json "$out/event_pairs_nsys.json" > "$out/event_pairs_nsys.log" 2>&1
    rm -f "$out"/event_pairs_nsys.qdstrm "$out"/event_pairs_nsys.nsys-rep
) fi
if has nsys-size; then
    echo "== what makes an nsys recording large: nsys's CPU sampling and context-switch trace on and off"
    echo "perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null); $(nproc) CPUs"
    python benchmarks/nsys_file_size.py --out "$out/nsys-size" --nsys "$(nsys_bin)" --budget 420 2>&1 | quiet
fi
if has layer5b; then
    echo "== TE's 5B layer on this GPU, both modes (docs/results/h200/5b), projected onto the B300"
    python recipes/dense.py --layers 1 --steps 12 --sweep none --no-bench --out "$out/5b" > "$out/5b.log" 2>&1
    python -m te_gemm_callback.cli bench --capture "$out/5b/gemm_capture.json" --modes autocast,prequantized \
        --json "$out/5b/bench.json" 2>&1 | quiet | tail -3
    python benchmarks/projection_vs_te_guide.py --run "$out/5b" 2>&1 | tail -12
fi
if has tests; then
    echo "== GPU tests"
    python -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -3
fi
