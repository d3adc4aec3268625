"""Every console page, read by everyone (issue 40 item 6): axe-core finds no serious or
critical violation, at 1280 and at 390 px, no page scrolls sideways at 390 px, and Tab
reaches every visible control (at 1280 px). The
pages are the navigation's (so a page added to it is checked too) and the ones reached
from them: sign-in, a sign-in link, a call, "Page not found", signed out.

Playwright driving Debian's Chromium against gunicorn (``test_console_issue40.server``);
axe-core from ``tests/support/axe.py`` (missing: the test fails)."""
from __future__ import annotations

import pytest

from tests.e2e.test_console_issue40 import NARROW_CHECK, _chat, server, signed_in  # noqa: F401
from tests.support import axe


def _seed(app, account_id: str) -> str:
    """A module call (with a receipt page), a chat completion and an agent: pages with rows."""
    from app.extensions import db
    from app.ids import new_id
    from app.models import ModuleCall
    from app.models.base import utcnow
    from app.services.agents import identity
    from tests.agentkit import Keypair

    with app.app_context():
        call_id = new_id("call")
        db.session.add(ModuleCall(id=call_id, account_id=account_id, module_id=1, module_slug="echo", action="run",
                                  mode="live", status="succeeded", price_micros=10_000, charged=True, ok=True,
                                  created_at=utcnow(), deadline_at=utcnow(), finished_at=utcnow()))
        _chat(account_id, 90, model="tiny-model", cost=123, tokens=(40, 17))
        identity.register(account_id, name="a11y agent", pubkey=Keypair().pubkey, webhook=None)
        db.session.commit()
        db.session.remove()
    return call_id


# The visible controls a keyboard user must reach, and the ones Tab reached (ids given on the way).
FOCUSABLE = """() => [...document.querySelectorAll('a[href], button, input:not([type=hidden]), select, textarea, [tabindex]')]
  .filter(e => e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden' && !e.disabled
               && (e.matches('a, button, input, select, textarea') || e.tabIndex >= 0) && !e.classList.contains('skip'))
  .map((e, i) => e.dataset.kb || (e.dataset.kb = 'kb' + i))"""


def _tab_through(page) -> set[str]:
    """Press Tab until the focus leaves the page or comes back: the controls it reached."""
    page.evaluate(FOCUSABLE)  # tags each control (data-kb)
    seen, order = set(), []
    for _ in range(400):
        page.keyboard.press("Tab")
        kb = page.evaluate("() => document.activeElement && document.activeElement.dataset ? "
                           "document.activeElement.dataset.kb || null : null")
        if kb is None and order:
            break
        if kb in seen and kb == order[0]:
            break
        if kb:
            seen.add(kb)
            order.append(kb)
    return seen


@pytest.mark.parametrize("width", [1280, 390])
def test_every_page_passes_axe_and_fits(app, server, make_account, width):
    base = server[0]
    acct = make_account()
    call_id = _seed(app, acct.id)
    page = signed_in(app, server, acct.id, width=width)
    page.goto(base + "/dashboard")
    nav = page.eval_on_selector_all("header nav a", "as => as.map(a => a.getAttribute('href'))")
    assert "/activity" in nav and "/models" in nav, nav
    paths = list(dict.fromkeys(["/", *nav, f"/usage/calls/{call_id}", "/no-such-page"]))
    problems = {}
    for path in paths:
        page.goto(base + path)
        found = axe.violations(page) + (page.evaluate(NARROW_CHECK) if width == 390 else [])
        if width == 1280:  # every visible control is reached with Tab
            missed = set(page.evaluate(FOCUSABLE)) - _tab_through(page)
            found += [f"not reached by Tab: {page.eval_on_selector(f'[data-kb={kb}]', 'e => e.outerHTML')[:120]}"
                      for kb in sorted(missed)]
        if found:
            problems[path] = found
    page.goto(base + "/dashboard")
    page.click("text=Sign out")
    page.wait_for_selector("text=You are signed out")
    for path in ("/signed-out", "/login", "/login/confirm?token=nope"):
        if path != "/signed-out":
            page.goto(base + path)
        found = axe.violations(page) + (page.evaluate(NARROW_CHECK) if width == 390 else [])
        if found:
            problems[path] = found
    page.context.close()
    assert problems == {}, "\n".join(f"{p}: {v}" for p, vs in problems.items() for v in vs)
