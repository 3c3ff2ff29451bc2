#!/usr/bin/env bash
# Every table of docs/results/h200x2.md, on one host with two GPUs and TE installed.
#   bash benchmarks/h200x2.sh OUT              # every section (~8 min)
#   ONLY=jobs bash benchmarks/h200x2.sh OUT    # DDP, MoE EP, FSDP2, TP recipe runs
#   ONLY=bench bash benchmarks/h200x2.sh OUT   # bench on 1 vs 2 GPUs (CodonFM config, 24 shapes)
#   ONLY=codonfm bash benchmarks/h200x2.sh OUT # bench on 1 vs 2 GPUs, CodonFM config only (~1 min)
#   ONLY=many bash benchmarks/h200x2.sh OUT    # bench on 1 vs 2 GPUs, 24 shapes only
#   ONLY=big bash benchmarks/h200x2.sh OUT     # bench on 1 vs 2 GPUs, 48 shapes
#   ONLY=large bash benchmarks/h200x2.sh OUT   # bench on 1 vs 2 GPUs, 96 shapes (~3 min)
#   ONLY=tests bash benchmarks/h200x2.sh OUT   # the test suite (2-GPU bench and tensor-parallel tests), then the bench
set -uo pipefail
out=${1:-runs/h200x2}
mkdir -p "$out"
# The bundled jobs import as te_gemm_callback.recipes, a name the install maps onto recipes/: a
# checkout on PYTHONPATH alone fails in te-gemm run and the GPU tests.
python -c "import te_gemm_callback.recipes" 2>/dev/null || {
    echo "te_gemm_callback.recipes does not import: install this checkout first (pip install --no-deps -e .)"; exit 2; }
# NVLink multicast stays off on shared hosts (it can take the GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
quiet() { grep -v -i -E "warn|flash-attn|pip install|git clone|cd flash|^ *$" || true; }
TIMEFORMAT='wall %R s'
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv,noheader

only=${ONLY:-all}
if [ "$only" = all ] || [ "$only" = tests ]; then
echo "== pytest (CPU and GPU tests; the 2-GPU bench and tensor-parallel tests run here)"
timeout 300 python -m pytest -q -p no:cacheprovider -rfE tests > "$out/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -8
fi

if [ "$only" = all ] || [ "$only" = jobs ]; then

echo "== dense recipe, 4 layers, DDP over 2 GPUs (per-rank captures gathered on rank 0)"
{ time python recipes/dense.py --layers 4 --devices 2 --sweep BF16,DelayedScaling --no-bench \
    --out "$out/dense_ddp" > "$out/dense_ddp.txt" 2>&1 ; } 2>&1
sed -n '/Per-rank capture/,/NCCL:/p' "$out/dense_ddp.txt"
grep -E "Error|error" "$out/dense_ddp.txt" | head -5

echo "== MoE recipe, 8 experts top-2, experts split over the 2 GPUs (EP=2, all-to-all dispatch)"
{ time python recipes/moe.py --devices 2 --expert-parallel --seq-len 2048 --micro-batch-size 2 \
    --sweep BF16,DelayedScaling --no-bench --out "$out/moe_ep" > "$out/moe_ep.txt" 2>&1 ; } 2>&1
grep -E "rows per local expert" "$out/moe_ep.txt"
sed -n '/Per-rank capture/,/NCCL:/p' "$out/moe_ep.txt"
grep -E "Error|error" "$out/moe_ep.txt" | head -5

for strat in fsdp tp; do
    echo "== dense recipe, 4 layers, --strategy $strat over 2 GPUs"
    { time python recipes/dense.py --layers 4 --devices 2 --strategy $strat --sweep BF16,Float8CurrentScaling \
        --no-bench --out "$out/dense_$strat" > "$out/dense_$strat.txt" 2>&1 ; } 2>&1
    sed -n '/Per-rank capture/,/NCCL:/p' "$out/dense_$strat.txt"
    python - "$out/dense_$strat/ranks/rank0.json" <<'PY'
import sys
from te_gemm_callback import GemmCapture
c = GemmCapture.load(sys.argv[1])
for r in c.records:
    if r.op == "fprop" and r.module.startswith("blocks.0."):
        print(f"  rank 0 {r.module}.{r.gemm or ''} fprop {r.m}x{r.k}x{r.n} {r.precision}")
PY
    grep -E "Error|error" "$out/dense_$strat.txt" | head -5
done
fi
[ "$only" = jobs ] && exit 0

P="--precisions BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling --no-cache"
# compare NAME ARGS...: the same cells on 1 GPU twice (its own run-to-run agreement, the floor for
# any other comparison) and on 2 GPUs, whole commands timed, cells matched.
compare() {
    name=$1; shift
    for run in ${RUNS:-dev1 dev1b dev2}; do
        n=${run:3:1}
        { time python -m te_gemm_callback.cli bench "$@" $P --devices $n --json "$out/${name}_$run.json" \
            > "$out/${name}_$run.txt" 2>&1 ; } 2>&1
    done
    python - "$out" "$name" <<'PY'
import json, os, statistics, sys
out, name = sys.argv[1:3]
runs = {r: json.load(open(f"{out}/{name}_{r}.json")) for r in ("dev1", "dev1b", "dev2")
        if os.path.exists(f"{out}/{name}_{r}.json")}
key = lambda r: (r["m"], r["k"], r["n"], r["op"], r["precision"], r["mode"])
ms = {n: {key(r): r["median_ms"] for r in d["results"] if r.get("median_ms")} for n, d in runs.items()}
for label, x, y in (("1 GPU again / 1 GPU", "dev1b", "dev1"), ("2 GPUs / 1 GPU", "dev2", "dev1"),
                    ("2 GPUs / 1 GPU again", "dev2", "dev1b")):
    if x not in ms or y not in ms:
        continue
    ratios = [ms[x][k] / ms[y][k] for k in ms[y] if k in ms[x]]
    print(f"{label}: {len(ratios)} cells, per-cell time median {statistics.median(ratios):.4f}, "
          f"min {min(ratios):.4f}, max {max(ratios):.4f}, within 2%: {sum(abs(r - 1) <= 0.02 for r in ratios)}, "
          f"within 3%: {sum(abs(r - 1) <= 0.03 for r in ratios)}/{len(ratios)}")
for n, d in runs.items():
    m = d["meta"]
    byp = {}
    for r in d["results"]:
        byp.setdefault(r["precision"], []).append(r.get("sm_clock_mhz") or 0)
    print(f"{n}: measurement wall {m.get('wall_s', 0):.2f} s, visits per device {m.get('visits_per_device')}, "
          f"per-worker {m.get('worker_wall_s')}; cell SM clock median by recipe "
          + ", ".join(f"{p} {statistics.median(v):.0f}" for p, v in byp.items()))
    for t in m.get("worker_timeline_s") or [m.get("timeline_s")]:
        if t:
            print(f"  worker: TE import {t.get('import_and_checks', 0):.2f} s, conditions {t.get('conditions', 0):.2f} s, warm-up {t.get('warm_up', 0):.2f} s, "
                  f"peaks {t.get('peaks', 0):.2f} s, {len(t['jobs'])} jobs {t['jobs_total']:.2f} s on the GPU "
                  f"(host {t.get('host_total', 0):.2f} s, setup {t['setup_total']:.2f} s)")
PY
}

if [ "$only" = big ]; then
    # 48 shapes x 4 recipes x 3 passes = 576 cells, one run per device count.
    echo "== microbenchmarks of 48 shapes: 1 GPU vs 2 GPUs"
    BIG=$(python -c "print(','.join(f'{m}x{k}x{n}' for m in (2048, 4096, 6144, 8192, 12288, 16384) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144), (8192, 8192), (8192, 28672), (28672, 8192), (8192, 10240))))")
    RUNS="dev1 dev2" compare big --shapes "$BIG"
    exit 0
fi
if [ "$only" = large ]; then
    # 96 shapes x 4 recipes x 3 passes = 1152 cells, about 90 s of GPU work on one H200: where the
    # GPU work dwarfs each process's start (imports, warm-up), so the whole command shows what a
    # second GPU buys. One run per device count (the agreement floor is measured by ONLY=bench).
    echo "== microbenchmarks of 96 shapes: 1 GPU vs 2 GPUs"
    LARGE=$(python -c "print(','.join(f'{m}x{k}x{n}' for m in (1024, 2048, 3072, 4096, 6144, 8192, 10240, 12288, 14336, 16384, 20480, 24576) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144), (8192, 8192), (8192, 28672), (28672, 8192), (8192, 10240))))")
    RUNS="dev1 dev2" compare large --shapes "$LARGE"
    exit 0
fi
if [ "$only" != many ]; then
echo "== microbenchmarks of the CodonFM config: 1 GPU vs 2 GPUs, same cells"
compare bench --hidden-size 4096 --intermediate-size 16384 --num-attention-heads 32 --num-hidden-layers 24 \
    --micro-batch-size 31 --sequence-length 512
fi
[ "$only" = codonfm ] && exit 0
# A larger cell set (24 shapes x 4 recipes = 96 jobs): where the per-GPU work outweighs each
# worker's fixed start (interpreter, torch and TE imports, warm-up), which the CodonFM config does not.
echo "== microbenchmarks of 24 shapes (Llama-8B/70B-like, 3 token counts): 1 GPU vs 2 GPUs"
MANY=$(python -c "print(','.join(f'{m}x{k}x{n}' for m in (4096, 8192, 16384) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144), (8192, 8192), (8192, 28672), (28672, 8192), (8192, 10240))))")
compare many --shapes "$MANY"
