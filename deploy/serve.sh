#!/usr/bin/env bash
# `make serve`: the production stack on loopback, in one command, until Ctrl-C/SIGTERM.
#
#   nginx (deploy/nginx.conf rendered for loopback)  :SERVE_PORT (API host), :SERVE_CHAT_PORT (chat host)
#     -> gunicorn (deploy/gunicorn.conf.py, APP_ENV=production)  127.0.0.1:SERVE_APP_PORT
#   flask worker     (RQ)
#   flask scheduler  (app/tasks/schedule.py)
#   against PostgreSQL (DATABASE_URL; the database is created when missing) and Redis.
#
# It runs the migrations and `flask catalog load` (when that command exists), generates
# local secrets once (SECRET_KEY, METRICS_TOKEN under $SERVE_DIR), prints the URLs, and
# on Ctrl-C/SIGTERM stops every process it started (gracefully, then by force after
# SERVE_STOP_TIMEOUT seconds). If any process dies, the others are stopped and the exit
# status is non-zero. Settings (environment):
#
#   SERVE_PORT=8080 SERVE_CHAT_PORT=8081 SERVE_APP_PORT=8001 SERVE_DIR=instance/serve
#   DATABASE_URL=postgresql://postgres@127.0.0.1:5432/gateway REDIS_URL=redis://127.0.0.1:6379/0
#   WEB_CONCURRENCY=2 VENV_BIN=.venv/bin SERVE_START_TIMEOUT=90 SERVE_STOP_TIMEOUT=30
#   NGINX=$(command -v nginx) SERVE_DEMO=1 DEMO_PROVIDER_PORT=8902 DEMO_LLM_PORT=8792 (none shared with `make run`: 8901, 8790, 8791)
#   (any other app setting, see README, is passed on)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

BIN="${VENV_BIN:-.venv/bin}"
SERVE_PORT="${SERVE_PORT:-8080}"
SERVE_CHAT_PORT="${SERVE_CHAT_PORT:-8081}"
SERVE_APP_PORT="${SERVE_APP_PORT:-8001}"
SERVE_DIR="$(mkdir -p "${SERVE_DIR:-instance/serve}" && cd "${SERVE_DIR:-instance/serve}" && pwd)"
SERVE_STOP_TIMEOUT="${SERVE_STOP_TIMEOUT:-30}"
NGINX="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"

log() { echo "[serve] $*"; }
die() { echo "[serve] $*" >&2; exit 1; }

[ -x "$BIN/python" ] || die "no virtualenv at $BIN (run 'make venv' or set VENV_BIN)"
if [ ! -x "$NGINX" ]; then
  if [ "$(id -u)" = 0 ]; then bash deploy/system-packages.sh; NGINX=$(command -v nginx); else
    die "nginx is not installed: run 'sudo bash deploy/system-packages.sh'"; fi
fi

# --- environment of every process -----------------------------------------------------
secret() {  # secret FILE: a random token generated once, kept private
  local f="$SERVE_DIR/$1"
  if [ ! -s "$f" ]; then (umask 077; "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$f"); fi
  cat "$f"
}
export APP_ENV=production
export FLASK_APP=wsgi
export DATABASE_URL="${DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/gateway}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export SECRET_KEY="${SECRET_KEY:-$(secret secret_key)}"
export METRICS_TOKEN="${METRICS_TOKEN:-$(secret metrics_token)}"
# Production requires one receipt signing key for every node (base64 of a 32-byte ed25519 seed).
if [ -z "${RECEIPT_SIGNING_KEY:-}" ]; then
  f="$SERVE_DIR/receipt_signing_key"
  [ -s "$f" ] || (umask 077; "$BIN/python" -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())' >"$f")
  RECEIPT_SIGNING_KEY=$(cat "$f")
fi
export RECEIPT_SIGNING_KEY
export INSTANCE_PATH="${INSTANCE_PATH:-$SERVE_DIR/instance}"
export BASE_URL="${BASE_URL:-http://127.0.0.1:$SERVE_PORT}"
export TRUSTED_PROXIES="${TRUSTED_PROXIES:-1}"
# Demo modules and models of the local catalog live on loopback.
export ALLOW_PRIVATE_URLS="${ALLOW_PRIVATE_URLS:-1}"
export WEB_CONCURRENCY="${WEB_CONCURRENCY:-2}"
export GUNICORN_BIND="127.0.0.1:$SERVE_APP_PORT"
export PROMETHEUS_MULTIPROC_DIR="$SERVE_DIR/prometheus"
export PYTHONUNBUFFERED=1
# Demo upstreams (the demo module provider and the demo LLM) stand in for real providers
# on loopback, with a generated provider secret; SERVE_DEMO=0 leaves them out.
SERVE_DEMO="${SERVE_DEMO:-1}"
if [ "$SERVE_DEMO" = 1 ]; then
  export DEMO_PROVIDER_PORT="${DEMO_PROVIDER_PORT:-8902}"
  export DEMO_PROVIDER_URL="${DEMO_PROVIDER_URL:-http://127.0.0.1:$DEMO_PROVIDER_PORT}"
  export DEMO_PROVIDER_SECRET="${DEMO_PROVIDER_SECRET:-$(secret demo_provider_secret)}"
  export DEMO_LLM_PORT="${DEMO_LLM_PORT:-8792}"
  export DEMO_LLM_BASE_URL="${DEMO_LLM_BASE_URL:-http://127.0.0.1:$DEMO_LLM_PORT/v1}"
fi
mkdir -p "$INSTANCE_PATH" "$SERVE_DIR/logs" "$SERVE_DIR/nginx"
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

# --- ports: each must be free (another server on one of them would answer /readyz for
# this stack, and gunicorn's SO_REUSEPORT would share its port with another gunicorn) ---
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ports="SERVE_PORT SERVE_CHAT_PORT SERVE_APP_PORT"
[ "$SERVE_DEMO" != 1 ] || ports="$ports DEMO_PROVIDER_PORT DEMO_LLM_PORT"
for var in $ports; do
  if port_in_use "${!var}"; then die "port ${!var} ($var) is already in use on 127.0.0.1: set $var to a free port"; fi
done

# --- dependencies, schema, catalog ----------------------------------------------------
"$BIN/python" deploy/ensure_services.py "$DATABASE_URL" "$REDIS_URL"
log "migrating $DATABASE_URL"
"$BIN/flask" db upgrade >"$SERVE_DIR/logs/migrate.log" 2>&1 || { cat "$SERVE_DIR/logs/migrate.log" >&2; die "migration failed"; }
log "loading the catalog (flask catalog load)"
if ! "$BIN/flask" catalog load >"$SERVE_DIR/logs/catalog.log" 2>&1; then
  if grep -q "No such command 'catalog'" "$SERVE_DIR/logs/catalog.log"; then
    log "no 'flask catalog' command in this version: skipping the catalog load"
  else
    cat "$SERVE_DIR/logs/catalog.log" >&2; die "flask catalog load failed"
  fi
fi

"$BIN/python" deploy/render_nginx.py --prefix "$SERVE_DIR/nginx" --port "$SERVE_PORT" \
  --chat-port "$SERVE_CHAT_PORT" --upstream "127.0.0.1:$SERVE_APP_PORT" \
  --max-body "${MAX_BODY_BYTES:-1048576}" >"$SERVE_DIR/nginx/nginx.conf"
"$NGINX" -q -t -p "$SERVE_DIR/nginx" -c "$SERVE_DIR/nginx/nginx.conf" -e "$SERVE_DIR/nginx/logs/error.log" \
  || die "the rendered nginx.conf is invalid"

# --- processes --------------------------------------------------------------------------
declare -A PIDS=()
stopping=0
stop_all() {
  stopping=1
  trap '' INT TERM
  local name pid
  for name in nginx web worker scheduler demo-provider demo-llm; do
    pid="${PIDS[$name]:-}"; [ -n "$pid" ] || continue
    # nginx: QUIT = graceful; gunicorn: TERM = graceful; rq: TERM = finish the current job.
    if [ "$name" = nginx ]; then kill -QUIT "$pid" 2>/dev/null || true; else kill -TERM "$pid" 2>/dev/null || true; fi
  done
  local deadline=$((SECONDS + SERVE_STOP_TIMEOUT))
  for name in "${!PIDS[@]}"; do
    pid="${PIDS[$name]}"
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then log "$name did not stop in time; killing it"; kill -KILL "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
  done
  log "stopped"
}
on_signal() { log "stopping…"; stop_all; exit 0; }
trap on_signal INT TERM
trap '[ $stopping = 1 ] || stop_all' EXIT

start() {  # start NAME LOGFILE CMD...
  local name=$1 logfile=$2; shift 2
  "$@" >>"$logfile" 2>&1 &
  PIDS[$name]=$!
}
if [ "$SERVE_DEMO" = 1 ]; then
  start demo-provider "$SERVE_DIR/logs/demo-provider.log" "$BIN/python" -m demo.provider
  start demo-llm "$SERVE_DIR/logs/demo-llm.log" "$BIN/python" -m demo.llm --host 127.0.0.1 --port "$DEMO_LLM_PORT"
fi
start web "$SERVE_DIR/logs/web.log" "$BIN/gunicorn" -c deploy/gunicorn.conf.py wsgi:app
start worker "$SERVE_DIR/logs/worker.log" "$BIN/flask" worker
start scheduler "$SERVE_DIR/logs/scheduler.log" "$BIN/flask" scheduler
start nginx "$SERVE_DIR/logs/nginx.log" "$NGINX" -p "$SERVE_DIR/nginx" -c "$SERVE_DIR/nginx/nginx.conf" \
  -e "$SERVE_DIR/nginx/logs/error.log" -g "daemon off;"

http_ok() {  # http_ok URL: true when URL answers 2xx (curl, or Python when curl is missing)
  if command -v curl >/dev/null 2>&1; then curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null; else
    "$BIN/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" 2>/dev/null; fi
}
# Ready when /readyz answers 200 through nginx (database and Redis reachable).
ready=0
start_deadline=$((SECONDS + ${SERVE_START_TIMEOUT:-90}))
while [ $SECONDS -lt $start_deadline ]; do
  for name in "${!PIDS[@]}"; do
    kill -0 "${PIDS[$name]}" 2>/dev/null || { tail -n 30 "$SERVE_DIR/logs/$name.log" >&2 || true; die "$name exited during start-up"; }
  done
  if http_ok "http://127.0.0.1:$SERVE_PORT/readyz"; then ready=1; break; fi
  sleep 0.2
done
[ $ready = 1 ] || die "the stack did not become ready in ${SERVE_START_TIMEOUT:-90} s (logs: $SERVE_DIR/logs/)"

cat <<MSG

  Gateway (production mode) is up.
    API host   http://127.0.0.1:${SERVE_PORT}          (also http://api.localhost:${SERVE_PORT})
    Chat host  http://127.0.0.1:${SERVE_CHAT_PORT}          (also http://chat.localhost:${SERVE_PORT})  → /v1/chat/completions
    Docs       http://127.0.0.1:${SERVE_PORT}/docs
    Health     http://127.0.0.1:${SERVE_PORT}/healthz   http://127.0.0.1:${SERVE_PORT}/readyz
    Metrics    curl -H "Authorization: Bearer \$(cat ${SERVE_DIR}/metrics_token)" http://127.0.0.1:${SERVE_PORT}/metrics
    Logs       ${SERVE_DIR}/logs/{web,worker,scheduler}.log   ${SERVE_DIR}/nginx/logs/
    Database   ${DATABASE_URL}    Redis ${REDIS_URL}

  Create an account and its first key (same environment as the stack):
    APP_ENV=production SECRET_KEY=\$(cat ${SERVE_DIR}/secret_key) RECEIPT_SIGNING_KEY=\$(cat ${SERVE_DIR}/receipt_signing_key) DATABASE_URL=${DATABASE_URL} \\
      REDIS_URL=${REDIS_URL} INSTANCE_PATH=${INSTANCE_PATH} ${BIN}/flask --app wsgi accounts create --email you@example.com
    curl -H "Authorization: Bearer <key>" http://127.0.0.1:${SERVE_PORT}/api/account

  Ctrl-C stops everything.
MSG
echo "[serve] ready" # a stable marker for scripts and tests

# Run until a signal (handled by on_signal) or until any process exits.
set +e
wait -n "${PIDS[@]}"
status=$?
if [ $stopping = 0 ]; then
  for name in "${!PIDS[@]}"; do
    if ! kill -0 "${PIDS[$name]}" 2>/dev/null; then log "$name exited (status $status); stopping the others"; fi
  done
  stop_all
  exit 1
fi
