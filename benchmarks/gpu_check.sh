#!/usr/bin/env bash
# The first look at a GPU, in at most 8 minutes of wall time, downloading nothing:
#   `autotune doctor` (stops here, with its message, if torch.compile cannot work), a strong
#   hand-picked configuration of gpt2 (`autotune bench`), a short `autotune search` over
#   search_spaces/gpu_quick.yaml (it opens with the baseline and the checklist), `autotune
#   verify` of its recipe, then ONE table (benchmarks/gpu_table.py).
# Without a GPU it is a DRY RUN: the same pipeline on gpt2-tiny / CPU with tiny step counts.
#
#   bash benchmarks/gpu_check.sh [--skip-confirm]   # results under $OUT (or a temp dir)
#   --skip-confirm   skip the verify step, the check's confirmation run of the found recipe
#   AUTOTUNE_WHEELS=DIR   install missing dependencies from a carried wheelhouse, never the network
#
# Time budget on an H200 (estimates: nothing has run on a GPU yet), step by step. Each step runs
# under `timeout` with its cap, and never past the 8-minute deadline of the whole run, which
# trims the caps of the later steps when earlier ones ran long:
#
#   step            estimate   cap     what takes the time
#   dependencies        2 s     90 s   an import check; pip from the wheelhouse only if something is missing
#   doctor             15 s     60 s   torch import 5 s, CUDA context 2 s, one tiny compile 5 s, SDPA probes 1 s
#   strong bench       70 s    130 s   the strongest combination the space can express (packed, bf16, flash,
#                                      compile_scope=model, chunked loss): process and model 10 s, a cold
#                                      whole-model compile of one static shape (forward + lazy backward)
#                                      40-60 s, warm-up 10 s, 1 s timed window
#   search            250 s    280 s   stops starting trials after 150 s (--timeout); the last trial is bound by
#                                      --trial-timeout 90 s; then the search's own confirmation run of its best
#                                      (30-60 s). Trials: baseline ~20 s, checklist ~70 s (cold dynamic compile),
#                                      then 1-3 sampled trials of 15-60 s (inductor's cache serves repeated graphs)
#   verify             45 s     75 s   one fresh process, compile from the cache; skipped with --skip-confirm
#   table               2 s     30 s
#   total             384 s    (the deadline: 480 s)
#
# A GPU machine with torch but without optuna & co.: carry a wheelhouse made on a machine with
# internet (same Python version and platform), e.g.
#   pip download -d wheelhouse 'optuna>=5,<6' nvidia-ml-py 'sqlalchemy>=2' 'click>=8.1' 'pyyaml>=6' numpy tqdm
# and set AUTOTUNE_WHEELS=wheelhouse. When the system Python refuses installs (PEP 668,
# "externally-managed-environment"), they go to a target directory under the results instead.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_DEVICE_ORDER=PCI_BUS_ID
PY="${PYTHON:-python}"
OUT_DIR="${OUT:-$(mktemp -d -t autotune-gpucheck-XXXXXX)}"
mkdir -p "$OUT_DIR"
SKIP_CONFIRM=0
for arg in "$@"; do
  case "$arg" in
    --skip-confirm) SKIP_CONFIRM=1 ;;
    -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

BUDGET_S=480
START=$SECONDS
STEPS_LOG="$OUT_DIR/steps.tsv"
: > "$STEPS_LOG"

# run_step NAME CAP_S CMD...: CMD under `timeout`, for at most CAP_S and never past the deadline;
# stdout to $OUT_DIR/NAME.json, stderr to NAME.err; one line per step in steps.tsv.
run_step() {
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 5 ]; then
    echo "--- $name: skipped, the 8-minute budget is spent" >&2
    printf '%s\tskipped\t0\t0\n' "$name" >> "$STEPS_LOG"
    return 124
  fi
  echo "--- $name (at most ${limit} s)" >&2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$OUT_DIR/$name.json" 2> "$OUT_DIR/$name.err"
  local rc=$?
  [ "$rc" = 124 ] && echo "--- $name: timed out after ${limit} s (see $OUT_DIR/$name.err)" >&2
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$STEPS_LOG"
  return "$rc"
}

# --- dependencies: present, or from a carried wheelhouse; a target directory under PEP 668 ------
DEPS=('optuna>=5,<6' nvidia-ml-py 'sqlalchemy>=2' 'click>=8.1' 'pyyaml>=6' numpy tqdm)
deps_present() { "$PY" -c "import optuna, click, yaml, sqlalchemy, pynvml, tqdm" >/dev/null 2>&1; }
if ! deps_present; then
  if [ -z "${AUTOTUNE_WHEELS:-}" ]; then
    echo "missing optuna/click/pyyaml/sqlalchemy/nvidia-ml-py/tqdm: set AUTOTUNE_WHEELS=DIR (see the header)"; exit 1
  fi
  PIP=("$PY" -m pip install --quiet --no-index --find-links "$AUTOTUNE_WHEELS")
  if ! timeout 90 "${PIP[@]}" "${DEPS[@]}" 2> "$OUT_DIR/pip.err"; then
    if grep -q "externally-managed-environment" "$OUT_DIR/pip.err"; then
      TARGET="$OUT_DIR/pydeps"  # PEP 668: this Python's site-packages belong to the system
      timeout 90 "${PIP[@]}" --target "$TARGET" "${DEPS[@]}" 2>> "$OUT_DIR/pip.err" \
        || { echo "installing into $TARGET failed (see $OUT_DIR/pip.err)"; exit 1; }
      export PYTHONPATH="$PYTHONPATH:$TARGET"
    else
      echo "installing from $AUTOTUNE_WHEELS failed (see $OUT_DIR/pip.err)"; exit 1
    fi
  fi
  deps_present || { echo "dependencies still missing after installing from $AUTOTUNE_WHEELS"; exit 1; }
fi

# --- doctor: what this machine is, and whether compile can work ---------------------------------
AT=("$PY" -m autotune)
run_step doctor 60 "${AT[@]}" doctor --json
DOCTOR=$("$PY" - "$OUT_DIR/doctor.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("unreadable\t-\t-\tno report (see doctor.err)")
else:
    print("\t".join([d["device"]["kind"], "ok" if d["compile"]["ok"] else "fail", d["device"]["name"],
                     d["compile"]["detail"]]))
EOF
)
IFS=$'\t' read -r KIND COMPILE_OK DEVICE_NAME COMPILE_DETAIL <<< "$DOCTOR"
if [ "$KIND" = cuda ]; then
  DRY=0
  echo "GPU CHECK on $DEVICE_NAME; results in $OUT_DIR"
  if [ "$COMPILE_OK" != ok ]; then
    echo "STOPPED: torch.compile cannot work on this machine: $COMPILE_DETAIL"
    echo "every compiled trial would crash; fix it (autotune doctor says what is missing) and run again"
    exit 3
  fi
elif [ "$KIND" = cpu ]; then
  DRY=1
  echo "DRY RUN: no GPU here (autotune doctor found none); running the pipeline on gpt2-tiny/CPU with tiny step counts. Figures are meaningless."
else
  echo "STOPPED: autotune doctor did not report (see $OUT_DIR/doctor.err)"; exit 3
fi

if [ "$DRY" = 1 ]; then
  MODEL=gpt2-tiny; DEVICE=cpu; RUN=(--warmup 1 --steps 3 --min-time 0)
  STRONG=(--batching packed --set amp_dtype=float32 --set compile_mode=none --set sdpa_backend=flash
          --set num_workers=0 --set pin_memory=false --set token_budget=4096)
  # The baseline only: the same search command and files, and the table with its checklist
  # row missing. The checklist compiles on the CPU (~20 s here) and the test suite runs it in
  # every search it makes; a dry run proves the plumbing, not the compiler.
  SPACE="$ROOT/tests/spaces/tiny.yaml"; N_TRIALS=1; SEARCH_TIMEOUT=60; TRIAL_TIMEOUT=150
  # No re-measurement of the leaders: it would compile the checklist on the CPU again, for
  # figures a dry run does not have (the test suite covers the confirmation itself).
  SEARCH_EXTRA=(--no-confirm)
else
  MODEL=gpt2; DEVICE=cuda:0; RUN=(--warmup 3 --steps 10 --min-time 1)
  STRONG=(--batching packed --set amp_dtype=bfloat16 --set compile_mode=default --set compile_scope=model
          --set loss_impl=chunked --set sdpa_backend=flash --set num_workers=4 --set prefetch_factor=4 --set persistent_workers=true --set pin_memory=true
          --set token_budget=65536)
  SPACE="$ROOT/search_spaces/gpu_quick.yaml"; N_TRIALS=8; SEARCH_TIMEOUT=150; TRIAL_TIMEOUT=90
  SEARCH_EXTRA=()
fi

run_step strong 130 "${AT[@]}" bench --model "$MODEL" --device "$DEVICE" "${RUN[@]}" "${STRONG[@]}" --json

(cd "$OUT_DIR" && run_step search 280 "${AT[@]}" search --model "$MODEL" --device "$DEVICE" "${RUN[@]}" \
  --space "$SPACE" --n-trials "$N_TRIALS" --timeout "${SEARCH_TIMEOUT}s" --trial-timeout "${TRIAL_TIMEOUT}s" \
  --study gpucheck --storage "sqlite:///$OUT_DIR/gpucheck.db" --recipe "$OUT_DIR/recipe.json" "${SEARCH_EXTRA[@]}" --json)

if [ "$SKIP_CONFIRM" = 1 ]; then
  echo "--- verify: skipped (--skip-confirm)" >&2
elif [ -f "$OUT_DIR/recipe.json" ]; then
  run_step verify 75 "${AT[@]}" verify "$OUT_DIR/recipe.json" --device "$DEVICE" "${RUN[@]}" --json
else
  echo "no recipe from the search (see $OUT_DIR/search.err)" >&2
fi

timeout 30 "$PY" benchmarks/gpu_table.py "$OUT_DIR" "$DRY"
echo
echo "wall time: $((SECONDS - START)) s of the ${BUDGET_S} s budget; per step: $STEPS_LOG"
