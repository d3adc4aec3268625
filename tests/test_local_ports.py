"""`make run` and `make serve` side by side: the default ports of one never collide with
the other's (deploy/run-local.sh and its run-local.d/ parts, deploy/serve.sh). `make serve`
started its demo LLM on 8791, the port `make run` gives its demo x402 facilitator, so with
`make run` running `make serve` died at start-up ("demo-llm exited during start-up")."""
from __future__ import annotations

import re
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
DEFAULT = re.compile(r"\b([A-Z_]*PORT)=\"\$\{\1:-(\d+)\}\"")


def default_ports(*scripts: Path) -> dict[str, int]:
    found = {}
    for script in scripts:
        found.update({name: int(port) for name, port in DEFAULT.findall(script.read_text())})
    return found


def test_serve_and_run_default_ports_are_disjoint():
    run = default_ports(DEPLOY / "run-local.sh", *sorted((DEPLOY / "run-local.d").glob("*.sh")))
    serve = default_ports(DEPLOY / "serve.sh")
    assert {"PORT", "DEMO_PROVIDER_PORT", "DEMO_LLM_PORT", "DEMO_FACILITATOR_PORT"} <= set(run)
    assert {"SERVE_PORT", "SERVE_CHAT_PORT", "SERVE_APP_PORT", "DEMO_PROVIDER_PORT", "DEMO_LLM_PORT"} <= set(serve)
    shared = {port: (name, other) for name, port in serve.items() for other, p in run.items() if p == port}
    assert not shared, f"make serve and make run default to the same ports: {shared}"
