# Sourced by deploy/run-local.sh: start the demo provider that serves catalog/modules/*.yaml.
# DEMO_PROVIDER_PORT (default 8901) must match DEMO_PROVIDER_URL used by `flask catalog load`.
DEMO_PROVIDER_PORT="${DEMO_PROVIDER_PORT:-8901}"
export DEMO_PROVIDER_PORT
$BIN/python -m demo.provider >instance/demo-provider.log 2>&1 &
pids+=($!)
if [ "$DEMO_PROVIDER_PORT" != "8901" ] && [ -z "${DEMO_PROVIDER_URL:-}" ]; then
  export DEMO_PROVIDER_URL="http://127.0.0.1:${DEMO_PROVIDER_PORT}"
  $BIN/flask catalog load >/dev/null   # re-point the demo catalog at this port
fi
