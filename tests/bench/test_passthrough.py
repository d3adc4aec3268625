"""The benchmark-only passthrough route exists only in bench.passthrough's app, never in the product."""
from __future__ import annotations

import pytest

from bench.passthrough import create_bench_app
from tests.conftest import base_config
from tests.support.standin import StandIn


def _upstream() -> StandIn:
    """Answers every POST with the body it got, wrapped."""
    return StandIn({("POST", "*"): lambda req: b'{"ok": true, "got": ' + req.body + b"}"})


def test_absent_in_a_normal_run(app, client):
    assert "/bench/passthrough" not in client.get("/openapi.json").get_json()["paths"]
    assert not any(r.rule.startswith("/bench") for r in app.url_map.iter_rules())
    assert client.post("/bench/passthrough", json={"a": 1}).status_code == 404


def test_forwards_the_body_and_is_documented():
    with _upstream() as url:
        bench_app = create_bench_app(url + "/x", base_config())
        client = bench_app.test_client()
        r = client.post("/bench/passthrough", data=b'{"action": "echo"}',
                        content_type="application/json")
        assert r.status_code == 200 and r.get_json() == {"ok": True, "got": {"action": "echo"}}
        op = client.get("/openapi.json").get_json()["paths"]["/bench/passthrough"]["post"]
        assert op["security"] == []


@pytest.mark.parametrize("url", [None, "http://10.0.0.1/x", "http://example.com/", "file:///etc/passwd"])
def test_refuses_anything_but_a_loopback_upstream(url):
    with pytest.raises(RuntimeError):
        create_bench_app(url, base_config())


def test_another_app_in_the_process_leaves_this_apps_document_alone(app, client):
    """flask-smorest keeps the app and the spec it serves on its ``Api``; one module-level
    ``Api`` shared by every app of a process served the last app's document from all of them:
    after a bench app was made, the product's /openapi.json listed /bench/passthrough."""
    before = client.get("/openapi.json").get_json()["paths"].keys()
    with _upstream() as url:
        bench_client = create_bench_app(url + "/x", base_config()).test_client()
        assert "/bench/passthrough" in bench_client.get("/openapi.json").get_json()["paths"]
    assert client.get("/openapi.json").get_json()["paths"].keys() == before
    assert "/bench/passthrough" not in before
