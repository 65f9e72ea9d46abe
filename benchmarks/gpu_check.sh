#!/usr/bin/env bash
# The first run on a GPU: one command of at most 360 s that downloads nothing and leaves at most
# 6 files in $OUT. From the repository root:
#
#   python benchmarks/gpu_wheelhouse.py           # here, once: .wheelhouse/, what the GPU machine lacks
#   bash benchmarks/gpu_check.sh                  # there, with .wheelhouse carried along
#
# Without a GPU it is a DRY RUN: the same steps on gpt2-tiny on this CPU; its figures mean nothing.
#   PYTHON=...                   the interpreter (default: python, else python3)
#   AUTOTUNE_WHEELS=DIR          the wheelhouse (default: .wheelhouse)
#   AUTOTUNE_GPU_CHECK_INSTALL=always   install the wheelhouse even where nothing is missing (the
#                                dry run's proof that the offline install works)
#
# Steps, each under `timeout` with its cap and never past the 360 s deadline, which trims the
# caps of the later steps when earlier ones ran long (estimates for an H200, torch 2.11:
# nothing has run on a GPU yet):
#
#   step            estimate   cap     what takes the time
#   dependencies       10 s     30 s   pip install --no-index --no-deps --target, only if something is missing
#   doctor             25 s     60 s   torch and CUDA start, one compile nothing cached, SDPA kernels, a bf16 matmul's rate
#   probes             25 s     45 s   fp16 + chunked loss gradients against fp32 (32k tokens), a trial forked from the
#                                      fork server (process start, gpt2-tiny on the GPU)
#   generate           40 s     60 s   bench --task generate: gpt2, the article's cure (bf16, static cache, CUDA graphs of
#                                      the decode step), 128 prompt + 128 new tokens; the correctness check
#   llama              25 s     45 s   bench of a Hugging Face Llama with checkpointed blocks, compiled, under the forced
#                                      memory-efficient kernel, padded batches (issue G's case, on the GPU's kernels)
#   search            205 s    225 s   the baseline (~20 s), the checklist (~60 s: a dynamic compile), then the planner's
#                                      first proposals (~55 s of starts at the full cap); none runs past 75 s, and
#                                      none starts so late that it would outlive the step (its --timeout is what is
#                                      left less a trial's and a process start: 225 - 75 - 15 = 135 s); no
#                                      re-measurement of the leaders; stopped anyway, the table reads its study
#   table               5 s     20 s
#   total             335 s    (the deadline: 360 s; the search comes last and is trimmed first)
#
# $OUT (a temporary folder if unset) gets three files: table.md (what this prints), figures.json
# (every figure of the table, for docs/gpu-check.md) and gpu_check.tar.gz (each step's output
# and log, the study and its recipe).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CUDA_DEVICE_ORDER=PCI_BUS_ID
PY="${PYTHON:-$(command -v python || command -v python3)}"
[ -n "$PY" ] || { echo "no python or python3 on the PATH: set PYTHON"; exit 1; }
WHEELS="${AUTOTUNE_WHEELS:-$ROOT/.wheelhouse}"
# Options first: a wrong one leaves nothing behind.
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
OUT_DIR="${OUT:-$(mktemp -d -t autotune-gpucheck-XXXXXX)}"
# Where the results go must take them, before minutes are spent making them.
if ! mkdir -p "$OUT_DIR" 2>/dev/null || ! { : > "$OUT_DIR/.writable"; } 2>/dev/null; then
  echo "gpu_check.sh: cannot write the results to $OUT_DIR (OUT): make it writable, or set OUT to a folder that is" >&2
  exit 2
fi
rm -f "$OUT_DIR/.writable"
WORK="$(mktemp -d -t autotune-gpucheck-work-XXXXXX)"
SITE="$(mktemp -d -t autotune-gpucheck-site-XXXXXX)"
trap 'rm -rf "$WORK" "$SITE"' EXIT

BUDGET_S=360
START=$SECONDS
STEPS_LOG="$WORK/steps.tsv"
: > "$STEPS_LOG"

# step_limit CAP_S: what a step starting now may take, its cap or what is left of the deadline.
step_limit() {
  local left=$((BUDGET_S - (SECONDS - START)))
  echo $(( $1 < left ? $1 : left ))
}

# run_step NAME CAP_S CMD...: CMD under `timeout`, for at most CAP_S and never past the deadline;
# stdout to $WORK/NAME.json, stderr to NAME.err; one line per step in steps.tsv.
run_step() {
  local name=$1 cap=$2; shift 2
  local limit; limit=$(step_limit "$cap")
  if [ "$limit" -lt 5 ]; then
    echo "--- $name: skipped, the ${BUDGET_S} s budget is spent" >&2
    printf '%s\tskipped\t0\t0\n' "$name" >> "$STEPS_LOG"
    return 124
  fi
  echo "--- $name (at most ${limit} s)" >&2
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.json" 2> "$WORK/$name.err"
  local rc=$?
  # 124: timeout's TERM ended it; 137: the KILL that follows when TERM did not.
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "--- $name: timed out after ${limit} s, stopped (see $name.err in the tarball)" >&2
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$STEPS_LOG"
  return "$rc"
}

# Everything a run wrote, as one tarball beside table.md and figures.json: at most 6 files come back.
finish() {
  tar -czf "$OUT_DIR/gpu_check.tar.gz" -C "$WORK" . 2>/dev/null
  echo "wall time: $((SECONDS - START)) s of the ${BUDGET_S} s budget; files: $(ls "$OUT_DIR" | tr '\n' ' ')"
}

# --- dependencies: from the carried wheelhouse, offline, into a target directory ----------------
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/benchmarks/gpu_deps.sh"
t0=$SECONDS
gpu_deps_ready "$PY" "$WHEELS" "$SITE" "$WORK/pip.log" || exit 1
"$PY" -c "import optuna; print(optuna.__version__, optuna.__file__)" > "$WORK/deps.txt"
printf 'dependencies\t0\t%s\t30\n' "$((SECONDS - t0))" >> "$STEPS_LOG"

# --- doctor: what this machine is, whether compile can work, and its matmul rate ----------------
AT=("$PY" -m autotune)
run_step doctor 60 "${AT[@]}" doctor --json
DOCTOR=$("$PY" - "$WORK/doctor.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print("\t".join([d["device"]["kind"], "ok" if d["compile"]["ok"] else "fail", d["device"]["name"], d["compile"]["detail"]]))
except (OSError, ValueError, KeyError, TypeError):
    print("unreadable\t-\t-\tno report (see doctor.err)")
EOF
)
IFS=$'\t' read -r KIND COMPILE_OK DEVICE_NAME COMPILE_DETAIL <<< "$DOCTOR"
if [ "$KIND" = cuda ]; then
  DRY=0
  echo "GPU CHECK on $DEVICE_NAME; files in $OUT_DIR"
  if [ "$COMPILE_OK" != ok ]; then
    echo "STOPPED: torch.compile cannot work on this machine: $COMPILE_DETAIL"
    echo "every compiled trial would crash; fix it (autotune doctor says what is missing) and run again"
    finish; exit 3
  fi
elif [ "$KIND" = cpu ]; then
  DRY=1
  echo "DRY RUN: no GPU here (autotune doctor found none); the same steps on gpt2-tiny/CPU. Figures are meaningless."
else
  echo "STOPPED: autotune doctor did not report: $(tail -n 3 "$WORK/doctor.err" 2>/dev/null)"; finish; exit 3
fi

if [ "$DRY" = 1 ]; then
  MODEL=gpt2-tiny; DEVICE=cpu; RUN=(--warmup 1 --steps 3 --min-time 0)
  # A CPU emulates float16 matmuls: a narrow head and 256 tokens (the figures mean nothing here;
  # 1,024 took 22 s of the dry run); a loaded CPU starts the fork server in seconds, not the GPU
  # machine's fraction of one.
  PROBE=(--tokens 256 --width 32); PROBE_CAP=120
  # The baseline only: the same command and files, the table's checklist row missing (the
  # checklist compiles on the CPU, ~20 s; the test suite runs it in every search it makes).
  SPACE="$ROOT/tests/spaces/tiny.yaml"; N_TRIALS=1; TRIAL_TIMEOUT=100
  # Generation: a static cache, eager (a CPU compile takes tens of seconds; the GPU's is the cure's).
  GENERATE=(--prompt-len 16 --new-tokens 8 --set kv_cache=static --warmup 0 --steps 3 --min-time 0)
  # The Llama case on the CPU's forced kernel (the one that crashed), eager: compiled on a CPU it
  # took 29 s of the dry run, and the test suite compiles it (tests/knobs/test_checkpoint_compile.py).
  LLAMA_KERNEL=math; LLAMA_COMPILE=none; LLAMA_CAP=120
else
  MODEL=gpt2; DEVICE=cuda:0; RUN=(--warmup 3 --steps 10 --min-time 1)
  PROBE=(--tokens 32768); PROBE_CAP=45
  SPACE="$ROOT/search_spaces/gpu_quick.yaml"; N_TRIALS=8; TRIAL_TIMEOUT=75
  GENERATE=(--prompt-len 128 --new-tokens 128 --set kv_cache=static --set decode_compile=reduce-overhead
    --set dtype=bfloat16 --warmup 1 --steps 5 --min-time 1)
  LLAMA_KERNEL=efficient; LLAMA_COMPILE=default; LLAMA_CAP=45
fi

# --- probes: the fp16 + chunked loss gradients, and a trial forked from the fork server ---------
run_step probes "$PROBE_CAP" "$PY" benchmarks/gpu_probes.py --device "$DEVICE" "${PROBE[@]}"

# --- generation: the article's cure, measured (TTFT and per-token p50/p99, the correctness check) ---
run_step generate 60 "${AT[@]}" bench --task generate --model "$MODEL" --device "$DEVICE" "${GENERATE[@]}" --json

# --- a Llama's checkpointed blocks compiled, under a forced kernel: forward and recompute agree --
run_step llama "$LLAMA_CAP" "${AT[@]}" bench --model hf:llama-tiny --device "$DEVICE" --set batching=padded \
  --set checkpoint_layers=0,1 --set compile_mode="$LLAMA_COMPILE" --set sdpa_backend="$LLAMA_KERNEL" \
  --warmup 1 --steps 3 --min-time 0 --json

# --- a short search: the two reference trials, then the planner's first proposals --------------
# No trial may start so late that it outlives the step: the search stops starting them a trial's
# length (and its process start) before the step's limit.
SEARCH_CAP=$(step_limit 225)
SEARCH_TIMEOUT=$(( SEARCH_CAP - TRIAL_TIMEOUT - 15 ))
[ "$SEARCH_TIMEOUT" -ge 10 ] || SEARCH_TIMEOUT=10
(cd "$WORK" && run_step search "$SEARCH_CAP" "${AT[@]}" search --model "$MODEL" --device "$DEVICE" "${RUN[@]}" \
  --space "$SPACE" --n-trials "$N_TRIALS" --timeout "${SEARCH_TIMEOUT}s" --trial-timeout "${TRIAL_TIMEOUT}s" \
  --study gpucheck --storage "sqlite:///$WORK/gpucheck.db" --recipe "$WORK/recipe.json" --no-confirm --json)

timeout 20 "$PY" benchmarks/gpu_table.py "$WORK" "$DRY" > "$WORK/table.md" 2> "$WORK/table.err"
cat "$WORK/table.md"
cp "$WORK/table.md" "$OUT_DIR/table.md"
[ -f "$WORK/figures.json" ] && cp "$WORK/figures.json" "$OUT_DIR/figures.json"
finish
