"""LiteLLM (the client library) against the chat host under gunicorn: typed exceptions
with the API's message for 401 / 429 (402: APIError with status 402 and the message;
LiteLLM has no payment exception), and the cost it keeps (``usage.cost``, the
``x-gateway-*`` headers). LiteLLM runs in its own interpreter (tests/e2e/litellm_client.py
says why): ``LITELLM_PYTHON`` or bench/.venv-litellm (``.ci/run`` makes it); skipped when
neither exists, except in CI, where a missing interpreter fails the test."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import ChatCompletion

from demo.llm import DemoLLMHandler
from tests.support.apps import app_env, gunicorn
from tests.support.standin import serve

ROOT = Path(__file__).resolve().parents[2]
PYTHON = os.environ.get("LITELLM_PYTHON") or str(ROOT / "bench" / ".venv-litellm" / "bin" / "python")


@pytest.mark.skipif(not Path(PYTHON).exists() and not os.environ.get("CI"),
                    reason="no LiteLLM interpreter (LITELLM_PYTHON or bench/.venv-litellm)")
def test_litellm_client_errors_and_cost(app, make_account, ledger_clean):
    assert Path(PYTHON).exists(), f"CI must provide LiteLLM at {PYTHON} (.ci/run installs it)"
    acct, poor = make_account(cents=100), make_account(cents=0)
    with serve(DemoLLMHandler) as demo:
        env = app_env(app.config)
        env.update({"DEMO_LLM_BASE_URL": demo + "/v1", "CHAT_HOST": "127.0.0.1"})
        env.pop("CHAT_CATALOG", None)
        with gunicorn(env) as base:
            run = subprocess.run([PYTHON, str(ROOT / "tests/e2e/litellm_client.py"), base, acct.key, poor.key],
                                 capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["plain"]["text"] == "Echo: hi" and out["plain"]["cost"] > 0
    assert out["plain"]["cost_micros"] >= 1 and out["plain"]["savings_pct"] > 0
    headers = {k.lower(): v for k, v in out["plain"]["headers"].items()}
    assert headers["llm_provider-x-gateway-cost-micros"] == str(out["plain"]["cost_micros"])
    assert "llm_provider-x-gateway-overhead-ms" in headers
    assert out["stream"]["text"] == "Echo: stream these words"
    assert out["stream"]["cost"] > 0  # LiteLLM keeps usage.cost from a stream's final usage
    with app.app_context():  # what LiteLLM counted for a stream is what the gateway recorded and charged
        for name, model in (("anthropic_stream", "demo-standard"), ("openai_stream", "demo-large")):
            row = db.session.execute(select(ChatCompletion).where(
                ChatCompletion.account_id == acct.id, ChatCompletion.model == model)).scalar_one()
            assert row.stream and row.status == "settled" and row.cost_micros > 0
            assert (out[name]["prompt_tokens"], out[name]["completion_tokens"]) == (
                row.prompt_tokens, row.completion_tokens), name
            assert out[name]["finish_reason"] == "stop"
        db.session.remove()
    assert out["401"]["class"] == "AuthenticationError" and "revoked credential" in out["401"]["text"]
    assert out["429"]["class"] == "RateLimitError" and "Rate limit of" in out["429"]["text"]
    assert out["402"]["status"] == 402 and "POST /api/wallet/fund" in out["402"]["text"]
    assert out["404"]["class"] == "NotFoundError"
    ledger_clean()
