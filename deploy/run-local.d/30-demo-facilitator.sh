# Sourced by deploy/run-local.sh: the local demo x402 facilitator (demo/facilitator.py), so
# a live key's x402 payment works offline: x402 settles live payments only through a
# facilitator (no facilitator: x402 is not offered). It checks the EIP-3009 signature and
# answers a settlement; no USDC moves. A configured X402_FACILITATOR_URL is kept as it is.
# DEMO_FACILITATOR_PORT: named and exported by run-local.sh.
if [ -z "${X402_FACILITATOR_URL:-}" ]; then
  $BIN/python -m demo.facilitator --host 127.0.0.1 --port "$DEMO_FACILITATOR_PORT" >instance/demo-facilitator.log 2>&1 &
  pids+=($!)
  export X402_FACILITATOR_URL="http://127.0.0.1:${DEMO_FACILITATOR_PORT}"
  # its stand-in chain (POST /rpc: the authorizations it settled are the used ones) is
  # the base chain here, unless one is configured: make run never asks a public network
  # (config.py names public nodes in production only)
  export RPC_URL_BASE="${RPC_URL_BASE:-${X402_FACILITATOR_URL}/rpc}"
fi
