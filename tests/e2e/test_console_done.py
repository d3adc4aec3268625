"""Issue 40's "Done when", tried as a new user would, in Chromium against gunicorn: sign up
and land signed in on the dashboard; make a chat completion (the demo LLM) and a module call
over HTTP with the key shown once; see both on the activity page with their exact costs
(and filter them); switch to test mode, make a test call, and see only test figures; every
page at 390 px without sideways scroll; axe-core finds no serious or critical violation."""
from __future__ import annotations

import pytest
import requests

from demo.llm import DemoLLMHandler
from tests.e2e.test_console_issue40 import NARROW_CHECK, browser_on_gunicorn, sign_up
from tests.gateway_helpers import create_module, provider_server  # noqa: F401
from tests.support import axe
from tests.support.standin import serve


@pytest.fixture(scope="module")
def chat_server(app):
    """gunicorn with the demo LLM as its chat provider, and one headless Chromium."""
    with serve(DemoLLMHandler) as llm, \
            browser_on_gunicorn(app, DEMO_LLM_BASE_URL=llm + "/v1", CHAT_HOST="127.0.0.1", CHAT_CATALOG=None) as running:
        yield running


def _rows(page) -> list[tuple[str, str]]:
    """(module or model, cost) of each row of the activity table."""
    return [(r.locator("td[data-label=Model], td[data-label=Module]").inner_text().split()[-1],
             r.locator("td.cost").inner_text()) for r in page.locator("table.calls-table tbody tr").all()]


def test_a_new_user_sees_chat_and_module_calls_with_exact_costs(app, chat_server, provider_server):  # noqa: F811
    from app.services.money.ledger import usd_precise

    create_module(app, "svc", provider_server, {"ok": (3, "/ok")}, sandbox_url=provider_server + "/sandbox")
    base = chat_server[0]
    page, key = sign_up(app, chat_server)  # landed signed in on the dashboard
    assert page.inner_text("#balance") == "$10.00" and page.locator("text=Sign out").count() == 1
    assert axe.violations(page) == []
    bearer = {"Authorization": f"Bearer {key}"}

    chat = requests.post(base + "/v1/chat/completions", headers=bearer, timeout=30, json={
        "model": "demo-mini", "messages": [{"role": "user", "content": "hello gateway"}]})
    assert chat.status_code == 200, chat.text
    chat_micros = chat.json()["usage"]["cost_micros"]
    call = requests.post(base + "/v1/module/svc/call", headers=bearer, json={"action": "ok"}, timeout=30)
    assert call.status_code == 200, call.text
    call_micros = call.json()["cost_cents"] * 10_000

    page.click("nav >> text=Activity")
    page.wait_for_url(base + "/activity")
    assert sorted(_rows(page)) == sorted([("demo-mini", usd_precise(chat_micros)),
                                          ("svc/ok", usd_precise(call_micros))])
    assert page.inner_text("#listed-cost") == usd_precise(chat_micros + call_micros)
    module_row = page.locator("table.calls-table tr.module")
    module_row.locator("td[data-label=Receipt] a").click()  # the receipt link: the call and its receipt
    page.wait_for_url(f"{base}/usage/calls/{call.json()['call_id']}")
    assert call.json()["receipt"]["hash"] in page.content()
    page.go_back()
    chat_row = page.locator("table.calls-table tr.chat")
    assert chat_row.locator("td[data-label=Tokens]").inner_text() == str(
        chat.json()["usage"]["prompt_tokens"] + chat.json()["usage"]["completion_tokens"])
    assert chat_row.locator("td[data-label=Key]").inner_text() != "—"  # the key that made it
    page.select_option("#f-product", "model:demo-mini")  # filter: one model
    page.click("button:has-text('Show')")
    page.wait_for_url("**/activity?*")
    assert _rows(page) == [("demo-mini", usd_precise(chat_micros))]
    with page.expect_download() as dl:
        page.click("#export")
    lines = open(dl.value.path()).read().splitlines()
    assert len(lines) == 2 and lines[1].split(",")[3] == "demo-mini"  # header + the one completion
    assert f",{chat_micros}," in lines[1]

    page.goto(base + "/dashboard")  # test mode: a test key, a sandbox call, only test figures
    page.click("button.mode")
    page.wait_for_url(base + "/dashboard")
    assert page.inner_text("#month-calls").startswith("0 calls") and "No calls yet" in page.content()
    page.goto(base + "/keys")
    page.fill("#f-name", "test key")
    page.click("text=Create key")
    test_key = page.inner_text("#secret").strip()
    assert test_key.startswith("svc_test_")
    r = requests.post(base + "/v1/module/svc/call", headers={"Authorization": f"Bearer {test_key}"},
                      json={"action": "ok"}, timeout=30)
    assert r.status_code == 200, r.text
    page.goto(base + "/activity")
    assert [p for p, _ in _rows(page)] == ["svc/ok"]  # the test call only
    page.goto(base + "/dashboard")
    assert page.inner_text("#month-calls").startswith("1 call") and "demo-mini" not in page.content()
    page.click("button.mode")  # back to live: both live calls, not the test one
    page.wait_for_url(base + "/dashboard")
    assert page.locator("table.calls-table tbody tr").count() == 2

    page.set_viewport_size({"width": 390, "height": 800})
    nav = page.eval_on_selector_all("header nav a", "as => as.map(a => a.getAttribute('href'))")
    for path in nav:
        page.goto(base + path)
        assert page.evaluate(NARROW_CHECK) == [], path
        assert axe.violations(page) == [], path
    page.context.close()
