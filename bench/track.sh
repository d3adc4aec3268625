#!/usr/bin/env bash
# Benchmark of POST /api/track (ingestion): gunicorn with deploy/gunicorn.conf.py, then wrk.
#   bench/track.sh                     # embedded PostgreSQL under a temp dir, no Redis
#   DATABASE_URL=postgresql://… REDIS_URL=redis://… bench/track.sh
# Env: DURATION (10s), CONNECTIONS (32), THREADS (4), WEB_CONCURRENCY (CPU count), PORT (18731).
# The per-IP limit is lifted for the run (TRACK_RATE_LIMIT), everything else is production code.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
[ -x "$BIN/gunicorn" ] || BIN=/work/main/.venv/bin
PORT=${PORT:-18731}
TMP=$(mktemp -d)
export INSTANCE_PATH="$TMP" TRACK_RATE_LIMIT="${TRACK_RATE_LIMIT:-1000000/second}" PORT
export GUNICORN_BIND="127.0.0.1:$PORT" LOG_LEVEL=WARNING
"$BIN/flask" --app wsgi db upgrade >/dev/null 2>&1
"$BIN/gunicorn" -c deploy/gunicorn.conf.py wsgi:app >"$TMP/gunicorn.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null
      "$BIN/python" -m app.services.platform.embedded_pg stop "$TMP/pg" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/openapi.json" >/dev/null && break; sleep 0.1; done
wrk -t"${THREADS:-4}" -c"${CONNECTIONS:-32}" -d"${DURATION:-10s}" --latency -s bench/track.lua "http://127.0.0.1:$PORT"
