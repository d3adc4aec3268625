"""The README's examples, copy-pasted and run against the live server as written: only the
placeholders a reader fills in (the key, the base URL, the owner's client) are given."""
from __future__ import annotations

import re
from pathlib import Path

from gateway_client import Gateway

README = Path(__file__).resolve().parents[1] / "README.md"


def example(section: str) -> str:
    """The first ```python block under the README heading ``section``."""
    text = README.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def run(section: str, server, key: str, **names) -> dict:
    code = example(section).replace('"svc_live_…"', repr(key)).replace("http://127.0.0.1:8000", server.url)
    scope = dict(names)
    exec(compile(code, f"README.md ({section})", "exec"), scope)  # noqa: S102 - our own README
    return scope


def test_quick_start_runs_as_written(server, make_account, capsys):
    acct = make_account(cents=500)
    run("Quick start", server, acct.key)
    balance, call = capsys.readouterr().out.splitlines()
    assert balance == "500" and call.endswith(" 2 True")  # weather/current costs 2 cents, verified


def test_agents_example_runs_as_written(server, make_account):
    """The agent signs in and calls; its call is paid from its own balance, which the
    owner funds (before: the example registered and called at once: PaymentRequired)."""
    owner_acct = make_account(cents=500)
    with Gateway(owner_acct.key, server.url) as owner:
        scope = run("Agents", server, owner_acct.key, owner=owner)
        agent = scope["agent"]
        assert agent.agent_id and agent.api_key.startswith("svc_sess_")
        assert owner.account().balance_cents < 500  # the owner paid the agent's funding
        agent.close()


def test_billing_example_runs_as_written(app, server, make_account, capsys):
    """The Billing section: invoices paged through (a paid checkout's among them), billing
    details set, a card saved and charged, auto top-up set and turned off, a payout
    destination set and removed."""
    from test_client_billing import paid_checkout

    acct = make_account(cents=500)
    with Gateway(acct.key, server.url) as gw:
        paid_checkout(app, gw, 500)
        run("Billing", server, acct.key)
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith("INV-") and out[0].endswith(" payment 5.00 []")
        assert out[1:] == ["[('visa', '4242', True)]", "True 4242"]
        assert gw.payouts.list().destination is None and [m.last4 for m in gw.payment_methods.list()] == ["4242"]
        assert gw.account().balance_cents == 2000 and gw.invoices.billing_details().name == "ACME SAS"


def test_organisations_example_runs_as_written(server, make_account, capsys):
    """The Organisations section: an organisation created, an invitation sent, listed and
    revoked, the members and the audit log read."""
    acct = make_account()
    scope = run("Organisations", server, acct.key)
    out = capsys.readouterr().out.splitlines()
    assert out == ["[('dev@example.com', 'developer')]", "owner True",
                   "['invite.revoke', 'invite.create', 'org.create']"]
    assert scope["gw"].orgs.invites(scope["org"].id) == []
    scope["gw"].close()


def test_byok_example_runs_as_written(server, make_account, capsys):
    """The Bring your own key section: a key added (the demo provider accepts it), the
    settings changed, the key listed and deleted."""
    acct = make_account()
    scope = run("Bring your own key", server, acct.key)
    out = capsys.readouterr().out.splitlines()
    assert out == ["demo_llm sk-own-k", "ByokSettings(byok_only=False, byok_fallback=True)", "[True] False"]
    assert scope["gw"].provider_keys.list().provider_keys == []
    scope["gw"].close()


def test_evm_wallet_example_runs_as_written(server, make_account):
    """The Sign in with an EVM wallet section: registered by its CAIP-10 account, funded,
    signed in with the wallet and calling from its own balance."""
    owner_acct = make_account(cents=500)
    with Gateway(owner_acct.key, server.url) as owner:
        scope = run("Sign in with an EVM wallet", server, owner_acct.key, owner=owner)
        agent = scope["agent"]
        assert agent.agent_id == scope["bot"].id and agent.api_key.startswith("svc_sess_")
        assert owner.agents.usage(scope["bot"].id).calls == 1
        agent.close()
