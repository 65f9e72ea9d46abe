#!/usr/bin/env bash
# One GPU check, at most ~8 minutes on an H200, downloading nothing:
#   baseline, checklist and a strong hand-picked configuration of gpt2 (`autotune bench`),
#   a short `autotune search` over the CUDA space, `autotune verify` of its recipe,
#   then ONE table (tokens/s, MFU against the table peak and against 790 TFLOP/s, NVML and
#   allocator peak memory, speedups vs baseline, step-time CV).
# Without a GPU it is a DRY RUN: the same pipeline on gpt2-tiny / CPU with tiny step counts.
#
#   bash benchmarks/gpu_check.sh                 # results under $OUT (or a temp dir)
#   AUTOTUNE_WHEELS=wheelhouse bash benchmarks/gpu_check.sh
#
# A GPU machine with torch but without optuna & co.: carry a wheelhouse made on a machine with
# internet (same Python version and platform), e.g.
#   pip download -d wheelhouse 'optuna>=5,<6' nvidia-ml-py 'sqlalchemy>=2' 'click>=8.1' 'pyyaml>=6' numpy
# and set AUTOTUNE_WHEELS=wheelhouse: they are installed with pip --no-index --find-links.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
OUT_DIR="${OUT:-$(mktemp -d -t autotune-gpucheck-XXXXXX)}"
mkdir -p "$OUT_DIR"

if command -v nvidia-smi >/dev/null 2>&1 && "$PY" -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  DRY=0
  echo "GPU CHECK on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); results in $OUT_DIR"
else
  DRY=1
  echo "DRY RUN: no GPU here (nvidia-smi missing or torch.cuda unavailable); running the pipeline on gpt2-tiny/CPU with tiny step counts. Figures are meaningless."
fi

if [ -n "${AUTOTUNE_WHEELS:-}" ]; then
  "$PY" -m pip install --quiet --no-index --find-links "$AUTOTUNE_WHEELS" \
    'optuna>=5,<6' nvidia-ml-py 'sqlalchemy>=2' 'click>=8.1' 'pyyaml>=6' numpy || { echo "installing from $AUTOTUNE_WHEELS failed"; exit 1; }
fi
"$PY" -c "import optuna, click, yaml, sqlalchemy" 2>/dev/null || { echo "missing optuna/click/pyyaml/sqlalchemy: set AUTOTUNE_WHEELS=DIR (see the header)"; exit 1; }

if [ "$DRY" = 1 ]; then
  MODEL=gpt2-tiny; DEVICE=cpu; SEQ=128; RUN=(--warmup 1 --steps 3 --min-time 0)   # no minimum timed window: figures are meaningless here
  COMPILE=none; PIN=false; WORKERS=0; STRONG_BUDGET=4096   # compile/pinning are minutes or unsupported on CPU
  SEARCH=(--n-trials 1 --trial-timeout 120s --steps 3 --warmup 1 --min-time 0)
else
  MODEL=gpt2; DEVICE=cuda; SEQ=1024; RUN=(--warmup 3 --steps 15)
  COMPILE=default; PIN=true; WORKERS=4; STRONG_BUDGET=65536
  # --timeout stops new trials and --trial-timeout bounds the last one: the search ends by ~4.7 min
  # (3m + 100s), which keeps the whole check near 8 min; AUTOTUNE_SEARCH_TIMEOUT=4m for a longer one
  SEARCH=(--n-trials 8 --timeout "${AUTOTUNE_SEARCH_TIMEOUT:-3m}" --trial-timeout 100s --steps 10 --warmup 3)
fi
AT=("$PY" -m autotune)
COMMON=(--model "$MODEL" --device "$DEVICE" "${RUN[@]}")
FIXED=$((8 * SEQ))

step() { echo "--- $1" >&2; }
step "baseline"
"${AT[@]}" bench "${COMMON[@]}" --batching fixed --set amp_dtype=float32 --set compile_mode=none \
  --set sdpa_backend=math --set num_workers=0 --set pin_memory=false --set token_budget=$FIXED --json \
  > "$OUT_DIR/baseline.json" 2> "$OUT_DIR/baseline.err"
step "checklist"
"${AT[@]}" bench "${COMMON[@]}" --batching padded --set amp_dtype=bfloat16 --set compile_mode=$COMPILE \
  --set sdpa_backend=flash --set num_workers=$WORKERS --set pin_memory=$PIN --set token_budget=$FIXED --json \
  > "$OUT_DIR/checklist.json" 2> "$OUT_DIR/checklist.err"
step "strong"
"${AT[@]}" bench "${COMMON[@]}" --batching padded --set amp_dtype=bfloat16 --set compile_mode=$COMPILE \
  --set sdpa_backend=flash --set num_workers=$WORKERS --set pin_memory=$PIN --set token_budget=$STRONG_BUDGET --json \
  > "$OUT_DIR/strong.json" 2> "$OUT_DIR/strong.err"
step "search"
(cd "$OUT_DIR" && PYTHONPATH="$ROOT" "${AT[@]}" search --model "$MODEL" --device "$DEVICE" "${SEARCH[@]}" \
  $( [ "$DRY" = 1 ] && echo --space "$ROOT/tests/spaces/tiny.yaml" ) \
  --study gpucheck --storage "sqlite:///$OUT_DIR/gpucheck.db" --recipe "$OUT_DIR/recipe.json" --json \
  > "$OUT_DIR/search.json" 2> "$OUT_DIR/search.err")
step "verify"
if [ -f "$OUT_DIR/recipe.json" ]; then
  "${AT[@]}" verify "$OUT_DIR/recipe.json" --device "$DEVICE" "${RUN[@]}" --json > "$OUT_DIR/verify.json" 2> "$OUT_DIR/verify.err"
else
  echo "no recipe from the search (see $OUT_DIR/search.err)" >&2
fi
"$PY" benchmarks/gpu_table.py "$OUT_DIR" "$DRY"
