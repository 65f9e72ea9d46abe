# The fast tier on the oldest torch autotune supports (pyproject.toml: torch>=2.9), in a venv of
# its own. PyPI has only a CUDA build of torch 2.9.1 for x86_64: about 6.7 GB with its CUDA
# libraries, some 10 minutes to download and install on a fresh machine, so the venv is kept
# (OLDEST_TORCH_VENV) and reused while its torch is the one asked for. Without a GPU that CUDA
# build is also the suite on a CUDA build of torch (the `cuda_fakes` tests must not leak real
# CUDA calls there).
OLDEST_TORCH=2.9.1
OLDEST_TORCH_VENV=${OLDEST_TORCH_VENV:-$HOME/.cache/autotune-ci/venv-torch-$OLDEST_TORCH}

oldest_torch_fast_tier() {
  local py="$OLDEST_TORCH_VENV/bin/python"
  if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != '$OLDEST_TORCH')" 2>/dev/null; then
    rm -rf "$OLDEST_TORCH_VENV"
    # Room for the CUDA build (about 6.7 GB installed, its wheels besides while pip works).
    local free_kb
    mkdir -p "$(dirname "$OLDEST_TORCH_VENV")"
    free_kb=$(df -Pk "$(dirname "$OLDEST_TORCH_VENV")" | awk 'NR == 2 {print $4}')
    if [ "${free_kb:-0}" -lt $((12 * 1024 * 1024)) ]; then
      echo "OLDEST TORCH TIER NOT RUN: $((free_kb / 1024)) MiB free under $(dirname "$OLDEST_TORCH_VENV"), torch $OLDEST_TORCH needs about 12 GiB to install" >&2
      return 0
    fi
    python -m venv "$OLDEST_TORCH_VENV"
    # The environment failing to fetch 6.7 GB (a registry or network fault) is said loudly and
    # is not a test failure; a test that fails on the oldest torch is.
    if ! "$py" -m pip install --quiet "torch==$OLDEST_TORCH"; then
      echo "OLDEST TORCH TIER NOT RUN: pip could not install torch==$OLDEST_TORCH (see above)" >&2
      rm -rf "$OLDEST_TORCH_VENV"
      return 0
    fi
  fi
  # This checkout's autotune and its test dependencies; torch stays the one pinned.
  "$py" -m pip install --quiet -e '.[test]' "torch==$OLDEST_TORCH"
  "$py" -m pytest -q -m "not slow"
}
