# Sourced by deploy/run-local.sh: start the demo provider that serves catalog/modules/*.yaml
# on DEMO_PROVIDER_PORT (run-local.sh names and exports it, and the DEMO_PROVIDER_URL the
# catalog was loaded with).
$BIN/python -m demo.provider >instance/demo-provider.log 2>&1 &
pids+=($!)
