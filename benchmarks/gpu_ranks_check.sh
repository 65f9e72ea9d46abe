#!/usr/bin/env bash
# The multi-GPU step of the GPU check (issue 27): one command of at most 300 s, from the
# repository root, that downloads nothing:
#
#   bash benchmarks/gpu_ranks_check.sh            # OUT=DIR keeps the files (default: a temporary folder)
#
# Where two or more GPUs are visible: a short `autotune search --nproc-per-node N` of GPT-2 124M
# on N = min(GPUs, 8) of them (NCCL, search_spaces/gpt2_ddp.yaml, no reference trials, no
# re-measurement of the leaders; the best's single-rank reference for its scaling efficiency),
# then its figures: global and per-device tokens/s, scaling efficiency, straggler ratio, what a
# rank costs to start. With one GPU it says so and stops (there is nothing multi-GPU to check).
# Without a GPU it is a DRY RUN: the same search with 2 gloo ranks of gpt2-tiny on this CPU, whose
# figures mean nothing.
#
#   step      cap     what takes the time
#   count      20 s   torch's import and CUDA's device count
#   search    260 s   each trial a launch of N ranks (~10 s of imports and rendezvous each), at most
#                     4 trials, none started after 150 s, none run past 90 s; then the single-rank
#                     reference of the best
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
command -v "$PY" > /dev/null || PY=python3
OUT_DIR=${OUT:-$(mktemp -d)}
mkdir -p "$OUT_DIR"
cd "$ROOT" || exit 1
# What autotune needs beyond torch, from the carried wheelhouse, as gpu_check.sh installs it (the
# GPU machine has no optuna).
SITE=$(mktemp -d -t autotune-rankscheck-site-XXXXXX)
trap 'rm -rf "$SITE"' EXIT
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/benchmarks/gpu_deps.sh"
gpu_deps_ready "$PY" "${AUTOTUNE_WHEELS:-$ROOT/.wheelhouse}" "$SITE" "$OUT_DIR/pip.log" || exit 1

GPUS=$(timeout 20 "$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
GPUS=${GPUS:-0}
if [ "$GPUS" = 1 ]; then
  echo "one GPU here: the multi-GPU step needs two or more; skipped (bash benchmarks/gpu_check.sh checks one GPU)"
  exit 0
elif [ "$GPUS" -ge 2 ] 2>/dev/null; then
  N=$((GPUS < 8 ? GPUS : 8))
  echo "MULTI-GPU CHECK: $N of $GPUS GPUs, one launch of $N ranks a trial; files in $OUT_DIR"
  ARGS=(--model gpt2 --device cuda --nproc-per-node "$N" --warmup 3 --steps 10 --min-time 1
    --n-trials 4 --timeout 150s --trial-timeout 90s)
else
  N=2
  echo "DRY RUN: no GPU here; 2 gloo ranks of gpt2-tiny on this CPU. Figures are meaningless. Files in $OUT_DIR"
  ARGS=(--model gpt2-tiny --device cpu --nproc-per-node 2 --warmup 1 --steps 4 --min-time 0
    --n-trials 2 --timeout 120s --trial-timeout 120s)
fi

timeout 260 "$PY" -m autotune search "${ARGS[@]}" --no-references --no-confirm --study ranks-check \
  --storage "sqlite:///$OUT_DIR/ranks.db" --recipe "$OUT_DIR/recipe.json" --json \
  > "$OUT_DIR/search.json" 2> "$OUT_DIR/search.err"
rc=$?
[ "$rc" = 124 ] && echo "the search timed out after 260 s (see $OUT_DIR/search.err)"
"$PY" - "$OUT_DIR/search.json" <<'EOF'
import json, sys

try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("no summary (see search.err)")
    sys.exit(1)
best = s.get("best") or {}
ref = s.get("single_rank_reference") or {}
m = best.get("measurement") or {}
phase = m.get("phase_s") or {}


def rate(v):
    return f"{v:,.0f}" if isinstance(v, (int, float)) else "n/a"


rows = [
    ("ranks", s.get("world_size")),
    ("best trial", best.get("number")),
    ("global tokens/s", rate(s.get("global_tokens_per_sec"))),
    ("per-device tokens/s", rate(s.get("per_device_tokens_per_sec"))),
    ("single-rank tokens/s", rate(ref.get("tokens_per_sec"))),
    ("scaling efficiency", f"{s['scaling_efficiency']:.1%}" if s.get("scaling_efficiency") else "n/a"),
    ("straggler ratio", f"{s['straggler_ratio']:.3f}" if s.get("straggler_ratio") else "n/a"),
    ("rank start / imports / rendezvous (s)",
     " / ".join(f"{phase.get(k, 0):.1f}" for k in ("rank_start", "rank_imports", "rank_rendezvous"))),
    ("config", ", ".join(f"{k}={v}" for k, v in (best.get("config") or {}).items()
                         if k in ("parallelism", "bucket_cap_mb", "static_graph", "reshard_after_forward",
                                  "reduce_dtype", "token_budget", "amp_dtype", "compile_mode"))),
    ("trials", s.get("counts")),
]
print("| figure | value |\n|---|---|")
for name, value in rows:
    print(f"| {name} | {value} |")
sys.exit(0 if s.get("world_size") else 1)
EOF
