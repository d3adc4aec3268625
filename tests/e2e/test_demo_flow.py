"""The offline demo: the demo provider + the shipped catalog, called like a newcomer would
(`make run` path): real gunicorn, curl-like HTTP, receipt, usage, balance drop."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

import requests

from demo import provider as demo
from tests.conftest import base_config
from tests.support.apps import ROOT, app_env, gunicorn


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def test_demo_provider_requires_the_secret():
    status, _ = demo.handle("/text/word_count", {"text": "a b"})
    assert status == 200
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": "/echo", "CONTENT_LENGTH": "0",
           "wsgi.input": None}
    out = {}
    body = demo.app(env, lambda s, h: out.setdefault("status", s))
    assert out["status"].startswith("401") and b"X-Provider-Key" in b"".join(body)


def test_newcomer_flow(app, make_account):
    server = make_server("127.0.0.1", 0, demo.app, server_class=demo._ThreadingServer,
                         handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = base_config()
        env = app_env(cfg)
        env["DEMO_PROVIDER_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
        subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "catalog", "load"],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        acct = make_account()
        with gunicorn(env, workers=2) as url:
            h = {"Authorization": f"Bearer {acct.key}"}
            before = requests.get(url + "/api/account", headers=h).json()["balance_cents"]
            mods = requests.get(url + "/api/modules").json()["modules"]
            price = {m["slug"]: {a["name"]: a["price_cents"] for a in m["actions"]} for m in mods}
            r = requests.post(url + "/v1/module/text/call", headers=h,
                              json={"action": "word_count", "text": "one two three"})
            assert r.status_code == 200, r.text
            data = r.json()
            assert data["result"]["words"] == 3 and data["cost_cents"] == price["text"]["word_count"]
            r2 = requests.post(url + "/v1/module/weather/call", headers=h,
                               json={"action": "current", "city": "Lisbon"})
            assert r2.status_code == 200 and r2.json()["result"]["city"] == "Lisbon"
            after = requests.get(url + "/api/account", headers=h).json()["balance_cents"]
            assert before - after == price["text"]["word_count"] + price["weather"]["current"]
            u = requests.get(url + "/api/usage/current", headers=h).json()
            assert u["calls"] == 2 and u["spend_cents"] == before - after
            keys = requests.get(url + "/api/receipts/keys").json()["keys"]
            from app.services.gateway.receipts import verify_response

            verify_response(data, {k["kid"]: k["public_key"] for k in keys})
    finally:
        server.shutdown()
        server.server_close()
    assert os.path.isdir(ROOT / "catalog" / "modules")
