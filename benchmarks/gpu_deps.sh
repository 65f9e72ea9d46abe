# Sourced by gpu_check.sh and gpu_ranks_check.sh: what autotune needs beyond torch, installed from
# the carried wheelhouse (benchmarks/gpu_wheelhouse.py), offline, into a folder of its own.
#
#   gpu_deps_ready PY WHEELS SITE LOG    0 when the dependencies import (installing them if not)
#
# --target sidesteps a system Python's PEP 668 refusal; --no-deps because the wheelhouse holds
# exactly what the machine lacks (gpu_wheelhouse.py resolved it against the machine's image).
# AUTOTUNE_GPU_CHECK_INSTALL=always installs even where nothing is missing (the dry run's proof
# that the offline install works). The caller puts SITE on PYTHONPATH.

GPU_DEPS_IMPORTS="import optuna, sqlalchemy, alembic, colorlog, mako, click, yaml, pynvml, numpy"

gpu_deps_present() { "$1" -c "$GPU_DEPS_IMPORTS" 2>/dev/null; }

gpu_deps_ready() {
  local py=$1 wheels=$2 site=$3 log=$4
  if ! gpu_deps_present "$py" || [ "${AUTOTUNE_GPU_CHECK_INSTALL:-}" = always ]; then
    shopt -s nullglob; local found=("$wheels"/*.whl); shopt -u nullglob
    if [ "${#found[@]}" = 0 ]; then
      echo "missing dependencies and no wheels in $wheels: run python benchmarks/gpu_wheelhouse.py where PyPI is reachable, and carry .wheelhouse"
      return 1
    fi
    timeout 30 "$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "${found[@]}" > "$log" 2>&1 \
      || { cat "$log"; echo "installing from $wheels failed"; return 1; }
  fi
  gpu_deps_present "$py" || { "$py" -c "$GPU_DEPS_IMPORTS"; echo "dependencies still missing"; return 1; }
}
