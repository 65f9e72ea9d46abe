# Start a throwaway PostgreSQL server on 127.0.0.1 for the tests; exports AUTOTUNE_TEST_POSTGRES_URL.
start_postgres() {
  if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) || {
      echo "postgres: could not install the server" >&2; return 1; }
  fi
  local bin
  bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1)")
  local dir=/tmp/autotune-ci-pg port=54329
  rm -rf "$dir" && mkdir -p "$dir" && chown postgres "$dir" 2>/dev/null || true
  local as_pg="runuser -u postgres --"
  id postgres >/dev/null 2>&1 || as_pg=""
  $as_pg "$bin/initdb" -D "$dir/data" -U tuner --auth=trust >/dev/null
  $as_pg "$bin/pg_ctl" -D "$dir/data" -o "-p $port -k $dir -c listen_addresses=127.0.0.1" -l "$dir/log" -w start >/dev/null
  $as_pg "$bin/createdb" -h 127.0.0.1 -p $port -U tuner autotune
  export AUTOTUNE_TEST_POSTGRES_URL="postgresql://tuner@127.0.0.1:$port/autotune"
  echo "postgres: running at $AUTOTUNE_TEST_POSTGRES_URL"
}
