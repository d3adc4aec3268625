#!/usr/bin/env bash
# `make run`: the embedded default. With no DATABASE_URL, starts the embedded PostgreSQL
# (data under instance/pg, app/services/platform/embedded_pg.py), migrates it, loads the
# demo catalog (when there is one), then runs gunicorn and the scheduler until Ctrl-C, and
# stops the embedded PostgreSQL on the way out. Every process here, and a `flask` command
# typed in another terminal meanwhile, finds that one server through instance/pg, and the
# other settings this run chose through instance/run-local.env.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PORT="${PORT:-8000}"
export FLASK_APP=wsgi

mkdir -p instance  # the logs below (and the embedded PostgreSQL's data) live here
# what a previous run chose (one killed before its cleanup) must not steer this one's
# commands (config.py RUN_LOCAL_ENV): this run writes its own below
rm -f instance/run-local.env

# A port another process listens on is refused before anything starts, naming its setting:
# a demo server that cannot bind would leave the stack running without it (its log says
# so, nobody reads it), and the gateway would talk to whatever holds the port.
require_free_port() {
  if (exec 3<>"/dev/tcp/127.0.0.1/${!1}") 2>/dev/null; then
    echo "make run: port ${!1} ($1) is already in use on 127.0.0.1: set $1 to a free port, or stop what listens there" >&2
    exit 1
  fi
}
# The demo servers' ports: named here only, exported; deploy/run-local.d/*.sh read them.
export DEMO_PROVIDER_PORT="${DEMO_PROVIDER_PORT:-8901}"
export DEMO_LLM_PORT="${DEMO_LLM_PORT:-8790}"
export DEMO_FACILITATOR_PORT="${DEMO_FACILITATOR_PORT:-8791}"
# the demo catalog's modules name the demo provider by this URL (catalog/modules/*.yaml)
export DEMO_PROVIDER_URL="${DEMO_PROVIDER_URL:-http://127.0.0.1:${DEMO_PROVIDER_PORT}}"
for setting in PORT DEMO_PROVIDER_PORT DEMO_LLM_PORT; do require_free_port "$setting"; done
# the demo facilitator runs only when no X402_FACILITATOR_URL is configured
[ -n "${X402_FACILITATOR_URL:-}" ] || require_free_port DEMO_FACILITATOR_PORT
pids=()
embedded=
cleanup() {
  rm -f instance/run-local.env
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$embedded" ]; then $BIN/python -m app.services.platform.embedded_pg stop >/dev/null || true; fi
}
trap cleanup EXIT INT TERM

if [ -z "${DATABASE_URL:-}" ]; then
  embedded=1
  echo "embedded PostgreSQL: $($BIN/python -m app.services.platform.embedded_pg start)"
fi

$BIN/flask db upgrade
if [ -d catalog ] && $BIN/flask catalog --help >/dev/null 2>&1; then
  $BIN/flask catalog load
fi

for extra in deploy/run-local.d/*.sh; do
  [ -e "$extra" ] || continue
  # shellcheck disable=SC1090
  source "$extra"
done

# What this run chose, for a `flask` command typed in another shell meanwhile (config.py
# RUN_LOCAL_ENV: it takes what its own environment does not set): the same database, Redis,
# demo servers, facilitator and chain. Removed on the way out.
( umask 077
  for name in PORT DATABASE_URL REDIS_URL DEMO_PROVIDER_PORT DEMO_LLM_PORT DEMO_FACILITATOR_PORT \
              DEMO_PROVIDER_URL X402_FACILITATOR_URL RPC_URL_BASE; do
    [ -z "${!name:-}" ] || printf '%s=%s\n' "$name" "${!name}"
  done ) >instance/run-local.env

$BIN/flask scheduler >instance/scheduler.log 2>&1 &
pids+=($!)
# With REDIS_URL set the jobs go to RQ (config.py: JOBS_INLINE is off then): a worker runs
# them, as in deploy/Procfile; without Redis they run inline where they are enqueued.
if [ -n "${REDIS_URL:-}" ]; then
  $BIN/flask worker >instance/worker.log 2>&1 &
  pids+=($!)
fi

$BIN/gunicorn -c deploy/gunicorn.conf.py -b "127.0.0.1:${PORT}" wsgi:app &
gunicorn_pid=$!
pids+=("$gunicorn_pid")
# The banner once the gateway accepts connections: gunicorn's master loads the app and what
# it would otherwise load on first use (app/preload.py) before its workers listen (seconds).
until (exec 3<>"/dev/tcp/127.0.0.1/${PORT}") 2>/dev/null; do
  kill -0 "$gunicorn_pid" 2>/dev/null || { echo "make run: gunicorn exited (its messages are above)" >&2; exit 1; }
  sleep 0.2
done
cat <<MSG

  Gateway listening on http://127.0.0.1:${PORT}   (API docs: http://127.0.0.1:${PORT}/docs)
  Create an account and its first key:
      .venv/bin/flask --app wsgi accounts create --email you@example.com
  Then:
      curl -H "Authorization: Bearer <key>" http://127.0.0.1:${PORT}/api/account

MSG
wait "$gunicorn_pid"
