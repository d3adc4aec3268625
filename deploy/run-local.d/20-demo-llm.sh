# Sourced by deploy/run-local.sh: the local demo LLM (demo/llm.py), the chat host's
# `demo_llm` provider in the embedded default, so chat completions work offline, on
# DEMO_LLM_PORT (run-local.sh names and exports it; config.py builds the provider's URL
# from it).
$BIN/python -m demo.llm --host 127.0.0.1 --port "$DEMO_LLM_PORT" >instance/demo-llm.log 2>&1 &
pids+=($!)
