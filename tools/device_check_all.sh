#!/usr/bin/env bash
# Every CUDA check (pypto-capture, pypto-bench, the model families) in one prepared run,
# for a lent GPU machine with torch (CUDA) + transformers preinstalled and no network:
# the packages run from source via PYTHONPATH. A global deadline keeps the whole run
# inside one device call; each step gets what is left of it. Results land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL="${OUT:-$PWD/device-out}"
OUT="$(mktemp -d)"   # many files; the device tool brings back at most 8, so they travel as one tarball
mkdir -p "$FINAL"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-450} ))
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD/packages/pypto-common/src:$PWD/packages/pypto-capture/src:$PWD/packages/pypto-precision/src:$PWD/packages/pypto-patch/src:$PWD/packages/pypto-bench/src:$PWD/packages/pypto-testing/src:$PWD/packages/pypto-env/src:$PWD/packages/pypto-models-gemma4/src:$PWD/packages/pypto-models-minimax/src:$PWD/packages/pypto-tune/src:$PWD/tools"
left() { local l=$(( DEADLINE - $(date +%s) )); [ "$l" -gt "$1" ] && echo "$1" || echo "$l"; }
step() {  # step <name> <max seconds> <command...>
  local name=$1 limit; limit=$(left "$2"); shift 2
  if [ "$limit" -le 5 ]; then echo "== $name: SKIPPED (deadline)"; return; fi
  echo "== $name (limit ${limit}s, $(date -u +%T))"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "== $name: rc=$rc"; tail -25 "$OUT/$name.log"
}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
  step capture_cuda_tests 150 python3 -m pytest -q -p no:cacheprovider -m cuda -rs packages/pypto-capture/tests
  [ -n "${ONLY_BENCH:-}" ] || step bench_capture_b1 120 python3 tools/bench_capture.py --device cuda --dtype bfloat16 --models tiny,0.5b --steps 64 --repeats 5 --batch 1
  mkdir -p "$OUT/bench"
  step bench_device 200 env OUT="$OUT/bench" RUN_TIMEOUT=90 bash tools/device_check_bench.sh
  [ -n "${ONLY_BENCH:-}" ] || step gemma4_cuda_tests 90 python3 -m pytest -q -p no:cacheprovider -m cuda -rs packages/pypto-models-gemma4/tests
  [ -n "${ONLY_BENCH:-}" ] || step bench_gemma4 150 sh -c 'python3 tools/bench_gemma4_cpu.py --device cuda --dtype bfloat16 --json > "$0/gemma4_cuda.json"' "$OUT"
  [ -n "${ONLY_BENCH:-}" ] || step moe_cuda_tests 60 python3 -m pytest -q -p no:cacheprovider -rs packages/pypto-capture/tests/test_moe_exact.py -k device
  [ -n "${ONLY_BENCH:-}" ] || step bench_moe 150 python3 tools/bench_moe_cpu.py --device cuda --dtype bfloat16
  [ -n "${ONLY_BENCH:-}" ] || step bench_capture_b8 60 python3 tools/bench_capture.py --device cuda --dtype bfloat16 --models 0.5b --steps 64 --repeats 5 --batch 8
  # pypto-tune on CUDA: profile eager and graph decode of a tiny llama, advise, compare.
  [ -n "${ONLY_BENCH:-}" ] || step tune_cuda 120 sh -c '
    python3 -c "from pypto_testing.models import make_tiny_model; make_tiny_model(\"$0/tune-model\")" &&
    for arm in eager graph; do
      python3 -m pypto_tune profile --model-path "$0/tune-model" --device cuda:0 --regime decode \
        --seq 16 --gen 32 --arm $arm --level light --iters 3 --out "$0/tune-$arm" -q || exit 1
    done &&
    python3 -m pypto_tune compare "$0/tune-eager/profile.json" "$0/tune-graph/profile.json"' "$OUT"
} 2>&1 | tee "$OUT/summary.txt"
cp "$OUT/summary.txt" "$FINAL/summary.txt"
tar czf "$FINAL/results.tgz" -C "$OUT" .
