"""The alerts and agents pages in Chromium (the 2026-11-29 review): an alert's Delete asks
first and does nothing when refused, the new-rule form keeps its fields level when one
of them shows a hint or an error, and at 390 px an agent's Disable button stays in its
row's content column. Signed in by a minted session cookie, as ``test_console_issue40.py``."""
from __future__ import annotations

from tests.e2e.test_console_issue40 import server, signed_in  # noqa: F401


def test_deleting_an_alert_asks_and_a_refused_question_keeps_it(app, server, make_account):  # noqa: F811
    base = server[0]
    acct = make_account()
    from app.extensions import db
    from app.models import Account
    from app.services.billing import alerts

    with app.app_context():
        email = db.session.get(Account, acct.id).email
        alerts.create_alert(acct.id, name="daily spend", metric="spend_cents", op=">", threshold=500, window="day",
                            channel="email", target=email)
        db.session.commit()
        db.session.remove()
    page = signed_in(app, server, acct.id)
    page.goto(base + "/alerts")
    asked = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.click("button[aria-label='Delete alert daily spend']")
    page.wait_for_timeout(300)
    assert asked and asked[0].startswith("Delete alert “daily spend”?")
    page.reload()
    assert page.locator("td[data-label=Condition]").all_inner_texts() == ["spend > $5.00 per day"]
    page.once("dialog", lambda d: d.accept())
    page.click("button[aria-label='Delete alert daily spend']")
    page.wait_for_selector("text=No alert rules.")

    # a refused threshold: its error and hint lengthen its own cell, the other fields stay level
    page.fill("#f-name", "x")
    page.fill("#f-threshold", "2.505")
    page.click("text=Create rule")
    page.wait_for_selector("#e-threshold")
    # measured once the page has settled after the answer (a measure taken mid-update saw the
    # two labels a row apart once in CI): level within 3 s, or the test fails with the tops
    level = ("() => { const t = [...document.querySelectorAll('form.grid label[for=f-name], "
             "form.grid label[for=f-threshold]')].map(l => Math.round(l.getBoundingClientRect().top));"
             " return t.length === 2 && t[0] === t[1]; }")
    try:
        page.wait_for_function(level, timeout=3000)
    except Exception:  # noqa: BLE001 - report what was measured
        pass
    tops = page.eval_on_selector_all("form.grid label[for=f-name], form.grid label[for=f-threshold]",
                                     "ls => ls.map(l => Math.round(l.getBoundingClientRect().top))")
    assert len(tops) == 2 and tops[0] == tops[1], tops
    page.context.close()


def test_an_agents_disable_button_stays_in_its_rows_content_column_at_390_px(app, server, make_account):  # noqa: F811
    base = server[0]
    acct = make_account()
    from app.extensions import db
    from app.services.agents import identity
    from tests.agentkit import Keypair

    with app.app_context():
        identity.register(acct.id, name="narrow", pubkey=Keypair().pubkey, webhook=None, mode="live",
                          registered_by=acct.id)
        db.session.commit()
        db.session.remove()
    page = signed_in(app, server, acct.id, width=390)
    page.goto(base + "/agents")
    fund = page.locator("#fund-1").bounding_box()
    disable = page.locator("button[aria-label='Disable agent narrow']").bounding_box()
    assert disable["x"] >= fund["x"] - 1, (fund, disable)  # under the Fund field, not under the label
    page.context.close()
