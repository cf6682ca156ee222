#!/usr/bin/env bash
# pypto-bench on one CUDA GPU: 0.5B-class (Qwen2.5-0.5B-shaped, random weights) decode,
# bf16, batch 1, eager vs graph (pypto-capture cudagraph), plus the tiny model.
# Writes the JSON reports, a log and summary.md into $OUT (default ./device-out).
# Needs torch with CUDA and transformers importable; the repo's packages are used from
# source through PYTHONPATH (no network, no pip). Target: graph >= 2.5x eager at batch 1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/packages/pypto-bench/src:$PWD/packages/pypto-capture/src:$PWD/packages/pypto-precision/src:$PWD/packages/pypto-patch/src:$PWD/packages/pypto-testing/src:$PWD/tools${PYTHONPATH:+:$PYTHONPATH}"
WORK="$(mktemp -d)"
{
  "$PY" - <<'PY'
import torch, transformers, platform
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
} > "$OUT/env.txt" 2>&1 || { cat "$OUT/env.txt"; echo "torch/transformers not importable" >&2; exit 3; }
cat "$OUT/env.txt"

"$PY" - "$WORK" <<'PY' 2>&1 | tail -3
import sys
from pathlib import Path
from bench_e2e_cpu import QWEN05_SHAPE
from pypto_testing.models import make_tiny_model
work = Path(sys.argv[1])
make_tiny_model(work / "qwen05b", "qwen2", dtype="bfloat16", **QWEN05_SHAPE)
make_tiny_model(work / "tiny", "llama", dtype="bfloat16")
print("models ready")
PY

run() {  # name, model, extra args...
  local name="$1" model="$2"; shift 2
  timeout "${RUN_TIMEOUT:-240}" "$PY" -m pypto_bench run --model-path "$model" --device cuda:0 --dtype bfloat16 \
    --regime decode --batch 1 --seq 16 --gen 128 --arms eager,graph --warmup 2 --iters 5 \
    --ignore-eos --no-progress --report-file "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $?" | tee -a "$OUT/exit_codes.txt"
  tail -8 "$OUT/$name.log"
}
run cuda_05b_bf16_b1 "$WORK/qwen05b"
run cuda_tiny_bf16_b1 "$WORK/tiny"

"$PY" - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| report | eager tok/s | graph tok/s | graph/eager | match | best-arm roofline | graph numerics |")
print("|---|---|---|---|---|---|---|")
for f in sorted(out.glob("cuda_*.json")):
    d = json.loads(f.read_text()); a = {x["name"]: x for x in d["arms"]}
    e, g = a["eager"], a["graph"]
    fr = [x["roofline"]["fraction_of_ceiling"] for x in d["arms"] if x["ok"] and x.get("roofline") and x["roofline"]["fraction_of_ceiling"]]
    m = (g.get("token_match") or {}).get("rate")
    print(f"| {f.stem} | {e['tokens_per_s']['best']} | {g['tokens_per_s']['best'] if g['ok'] else 'FAILED: ' + str(g['error'])[:120]} | "
          f"{g.get('ratio_to_eager')} | {m} | {max(fr) if fr else None} | "
          f"{(g.get('numerics') or {}).get('verdict')}: {(g.get('numerics') or {}).get('why')} |")
reports = sorted(out.glob("cuda_*.json"))
print()
print("device:", json.loads(reports[0].read_text())["environment"]["device"]["name"] if reports else "no report written (see *.log)")
PY
rm -rf "$WORK"
