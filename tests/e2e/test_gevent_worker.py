"""The production worker, gunicorn's ``gevent`` (``deploy/gunicorn.conf.py``), over real
processes: one worker serves many calls at once while each waits on its provider, and the
MCP door's event loop (a greenlet of the worker's one OS thread) does not break SIWX
sign-in in the same worker."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx2
import requests
from eth_account import Account
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header

from tests.gateway_helpers import PROVIDER, balance_cents, create_module, provider, provider_server  # noqa: F401
from tests.support.apps import app_env, gunicorn
from tests.support.procs import free_port

IN_FLIGHT = 20  # more than gthread's 8 threads and the 8 connections of the database pool


def test_one_worker_holds_twenty_calls_in_flight_at_once(app, make_account, provider, ledger_clean):
    """Twenty calls wait on their provider at the same time in ONE worker process (the
    stand-in sees all twenty before any is answered); then all are answered and charged.
    Under gthread a worker held at most its 8 threads' calls."""
    create_module(app, "slowpoke", provider, {"wait": (1, "/block", 30.0)})
    acct = make_account(cents=100, plan="pro")
    with gunicorn(app_env(app.config), workers=1) as url:
        def one(_):
            return requests.post(f"{url}/v1/module/slowpoke/call", json={"action": "wait"},
                                 headers=acct.headers, timeout=60)

        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            answers = [pool.submit(one, i) for i in range(IN_FLIGHT)]
            deadline = time.monotonic() + 30  # a bound for a loaded machine, not a timing check
            while len(PROVIDER.requests) < IN_FLIGHT and time.monotonic() < deadline:
                time.sleep(0.05)
            seen = len(PROVIDER.requests)
            PROVIDER.release.set()
            codes = [a.result().status_code for a in answers]
    assert seen == IN_FLIGHT
    assert codes == [200] * IN_FLIGHT
    assert balance_cents(app, acct.id) == 100 - IN_FLIGHT
    ledger_clean()


async def _mcp_tools(url: str, key: str) -> list[str]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    async with Client(streamable_http_client(url + "/mcp", http_client=http), cache=None) as c:
        return [t.name for t in (await c.list_tools()).tools]


def test_siwx_sign_in_after_the_worker_served_mcp(app, make_account, provider):
    """asyncio allows one running loop per OS thread; the MCP door's loop runs in a greenlet
    of the worker's thread, so SIWX's ``asyncio.run`` answered 500 in every sign-in after
    the worker's first MCP request. It drives the extension's coroutines without a loop."""
    create_module(app, "mcpmod", provider, {"ok": (1, "/ok")})
    acct = make_account(cents=100, plan="pro")
    port = free_port()
    env = app_env(app.config)
    env["BASE_URL"] = f"http://127.0.0.1:{port}"  # the SIWE domain and uri
    wallet = Account.create()
    with gunicorn(env, workers=1, port=port) as url:
        assert requests.post(f"{url}/api/agent/register", headers=acct.headers, timeout=30, json={
            "name": "siwx-bot", "pubkey": f"eip155:8453:{wallet.address}"}).status_code == 201
        for _ in range(2):
            assert "mcpmod__ok" in anyio.run(_mcp_tools, url, acct.key)
            challenge = requests.get(f"{url}/api/agent/siwx", timeout=30).json()
            payload = asyncio.run(create_siwx_payload(
                {**challenge["info"], "chainId": "eip155:8453", "type": "eip191"}, wallet, f"{url}/api/agent/siwx"))
            r = requests.post(f"{url}/api/agent/siwx", timeout=30,
                              headers={"SIGN-IN-WITH-X": encode_siwx_header(payload)})
            assert r.status_code == 200, r.text
            assert r.json()["session"].startswith("svc_sess_")
