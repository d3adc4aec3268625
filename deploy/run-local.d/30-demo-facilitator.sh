# Sourced by deploy/run-local.sh: the local demo x402 facilitator (demo/facilitator.py), so
# a live key's x402 payment works offline: x402 settles live payments only through a
# facilitator (no facilitator: x402 is not offered). It checks the EIP-3009 signature and
# answers a settlement; no USDC moves. A configured X402_FACILITATOR_URL is kept as it is.
# DEMO_FACILITATOR_PORT: named and exported by run-local.sh.
if [ -z "${X402_FACILITATOR_URL:-}" ]; then
  $BIN/python -m demo.facilitator --host 127.0.0.1 --port "$DEMO_FACILITATOR_PORT" >instance/demo-facilitator.log 2>&1 &
  pids+=($!)
  export X402_FACILITATOR_URL="http://127.0.0.1:${DEMO_FACILITATOR_PORT}"
fi
