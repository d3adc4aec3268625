#!/usr/bin/env bash
# `make run`: the embedded default. Migrates the SQLite database under instance/, loads
# the demo catalog (when there is one), then runs gunicorn and the scheduler until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PORT="${PORT:-8000}"
export FLASK_APP=wsgi

$BIN/flask db upgrade
if [ -d catalog ] && $BIN/flask catalog --help >/dev/null 2>&1; then
  $BIN/flask catalog load
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for extra in deploy/run-local.d/*.sh; do
  [ -e "$extra" ] || continue
  # shellcheck disable=SC1090
  source "$extra"
done

$BIN/flask scheduler >instance/scheduler.log 2>&1 &
pids+=($!)

cat <<MSG

  Gateway listening on http://127.0.0.1:${PORT}   (API docs: http://127.0.0.1:${PORT}/docs)
  Create an account and its first key:
      .venv/bin/flask --app wsgi accounts create --email you@example.com
  Then:
      curl -H "Authorization: Bearer <key>" http://127.0.0.1:${PORT}/api/account

MSG
$BIN/gunicorn -c deploy/gunicorn.conf.py -b "127.0.0.1:${PORT}" wsgi:app &
pids+=($!)
wait "${pids[-1]}"
