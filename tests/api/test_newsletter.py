"""Newsletter: double opt-in over real SMTP, single-use expiring tokens, no enumeration,
RFC 8058 one-click unsubscribe on every list e-mail."""
from __future__ import annotations

from sqlalchemy import and_, select

from app.extensions import db
from app.models import SingleUseToken, Subscription
from app.services.platform import tokens
from app.services.public import newsletter
from tests.publichelpers import link_in, mailed_tokens, path_of, smtp, strip_volatile, token_in
from tests.support.rows import expire


def _subs(app):
    with app.app_context():
        live = and_(SingleUseToken.subject == Subscription.id, SingleUseToken.used_at.is_(None),
                    SingleUseToken.purpose == tokens.NEWSLETTER_CONFIRM)
        rows = db.session.execute(select(Subscription.email, Subscription.list, Subscription.status,
                                         SingleUseToken.token_hash).outerjoin(SingleUseToken, live)).all()
        db.session.remove()
    return rows


def _one_click_path(msg) -> str:
    header = msg["List-Unsubscribe"]
    assert header.startswith("<http") and header.endswith(">")
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    return path_of(header[1:-1])


def test_double_opt_in_flow(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "BASE_URL", "https://gw.example")
    with smtp(app) as sink:
        r = client.post("/api/email/subscribe", json={"email": "Reader@Example.com", "list": "weekly"})
        assert r.status_code == 202 and r.get_json()["status"] == "pending"
        assert len(sink.messages) == 1
        mail = sink.messages[0]
        assert mail["To"] == "reader@example.com"
        link = link_in(mail)
        assert link.startswith("https://gw.example/email/confirm?token=")
        _one_click_path(mail)  # list headers on the confirmation e-mail too
        token = token_in(mail)
        # the token is stored hashed only
        assert all(token not in str(row) for row in _subs(app))
        # opening the link (or a scanner prefetching it) confirms nothing
        page = client.get(path_of(link))
        assert page.status_code == 200 and page.mimetype == "text/html"
        assert b'method="post"' in page.data and b"Confirm subscription" in page.data
        assert page.headers["Cache-Control"] == "no-store" and page.headers["Referrer-Policy"] == "no-referrer"
        assert _subs(app)[0][2] == "pending"
        done = client.post("/email/confirm", data={"token": token})
        assert done.status_code == 200 and b"You are subscribed" in done.data
        assert _subs(app)[0][2:] == ("subscribed", None)
        # welcome mail is a list e-mail with one-click headers
        assert len(sink.messages) == 2
        welcome = sink.messages[1]
        one_click = _one_click_path(welcome)
        # the token works once
        again = client.post("/email/confirm", data={"token": token})
        # pressed twice (double click, reload): still 404, but the page says the address is
        # subscribed, not "invalid ... subscribe again"
        assert again.status_code == 404 and b"already used" in again.data and b"Subscribe again" not in again.data
        assert len(sink.messages) == 2  # no second welcome
        assert client.get(path_of(link)).status_code == 404
        # RFC 8058 one-click POST, exactly as mailbox providers send it
        oc = client.post(one_click, data="List-Unsubscribe=One-Click",
                         content_type="application/x-www-form-urlencoded")
        assert oc.status_code == 200 and b"Unsubscribed" in oc.data
        assert _subs(app)[0][2] == "unsubscribed"
        assert len(sink.messages) == 2  # nothing sent on unsubscribe
        assert b"Subscribe again" in client.post("/email/confirm", data={"token": token}).data  # no longer


def test_the_mailed_link_opened_again_after_confirming_says_subscribed(app, client):
    """Opening the confirmation link again (the e-mail kept, clicked the next day) shows
    that the address is subscribed, as a second press of the button does; before, it said
    "invalid ... subscribe again", and subscribing again sends nothing to a subscribed
    address: the reader waited for a mail that never came."""
    with smtp(app) as sink:
        client.post("/api/email/subscribe", json={"email": "again@example.com", "list": "launch"})
        link, token = link_in(sink.messages[0]), token_in(sink.messages[0])
        assert client.post("/email/confirm", data={"token": token}).status_code == 200
        opened = client.get(path_of(link))
        assert opened.status_code == 404 and opened.mimetype == "text/html"
        assert b"already used" in opened.data and b"again@example.com will receive launch" in opened.data
        assert b"Subscribe again" not in opened.data and b'method="post"' not in opened.data
        assert len(sink.messages) == 2  # the welcome mail only: opening the link sends nothing
        client.post("/api/email/unsubscribe", json={"email": "again@example.com"})
        assert b"Subscribe again" in client.get(path_of(link)).data  # unsubscribed since: just invalid


def test_one_click_get_shows_button_and_bad_token_refused(app, client):
    path = path_of(newsletter_unsub_url(app, "x@example.com"))
    with app.app_context():
        db.session.add(Subscription(id="sub_t", email="x@example.com", mailbox="x@example.com",
                                    list="launch", status="subscribed"))
        db.session.commit()
        db.session.remove()
    page = client.get(path)
    assert page.status_code == 200 and b"Unsubscribe" in page.data and b'method="post"' in page.data
    assert _subs(app)[0][2] == "subscribed"  # GET changes nothing
    forged = path[:-3] + ("AAA" if not path.endswith("AAA") else "BBB")
    assert client.post(forged).status_code == 404
    assert client.post("/email/unsubscribe/" + "x" * 700).status_code == 404
    assert _subs(app)[0][2] == "subscribed"
    assert client.post(path).status_code == 200 and _subs(app)[0][2] == "unsubscribed"


def newsletter_unsub_url(app, email):
    with app.test_request_context():
        return newsletter.unsubscribe_url(email)


def test_expired_token_refused(app, client):
    token, = mailed_tokens(app, client, "/api/email/subscribe", "late@example.com")
    expire(app, SingleUseToken)
    assert client.get("/email/confirm?token=" + token).status_code == 404
    assert client.post("/email/confirm", data={"token": token}).status_code == 404
    assert _subs(app)[0][1:3] == ("product", "pending")


def test_resubscribe_replaces_token(app, client):
    first, second = mailed_tokens(app, client, "/api/email/subscribe", "twice@example.com", times=2)
    assert client.post("/email/confirm", data={"token": first}).status_code == 404
    assert client.post("/email/confirm", data={"token": second}).status_code == 200


def test_no_enumeration_subscribe_and_unsubscribe(app, client):
    with smtp(app) as sink:
        new = client.post("/api/email/subscribe", json={"email": "a@example.com"})
        pending = client.post("/api/email/subscribe", json={"email": "a@example.com"})
        client.post("/email/confirm", data={"token": token_in(sink.messages[1])})
        subscribed = client.post("/api/email/subscribe", json={"email": "a@example.com"})
        sent = len(sink.messages)
    assert strip_volatile(new) == strip_volatile(pending) == strip_volatile(subscribed)
    assert new.status_code == 202
    assert sent == 3  # two confirmations + welcome; nothing for an already subscribed address
    was = client.post("/api/email/unsubscribe", json={"email": "a@example.com"})
    never = client.post("/api/email/unsubscribe", json={"email": "nobody@example.com"})
    assert was.status_code == 200 and strip_volatile(was) == strip_volatile(never)
    assert {row[2] for row in _subs(app)} == {"unsubscribed"}


def test_unsubscribe_removes_from_all_lists(app, client):
    for lst in ("launch", "product", "weekly"):
        client.post("/api/email/subscribe", json={"email": "all@example.com", "list": lst})
    assert len(_subs(app)) == 3
    client.post("/api/email/unsubscribe", json={"email": "ALL@example.com"})
    assert {row[2] for row in _subs(app)} == {"unsubscribed"}
    assert {row[3] for row in _subs(app)} == {None}  # pending tokens are dead too


def test_subscribe_validation(client):
    for body in ({"email": "x@example.com", "list": "daily"}, {"email": "nope"}, {},
                 {"email": "x@example.com", "extra": 1}):
        r = client.post("/api/email/subscribe", json=body)
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", body
    assert client.post("/api/email/subscribe", data="email=x@example.com",
                       content_type="application/x-www-form-urlencoded").status_code == 400


def test_subscribe_rate_limited_per_email(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "SUBSCRIBE_EMAIL_RATE_LIMIT", "2/hour")
    codes = [client.post("/api/email/subscribe", json={"email": "bomb@example.com"},
                         environ_base={"REMOTE_ADDR": f"10.1.0.{i}"}).status_code for i in range(3)]
    assert codes == [202, 202, 429]


def test_send_to_list_carries_one_click_headers(app, client):
    with app.app_context():
        for i, status in enumerate(("subscribed", "pending", "unsubscribed")):
            db.session.add(Subscription(id=f"sub_{i}", email=f"r{i}@example.com", mailbox=f"r{i}@example.com",
                                        list="launch", status=status))
        db.session.commit()
        with smtp(app) as sink:
            assert newsletter.send_to_list("launch", "We launched", "Hello!") == 1
        db.session.remove()
    assert len(sink.messages) == 1 and sink.messages[0]["To"] == "r0@example.com"
    oc = client.post(_one_click_path(sink.messages[0]), data={"List-Unsubscribe": "One-Click"})
    assert oc.status_code == 200
    assert ("r0@example.com", "launch", "unsubscribed", None) in _subs(app)


def test_pages_answer_html_even_without_token(client):
    for r in (client.post("/email/confirm"), client.get("/email/confirm"),
              client.post("/signup/confirm"), client.get("/signup/confirm?token=" + "x" * 500)):
        assert r.status_code == 404 and r.mimetype == "text/html", r.data[:200]


def test_a_link_path_the_router_refuses_is_still_an_html_page(client):
    """The pages opened from e-mail links document their 404 as text/html. A token past the
    route's length (or with a control character) is refused by the router before the page
    runs; that 404 is the HTML page too, whatever the client accepts (schemathesis found
    the JSON error there, an undocumented content type)."""
    for path in ("/email/unsubscribe/" + "0" * 700, "/email/unsubscribe/a%01b", "/invites/" + "x" * 300):
        r = client.get(path, headers={"Accept": "application/json"})
        assert r.status_code == 404 and r.mimetype == "text/html", (path, r.mimetype)
    r = client.get("/api/keys/" + "x" * 300, headers={"Accept": "application/json"})
    assert r.status_code == 404 and r.mimetype == "application/json"


def test_list_unsubscribe_header_is_a_plain_url_not_encoded_words(app, client, monkeypatch):
    # RFC 2369: the header holds <URL>; a long URL (no white space to fold at) must not be
    # rewritten as RFC 2047 encoded words, which mail clients do not decode in it
    monkeypatch.setitem(app.config, "BASE_URL", "https://newsletter.gateway.example")
    with smtp(app) as sink:
        assert client.post("/api/email/subscribe", json={"email": "long.reader@example.com"}).status_code == 202
    raw = dict(sink.messages[0].raw_items())["List-Unsubscribe"]
    assert "=?" not in raw and raw.startswith("<https://newsletter.gateway.example/email/unsubscribe/"), raw
    with app.app_context():
        assert raw.endswith(">") and newsletter.unsubscribe_url("long.reader@example.com") == raw[1:-1]



def _confirm_first(sink, client, index: int = -1) -> None:
    assert client.post("/email/confirm", data={"token": token_in(sink.messages[index])}).status_code == 200


def test_unsubscribe_by_another_spelling_of_the_mailbox_stops_list_mail(app, client):
    """One inbox, several spellings (Gmail ignores dots, ``+tags`` reach the same box):
    unsubscribing any of them takes the mailbox off every list, not just that spelling."""
    with smtp(app) as sink:
        for lst in ("launch", "weekly"):
            client.post("/api/email/subscribe", json={"email": "J.Doe@gmail.com", "list": lst})
            _confirm_first(sink, client, -1)
        client.post("/api/email/subscribe", json={"email": "j.doe@gmail.com", "list": "product"})  # pending
        r = client.post("/api/email/unsubscribe", json={"email": "jdoe+news@googlemail.com"})
        assert r.status_code == 200
        assert {row[2] for row in _subs(app)} == {"unsubscribed"}
        assert {row[3] for row in _subs(app)} == {None}  # the pending link is dead too
        mailed = len(sink.messages)
        with app.app_context():
            assert newsletter.send_to_list("launch", "Launch", "Hi") == 0
            assert newsletter.send_to_list("weekly", "Weekly", "Hi") == 0
            db.session.remove()
        assert len(sink.messages) == mailed


def test_one_click_link_of_one_spelling_unsubscribes_the_mailbox(app, client):
    with app.app_context():
        db.session.add_all([Subscription(id="sub_a", email="farm@example.com", mailbox="farm@example.com",
                                         list="launch", status="subscribed"),
                            Subscription(id="sub_b", email="other@example.com", mailbox="other@example.com",
                                         list="launch", status="subscribed")])
        db.session.commit()
        db.session.remove()
    assert client.post(path_of(newsletter_unsub_url(app, "farm+promo@example.com"))).status_code == 200
    assert sorted((row[0], row[2]) for row in _subs(app)) == [("farm@example.com", "unsubscribed"),
                                                             ("other@example.com", "subscribed")]


def test_two_spellings_of_one_mailbox_make_one_subscription(app, client):
    with smtp(app) as sink:
        first = client.post("/api/email/subscribe", json={"email": "j.doe@gmail.com", "list": "weekly"})
        _confirm_first(sink, client)
        again = client.post("/api/email/subscribe", json={"email": "jdoe+x@gmail.com", "list": "weekly"})
        assert strip_volatile(first) == strip_volatile(again)
        assert len(sink.messages) == 2  # confirmation + welcome; nothing for the subscribed mailbox
        assert _subs(app) == [("j.doe@gmail.com", "weekly", "subscribed", None)]
        with app.app_context():
            assert newsletter.send_to_list("weekly", "Weekly", "Hi") == 1
            db.session.remove()
        assert [m["To"] for m in sink.messages[2:]] == ["j.doe@gmail.com"]  # one copy, confirmed address


def test_pending_mailbox_confirms_the_spelling_it_was_last_sent_to(app, client):
    """A pending mailbox subscribed again under another spelling: the new link goes to the
    address just given, the earlier link dies, and confirming makes that address the one
    list mail is delivered to."""
    with smtp(app) as sink:
        client.post("/api/email/subscribe", json={"email": "reader@example.com", "list": "launch"})
        client.post("/api/email/subscribe", json={"email": "Reader+news@example.com", "list": "launch"})
        assert [m["To"] for m in sink.messages] == ["reader@example.com", "reader+news@example.com"]
        first, second = (token_in(m) for m in sink.messages)
        assert client.post("/email/confirm", data={"token": first}).status_code == 404
        assert client.post("/email/confirm", data={"token": second}).status_code == 200
        assert sink.messages[-1]["To"] == "reader+news@example.com"  # welcome
    assert _subs(app) == [("reader+news@example.com", "launch", "subscribed", None)]
