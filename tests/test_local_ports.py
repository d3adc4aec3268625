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


def test_serve_refuses_a_port_in_use_before_anything_else(tmp_path):
    # SERVE_APP_PORT on another engineer's gunicorn: nginx sent /readyz there, `make serve`
    # said "ready", then its own gunicorn died and it stopped with "web exited (status 1)"
    # and no reason; a busy nginx port said only "nginx exited during start-up"
    import shutil
    import socket
    import subprocess

    import pytest

    if not shutil.which("nginx") and not Path("/usr/sbin/nginx").exists():
        pytest.skip("nginx is not installed")
    from tests.support.procs import free_port

    busy = socket.socket()
    busy.bind(("127.0.0.1", free_port()))
    busy.listen()
    port = busy.getsockname()[1]
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "SERVE_DIR": str(tmp_path), "SERVE_APP_PORT": str(port),
           "SERVE_PORT": str(free_port()), "SERVE_CHAT_PORT": str(free_port()), "SERVE_DEMO": "0",
           "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere", "REDIS_URL": "redis://127.0.0.1:1/0"}
    try:
        out = subprocess.run(["bash", str(DEPLOY / "serve.sh")], env=env, capture_output=True, text=True, timeout=60)
    finally:
        busy.close()
    assert out.returncode == 1
    assert f"port {port} (SERVE_APP_PORT) is already in use" in out.stderr, out.stderr


def test_run_local_names_each_demo_port_once_and_its_parts_read_the_exported_value():
    """deploy/run-local.sh set the demo servers' default ports and each run-local.d/ part set
    the same default again (10-demo-provider.sh even compared the port with a literal 8901):
    two places to change, and a part run on its own silently took its own default. Now
    run-local.sh names (and exports) every one; the parts only read it."""
    run = (DEPLOY / "run-local.sh").read_text()
    named = default_ports(DEPLOY / "run-local.sh")
    for part in sorted((DEPLOY / "run-local.d").glob("*.sh")):
        text = part.read_text()
        assert not DEFAULT.search(text) and not re.search(r":-\d", text), f"{part.name} names a default port"
        for var in set(re.findall(r"\b(DEMO_[A-Z_]*PORT)\b", text)):
            assert var in named and re.search(rf"export [^\n]*\b{var}=", run), f"{var} ({part.name}) is not exported by run-local.sh"
        assert not re.search(r"\b8\d{3}\b", text), f"{part.name} names a port number"
