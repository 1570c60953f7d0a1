#!/usr/bin/env bash
# The GPU check, one command on a lent GPU machine (one H100 or H200; torch with CUDA, accelerate,
# transformers; no vLLM, no network), within 8 minutes:
#
#     bash benchmarks/gpu_check.sh        # logs and JSON under $OUT if set, else a temp dir
#
# Parts, each in its own log, each time-boxed with `timeout` and never past the 8-minute deadline
# (a part with under 10 s left is skipped); a failing part does not stop the others:
#   device       nvidia-smi, torch / accelerate / transformers versions
#   test_gpu     pytest tests/test_gpu.py (FSDP2 train -> save -> resume, checkpointing gradients,
#                bf16 step 1)
#   mem_*        benchmarks/gpu_memory.py at the 3B shape, micro-batch 2 x 4,096: checkpointing
#                off / on x reference float32 / bf16, then --fsdp, then micro-batch 1 (so that the
#                plan fits a line in tokens); plan: the plan from all of them (--figures)
#   precision    benchmarks/precision.py: float32 against bf16 seconds per step
#   suite        the whole suite with the GPU visible (pytest-xdist's -n auto where installed), with
#                the time that is left, each failure named as it happens (-v): on an H100 with 16
#                cores it had not finished after 194 s, nor after 170 s with -n 16
# It ends by printing every figure in one block, and each part's exit code (124: out of time).
set -u
shopt -s nullglob  # a measurement that did not finish leaves no JSON for the plan
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
DEADLINE=$((SECONDS + 470))
declare -A RC
PARTS=()

# part NAME LIMIT_SECONDS COMMAND...: run COMMAND into $OUT_DIR/NAME.log under timeout
part() {
    local name=$1 limit=$2 left=$((DEADLINE - SECONDS)) start=$SECONDS
    shift 2
    PARTS+=("$name")
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        RC[$name]="skipped (8-minute deadline)"
        echo "== $name: skipped, ${left} s left"
        return
    fi
    echo "== $name (up to ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
    RC[$name]=$?
    echo "   exit ${RC[$name]} after $((SECONDS - start)) s"
}

part device 20 bash -c "nvidia-smi; $PY -c '
import accelerate, torch, transformers
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"accelerate\",
      accelerate.__version__, \"transformers\", transformers.__version__)
print(\"device\", torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"NO CUDA\")'"

part test_gpu 120 $PY -m pytest -q tests/test_gpu.py

MEM="$PY benchmarks/gpu_memory.py --shape 3B --micro_batch 2 --length 4096"
part mem_off_f32 50 $MEM --ref_dtype float32 --json "$OUT_DIR/mem_off_f32.json"
part mem_off_bf16 50 $MEM --ref_dtype compute --json "$OUT_DIR/mem_off_bf16.json"
part mem_on_f32 50 $MEM --gradient_checkpointing --ref_dtype float32 \
    --json "$OUT_DIR/mem_on_f32.json"
part mem_on_bf16 50 $MEM --gradient_checkpointing --ref_dtype compute \
    --json "$OUT_DIR/mem_on_bf16.json"
part mem_fsdp 60 $MEM --gradient_checkpointing --ref_dtype compute --fsdp \
    --json "$OUT_DIR/mem_fsdp.json"
part mem_on_bf16_mb1 50 $PY benchmarks/gpu_memory.py --shape 3B --micro_batch 1 \
    --length 4096 --gradient_checkpointing --ref_dtype compute --json "$OUT_DIR/mem_mb1.json"
part plan 30 $PY benchmarks/gpu_memory.py --plan_only --figures "$OUT_DIR"/mem_*.json \
    --json "$OUT_DIR/plan.json"

part precision 120 $PY benchmarks/precision.py --steps 3 --out "$OUT_DIR/precision" \
    --json "$OUT_DIR/precision.json"

if $PY -c "import xdist" 2>/dev/null; then
    part suite 600 $PY -m pytest -v -rfE -n auto tests
else
    part suite 600 $PY -m pytest -v -rfE tests
fi

echo
echo "==================== every figure ($OUT_DIR) ===================="
grep -h "^torch\|^device" "$OUT_DIR/device.log"
[[ -f "$OUT_DIR/test_gpu.log" ]] && grep -h "PASSED\|FAILED\|ERROR\|passed\|failed" "$OUT_DIR/test_gpu.log"
if [[ -f "$OUT_DIR/suite.log" ]]; then
    echo "suite: $(grep -c " PASSED \| SKIPPED " "$OUT_DIR/suite.log") passed or skipped so far; failed:"
    grep -h " FAILED \| ERROR " "$OUT_DIR/suite.log" | sed 's/^.*\(FAILED\|ERROR\) /  /' | sort -u
    tail -n 1 "$OUT_DIR/suite.log"
fi
for log in "$OUT_DIR"/mem_*.log; do
    [[ -f "$log" ]] || continue
    echo "-- $(basename "$log" .log)"
    grep -h "^device:\|^| parameters\|^| gradients\|^| optimizer\|^| reference\|^| remainder\|^| \*\*\|^| resident\|out of memory" "$log"
done
[[ -f "$OUT_DIR/plan.log" ]] && sed -n '/^PLAN/,$p' "$OUT_DIR/plan.log"
[[ -f "$OUT_DIR/precision.log" ]] && echo "-- precision" && grep -v "it/s\]" "$OUT_DIR/precision.log"
echo "-- exit codes (124: out of time)"
for name in "${PARTS[@]}"; do echo "$name: ${RC[$name]}"; done
