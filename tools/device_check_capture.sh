#!/usr/bin/env bash
# pypto-capture on one CUDA GPU: the CUDA-marked tests and the decode benchmark.
#
# Needs python3 with torch (CUDA build) and transformers >= 5.8 installed; nothing is
# installed here (pypto-capture and pypto-testing are pure Python and run from the
# source tree through PYTHONPATH). Writes everything to $OUT/capture_cuda.txt
# (OUT defaults to ./capture_out). Exit code: that of the first failing step.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/capture_out}"
mkdir -p "$OUT"
REPORT="$OUT/capture_cuda.txt"
export PYTHONPATH="$PWD/packages/pypto-capture/src:$PWD/packages/pypto-testing/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
status=0
# Everything below goes to the terminal and the report; no pipeline, so $status survives.
exec > >(tee "$REPORT") 2>&1
step() {  # step <title> <timeout_s> <command...>
  local title=$1 limit=$2
  shift 2
  echo "== $title ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@"
  local rc=$?
  echo "== $title: rc=$rc"
  [ "$rc" -ne 0 ] && [ "$status" -eq 0 ] && status=$rc
  return 0
}
echo "== environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'gpu', torch.cuda.is_available(), 'accelerator.Graph', hasattr(getattr(torch, 'accelerator', None), 'Graph'))"
step "CUDA-marked tests" 300 python3 -m pytest -q -p no:cacheprovider -m cuda -rs packages/pypto-capture/tests
step "bench tiny+0.5B bf16 batch 1" 240 python3 tools/bench_capture.py --device cuda --dtype bfloat16 --models tiny,0.5b --steps 64 --repeats 5 --batch 1 --json
step "bench 0.5B bf16 batch 8" 120 python3 tools/bench_capture.py --device cuda --dtype bfloat16 --models 0.5b --steps 64 --repeats 5 --batch 8
echo "== overall rc=$status"
exit "$status"
