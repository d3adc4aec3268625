"""The chat peers: LiteLLM's proxy (own virtualenv ``bench/.venv-litellm``) and Portkey's
gateway (npm, under ``bench/.node``). Installed on first use from PyPI / npm, started on
loopback against the same fake upstream, stopped after their measurement."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench import setup

BENCH = Path(__file__).resolve().parent
LITELLM_VENV = BENCH / ".venv-litellm"
NODE_DIR = BENCH / ".node"
PORTKEY_START = NODE_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
PEER_MODEL = "bench-model"
LITELLM_MASTER_KEY = "sk-bench-master-key"
_running: dict[str, object] = {}


class PeerUnavailable(Exception):
    pass


def ensure_litellm() -> Path:
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True, timeout=300)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q",
                        "-r", str(BENCH / "requirements-litellm.txt"),
                        "-c", str(BENCH / "constraints-litellm.txt")], check=True, timeout=1200)
    return exe


def ensure_portkey() -> Path:
    if not PORTKEY_START.exists():
        if not shutil.which("npm"):
            raise PeerUnavailable("npm is not installed")
        NODE_DIR.mkdir(exist_ok=True)
        shutil.copy(BENCH / "package.json", NODE_DIR / "package.json")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_DIR)],
                       check=True, timeout=1200, cwd=NODE_DIR)
    return PORTKEY_START


def _peer_env(ctx) -> dict:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TZ")}
    env.update({"no_proxy": "*", "NO_PROXY": "*"})
    return env


def start_litellm(ctx) -> str:
    from bench.scenarios import Unavailable

    try:
        exe = ensure_litellm()
    except (subprocess.SubprocessError, OSError) as exc:
        raise Unavailable(f"LiteLLM could not be installed: {exc}")
    workers = setup.gunicorn_settings(ctx.env)["workers"]
    cfg = ctx.work / "litellm.yaml"
    cfg.write_text(f"""model_list:
  - model_name: {PEER_MODEL}
    litellm_params:
      model: openai/{PEER_MODEL}
      api_base: {ctx.upstream}/v1
      api_key: sk-bench-upstream
litellm_settings:
  telemetry: false
  set_verbose: false
  drop_params: true
general_settings:
  master_key: {LITELLM_MASTER_KEY}
""")
    # default logging: one access line per request, as the gateway's own production
    # access log (`gateway.access`) writes one
    env = _peer_env(ctx)
    env.update({
        # never reach outside loopback: local model-cost map, no telemetry, quiet logs
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "DISABLE_ADMIN_UI": "True",
    })
    port = ctx.ports["litellm"]
    cmd = [exe, "--config", cfg, "--host", "127.0.0.1", "--port", str(port), "--num_workers", str(workers)]
    return _start(ctx, "litellm", "LiteLLM", cmd, env, "/health/liveliness", 300,
                  {"workers": workers, "database": None, "auth": "master key"})


def start_portkey(ctx) -> str:
    from bench.scenarios import Unavailable

    if not shutil.which("node"):
        raise Unavailable("node is not installed")
    try:
        start = ensure_portkey()
    except (subprocess.SubprocessError, OSError, PeerUnavailable) as exc:
        raise Unavailable(f"Portkey gateway could not be installed: {exc}")
    env = _peer_env(ctx)
    env["NODE_ENV"] = "production"
    cmd = ["node", start, f"--port={ctx.ports['portkey']}", "--headless"]
    return _start(ctx, "portkey", "Portkey", cmd, env, "/", 60, {"workers": 1, "database": None, "auth": None})


def _start(ctx, name: str, title: str, cmd: list, env: dict, ready_path: str, timeout: float,
           facts: dict) -> str:
    """Start peer ``name`` on ``ctx.ports[name]``, wait until ``ready_path`` answers, record
    ``facts`` in the results; returns its base URL (Unavailable when it does not come up)."""
    from bench.scenarios import Unavailable

    url = f"http://127.0.0.1:{ctx.ports[name]}"
    proc = setup.RUNNING.start(cmd, name=name, env=env, cwd=ctx.work, log=ctx.work / f"{name}.log",
                               grace=setup.GRACE)
    try:
        proc.wait_http(url + ready_path, timeout=timeout)
    except RuntimeError as exc:
        setup.RUNNING.stop(proc)
        raise Unavailable(f"{title} did not start: {exc} (see bench/.work/run/{name}.log)")
    _running[name] = proc
    ctx.bench.results.setdefault("peers", {})[name] = facts
    return url


def pid(name: str) -> int | None:
    proc = _running.get(name)
    return proc.pid if proc is not None else None


def stop(ctx, name: str) -> None:
    proc = _running.pop(name, None)
    if proc is not None:
        setup.RUNNING.stop(proc)
