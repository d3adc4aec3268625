"""Receipts: a real call's receipt verifies offline with only the published key (the README
snippet), fails when any field changes, survives key rotation; `flask receipts verify`."""
from __future__ import annotations

import base64
import copy
import hashlib
import json

import pytest
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from app.services.gateway import receipts
from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401


def readme_verify(resp: dict, published: list[dict]) -> None:
    """The README's offline verification snippet, verbatim in spirit: raises if invalid."""
    r = resp["receipt"]
    canon = lambda x: json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()  # noqa: E731
    facts = {"v": r["v"], "kid": r["kid"], "call_id": resp["call_id"], "account_id": r["account_id"],
             "module": resp["module"], "action": r["action"], "cost_cents": resp["cost_cents"],
             "result_sha256": hashlib.sha256(canon(resp["result"])).hexdigest(),
             "ok": resp["ok"], "mode": r["mode"], "ts": r["ts"]}
    if r["v"] >= 2:
        facts.update(actor=r["actor"], actor_account_id=r["actor_account_id"])
    keys = {k["kid"]: k["public_key"] for k in published}
    assert hashlib.sha256(canon(facts)).hexdigest() == r["hash"], "hash mismatch"
    VerifyKey(base64.b64decode(keys[r["kid"]])).verify(canon(facts), base64.b64decode(r["sig"]))


MUTATIONS = [
    ("call_id", lambda d: d.__setitem__("call_id", "call_forged")),
    ("module", lambda d: d.__setitem__("module", "other")),
    ("cost_cents", lambda d: d.__setitem__("cost_cents", d["cost_cents"] - 1)),
    ("ok", lambda d: d.__setitem__("ok", not d["ok"])),
    ("result", lambda d: d["result"].__setitem__("extra", 1)),
    ("result-nested", lambda d: d["result"]["echo"].__setitem__("text", "changed")),
    ("account_id", lambda d: d["receipt"].__setitem__("account_id", "acct_other")),
    ("actor", lambda d: d["receipt"].__setitem__("actor", "key_other")),
    ("actor_account_id", lambda d: d["receipt"].__setitem__("actor_account_id", "acct_other")),
    ("version", lambda d: d["receipt"].__setitem__("v", 1)),
    ("action", lambda d: d["receipt"].__setitem__("action", "bad")),
    ("mode", lambda d: d["receipt"].__setitem__("mode", "test")),
    ("ts", lambda d: d["receipt"].__setitem__("ts", "2020-01-01T00:00:00Z")),
    ("hash", lambda d: d["receipt"].__setitem__("hash", "0" * 64)),
    ("sig", lambda d: d["receipt"].__setitem__("sig", base64.b64encode(b"\0" * 64).decode())),
    ("sig-short", lambda d: d["receipt"].__setitem__("sig", base64.b64encode(b"\1" * 32).decode())),
    ("sig-not-base64", lambda d: d["receipt"].__setitem__("sig", "***")),
]


def test_receipt_verifies_offline_and_any_change_breaks_it(client, make_account, mod):
    acct = make_account()
    resp = call(client, acct, {"action": "ok", "text": "héllo", "n": 1.5}).get_json()
    published = client.get("/api/receipts/keys").get_json()["keys"]
    assert published and all(k["alg"] == "ed25519" for k in published)
    saved = json.loads(json.dumps(resp))  # as a client would store it
    readme_verify(saved, published)
    by_kid = {k["kid"]: k["public_key"] for k in published}
    assert receipts.verify_response(saved, by_kid)["call_id"] == resp["call_id"]
    for name, mutate in MUTATIONS:
        forged = copy.deepcopy(saved)
        mutate(forged)
        with pytest.raises((AssertionError, BadSignatureError, ValueError)):
            readme_verify(forged, published)
        with pytest.raises(receipts.ReceiptInvalid):
            receipts.verify_response(forged, by_kid)


def test_malformed_saved_responses_are_invalid_not_errors(client, make_account, mod):
    # what a verifier is handed may be anything: each is "not valid", never an exception
    # other than ReceiptInvalid (the console's verify page answered 500, the CLI a traceback)
    acct = make_account()
    saved = json.loads(json.dumps(call(client, acct, {"action": "ok"}).get_json()))
    by_kid = {k["kid"]: k["public_key"] for k in client.get("/api/receipts/keys").get_json()["keys"]}
    without_hash = {k: v for k, v in saved["receipt"].items() if k != "hash"}
    for doc in ({**saved, "receipt": "x"}, {**saved, "receipt": [1]}, {**saved, "receipt": None},
                {**saved, "receipt": without_hash}, {**saved, "result": {"t": "\ud800"}}):
        with pytest.raises(receipts.ReceiptInvalid):
            receipts.verify_response(doc, by_kid)


def test_lookalike_ok_and_cost_values_do_not_verify(client, make_account, mod):
    """A saved response reading ``"ok": "false"`` or ``"cost_cents": 2.9`` is not the one
    signed (true, an integer): the console's verify page and the CLI said valid, coercing
    them with bool() and int() before hashing."""
    acct = make_account()
    saved = json.loads(json.dumps(call(client, acct, {"action": "ok"}).get_json()))
    by_kid = {k["kid"]: k["public_key"] for k in client.get("/api/receipts/keys").get_json()["keys"]}
    assert saved["ok"] is True and receipts.verify_response(saved, by_kid)
    for change in ({"ok": "false"}, {"ok": 1}, {"cost_cents": saved["cost_cents"] + 0.9},
                   {"cost_cents": str(saved["cost_cents"])}):
        with pytest.raises(receipts.ReceiptInvalid):
            receipts.verify_response({**saved, **change}, by_kid)


def test_rotation_keeps_old_receipts_verifiable(app, client, make_account, mod):
    acct = make_account()
    old = call(client, acct, {"action": "ok"}).get_json()
    with app.app_context():
        new_kid = receipts.rotate_key()
    new = call(client, acct, {"action": "ok"}).get_json()
    assert new["receipt"]["kid"] == new_kid != old["receipt"]["kid"]
    keys = client.get("/api/receipts/keys").get_json()["keys"]
    assert [k["kid"] for k in keys if k["active"]] == [new_kid]
    readme_verify(old, keys)
    readme_verify(new, keys)
    with open(f"{app.config['INSTANCE_PATH']}/{receipts.KEYRING_FILE}") as fh:
        ring = json.load(fh)
    assert [kid for kid, e in ring["keys"].items() if "seed" in e] == [new_kid]


def test_env_signing_key_and_retired_keys(app):
    from nacl.signing import SigningKey

    active, retired = SigningKey.generate(), SigningKey.generate()
    with app.app_context():
        app.config["RECEIPT_SIGNING_KEY"] = base64.b64encode(bytes(active)).decode()
        app.config["RECEIPT_RETIRED_PUBLIC_KEYS"] = base64.b64encode(bytes(retired.verify_key)).decode()
        try:
            rec = receipts.sign(call_id="call_x", account_id="acct_x", module="m", action="a",
                                cost_cents=1, result={}, ok=True, mode="live")
            keys = receipts.public_keys()
            with pytest.raises(RuntimeError):
                receipts.rotate_key()
        finally:
            app.config["RECEIPT_SIGNING_KEY"] = None
            app.config["RECEIPT_RETIRED_PUBLIC_KEYS"] = ""
            receipts.reset_cache()
    assert rec["kid"] == receipts.kid_for(bytes(active.verify_key))
    assert {k["kid"]: k["active"] for k in keys} == {
        rec["kid"]: True, receipts.kid_for(bytes(retired.verify_key)): False}
    resp = {"call_id": "call_x", "module": "m", "cost_cents": 1, "ok": True, "result": {}, "receipt": rec}
    readme_verify(resp, keys)


def test_cli_verify(app, client, make_account, mod, tmp_path):
    acct = make_account()
    resp = call(client, acct, {"action": "ok"}).get_json()
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(resp))
    resp["cost_cents"] = 0
    bad.write_text(json.dumps(resp))
    runner = app.test_cli_runner()
    r = runner.invoke(args=["receipts", "verify", str(good)])
    assert r.exit_code == 0 and json.loads(r.output)["valid"] is True
    r = runner.invoke(args=["receipts", "verify", str(bad)])
    assert r.exit_code == 1 and json.loads(r.output)["valid"] is False
    r = runner.invoke(args=["receipts", "keys"])
    assert r.exit_code == 0 and json.loads(r.output)["keys"]


def test_canonical_facts_writes_the_bytes_of_canonical_for_every_character():
    """The signed facts are serialised with orjson (``canonical_facts``) but verifiers use
    ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``: the bytes must
    be the same for every character an action or id can hold, every key order and the
    integer and boolean fields; what orjson refuses is decided by ``canonical`` as before."""
    base = {"v": 1, "kid": "k_0123456789abcdef", "call_id": "call_x", "account_id": "acct_y",
            "module": "m", "action": "a", "cost_cents": 2**62, "result_sha256": "0" * 64,
            "ok": False, "mode": "live", "ts": "2026-11-24T12:00:00.000000Z"}
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for i in range(0, len(chars), 512):  # 512 characters per action: ~2,200 facts in all
        f = dict(base, action="".join(chars[i:i + 512]), ok=bool(i % 2))
        assert receipts.canonical_facts(f) == receipts.canonical(f)
    odd_keys = {chr(c) + "k": c for c in (0x7F, 0xE9, 0x2028, 0xFFFF, 0x1F600, 0x10FFFF, 0x20, 0x5C)}
    assert receipts.canonical_facts(odd_keys) == receipts.canonical(odd_keys)
    for refused in ({"action": "\ud800"}, {"cost_cents": 2**64}):
        f = dict(base, **refused)
        try:
            expected = receipts.canonical(f)
        except Exception as exc:  # noqa: BLE001 - whatever canonical raises, canonical_facts must too
            with pytest.raises(type(exc)):
                receipts.canonical_facts(f)
        else:
            assert receipts.canonical_facts(f) == expected


# A version-1 receipt as the gateway signed it before receipts named the actor (made by the
# version-1 code with a fixed test seed, b"\x07" * 32): it must keep verifying.
V1_RESPONSE = {"call_id": "call_v1receipt", "module": "svc", "cost_cents": 3, "ok": True,
               "result": {"echo": {"text": "héllo"}},
               "receipt": {"hash": "bf0df0c0c07443856c3cee4308a511f663a0ea33eb9a8146211f3005b8849a69",
                           "sig": "/PL0hfKC24OO7SCWl5hZWp6faWT9qDo/AeSL6kSUw4z3xswzYyoYvmCVLi1cMrZRUpigZTrXTq+Us"
                                  "CuUuKPgCg==",
                           "v": 1, "kid": "k_fe812c12f3ab4ce6", "alg": "ed25519",
                           "ts": "2026-11-20T10:00:00.000000Z", "account_id": "acct_v1payer", "action": "ok",
                           "mode": "live"}}
V1_KEYS = [{"kid": "k_fe812c12f3ab4ce6", "public_key": "6kpsY+KcUgq+9VB7Ey7F+ZVHdq6+vnuSQh7qaRRG0iw="}]


def test_version_1_receipts_still_verify_everywhere():
    from gateway_client import receipts as client_receipts
    from gateway_client.errors import ReceiptInvalid

    by_kid = {k["kid"]: k["public_key"] for k in V1_KEYS}
    saved = copy.deepcopy(V1_RESPONSE)
    assert receipts.verify_response(saved, by_kid)["v"] == 1
    assert client_receipts.verify(saved, by_kid) is True
    readme_verify(saved, V1_KEYS)
    for forge in ({"v": 2}, {"actor": "key_x", "actor_account_id": "acct_x", "v": 2}, {"v": 3}, {"v": True}):
        forged = copy.deepcopy(saved)
        forged["receipt"].update(forge)
        with pytest.raises(receipts.ReceiptInvalid):
            receipts.verify_response(forged, by_kid)
        with pytest.raises(ReceiptInvalid):
            client_receipts.verify(forged, by_kid)


def test_receipts_name_the_payer_and_the_actor(app, client, make_account, mod):  # noqa: F811
    from gateway_client import receipts as client_receipts
    from tests.orgkit import fund, join, make_org, org_key

    owner, dev = make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    fund(app, org["id"], 100)
    key = org_key(client, dev, org["id"])
    published = client.get("/api/receipts/keys").get_json()["keys"]
    by_kid = {k["kid"]: k["public_key"] for k in published}
    org_call = call(client, None, {"action": "ok"}, bearer=key["key"]).get_json()
    mine = call(client, dev, {"action": "ok"}).get_json()
    r = org_call["receipt"]
    assert (r["v"], r["account_id"], r["actor"], r["actor_account_id"]) == (2, org["id"], key["id"], dev.id)
    personal_key = client.get("/api/account", headers=dev.headers).get_json()["actor"]["credential_id"]
    assert (mine["receipt"]["account_id"], mine["receipt"]["actor"], mine["receipt"]["actor_account_id"]) == \
        (dev.id, personal_key, dev.id)
    for resp in (org_call, mine):
        saved = json.loads(json.dumps(resp))
        assert receipts.verify_response(saved, by_kid)["actor"] == resp["receipt"]["actor"]
        assert client_receipts.verify(saved, by_kid) is True
        readme_verify(saved, published)
