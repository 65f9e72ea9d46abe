# Start a throwaway PostgreSQL server on 127.0.0.1 for the tests; exports AUTOTUNE_TEST_POSTGRES_URL.
# Idempotent: when the server of an earlier call is still running it is reused, never wiped
# (deleting the data directory of a running server takes it down for whoever else uses it).
start_postgres() {
  if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) || {
      echo "postgres: could not install the server" >&2; return 1; }
  fi
  local bin
  bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1)")
  [ -x "$bin/initdb" ] || bin=$(dirname "$(command -v initdb)")
  local dir=${AUTOTUNE_CI_PG_DIR:-/tmp/autotune-ci-pg} port=${AUTOTUNE_CI_PG_PORT:-54329}
  local url="postgresql://tuner@127.0.0.1:$port/autotune"
  # initdb refuses to run as root: as root, run the server as the postgres user (made if missing).
  local as_pg=()
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    as_pg=(runuser -u postgres --)
  fi
  if [ -f "$dir/data/postmaster.pid" ] && "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    export AUTOTUNE_TEST_POSTGRES_URL="$url"
    echo "postgres: already running at $AUTOTUNE_TEST_POSTGRES_URL"
    return 0
  fi
  if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" >/dev/null 2>&1; then
    echo "postgres: port $port is taken by another server; set AUTOTUNE_CI_PG_PORT" >&2
    return 1
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  [ ${#as_pg[@]} -eq 0 ] || chown postgres "$dir"
  "${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U tuner --auth=trust >/dev/null
  "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" \
    -l "$dir/log" -w start >/dev/null || { tail -n 20 "$dir/log" >&2; return 1; }
  "${as_pg[@]}" "$bin/createdb" -h 127.0.0.1 -p "$port" -U tuner autotune
  export AUTOTUNE_TEST_POSTGRES_URL="$url"
  echo "postgres: running at $AUTOTUNE_TEST_POSTGRES_URL"
}
