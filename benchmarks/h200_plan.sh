#!/usr/bin/env bash
# The precision plan measured in the job, on one GPU with TE: a model where a mixed plan should win
# (dense stack, hidden 1024, 12 layers, small micro-batch: GEMMs where FP8 loses) and one where the
# plan should be "everything in FP8" (the CodonFM-layer stack). For each: a run that sweeps every
# recipe and benches its shapes, `te-gemm plan` on it, then a second run that sweeps the plan
# beside the single recipes; its report sets the plan's observed speedup against the predicted one
# and against the best single recipe.
#   bash benchmarks/h200_plan.sh OUTDIR            (ONLY=mixed, wide or codonfm: one model)
set -uo pipefail
only=${ONLY:-mixed,wide,codonfm}
out=${1:-runs/plan}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TE_GEMM_CACHE="$out/cache.json"
# wide: the same stack at 4x the tokens per step, where FP8 should win on the MLP's GEMMs and lose on
# the attention's 1024-wide ones.
for model in "mixed --hidden-size 1024 --heads 16 --layers 12 --seq-len 256 --micro-batch-size 2" \
             "wide --hidden-size 1024 --heads 16 --layers 12 --seq-len 1024 --micro-batch-size 2" \
             "codonfm --layers 4"; do
    name=${model%% *}
    flags=${model#* }
    [[ ",$only," == *",$name,"* ]] || continue
    python recipes/dense.py $flags --sweep all --out "$out/$name" > "$out/$name.txt" 2>&1 || { tail -5 "$out/$name.txt"; continue; }
    python -m te_gemm_callback.cli plan "$out/$name" | tail -20  # te-gemm plan, without the console script
    python recipes/dense.py $flags --sweep all --sweep-plan "$out/$name/precision_plan.json" \
        --out "$out/$name-plan" > "$out/$name-plan.txt" 2>&1 || { tail -5 "$out/$name-plan.txt"; continue; }
    grep -E "^plan|plan:|best single|predicted step speedup" "$out/$name-plan.txt" | cut -c1-300 | head -8
done
