"""Agent endpoints (SPEC endpoints 6–13): nonce, sign-in, register, builds, usage,
earnings, leaderboard; funding and disabling by the owner."""

from app import auth
from app.auth import principal
from app.jsonutil import INTEGER_RANGE_DOC
from app.blueprints.agents.schemas import (AgentDisabledSchema, AgentDisableQuerySchema, AgentFundedSchema,
                                           AgentFundSchema, AgentRegisteredSchema, AgentSessionSchema,
                                           AgentUsageSchema, BuildListSchema, BuildSchema, BuildSubmitSchema,
                                           EarningsSchema, FundHeadersSchema, LeaderboardQuerySchema,
                                           LeaderboardSchema, NonceSchema, RegisterSchema, SignInSchema,
                                           SiwxChallengeSchema, SiwxHeadersSchema)
from app.blueprints.fields import Extended
from app.blueprints.routing import acting_account, endpoint, link
from app.extensions import Blueprint
from app.services.agents import identity as agents
from app.services.agents import builds
from app.services.agents import disable
from app.services.agents import earnings
from app.services.agents import funding
from app.services.agents import siwx
from app.services.orgs import orgs
from app.services.platform import netguard

blp = Blueprint("agents", __name__, url_prefix="/api/agent",
                description="Agents: ed25519 and Sign-In-With-X (EVM wallet) sign-in, registration, funding and "
                            "disabling by the owner, agent-built modules, usage, earnings (30% revenue share, "
                            "settled monthly) and the weekly leaderboard.")


@blp.after_request
def _no_store(response):
    """Every answer here is single-use or private (a nonce, a session, a webhook secret, an
    agent's money): no cache may keep or share it. Two agents behind one caching proxy
    would otherwise get one nonce, and one of them `nonce_used` (RFC 9111 heuristic
    freshness; RFC 6749 §5.1 asks the same of token responses)."""
    response.headers.setdefault("Cache-Control", "no-store")
    return response


@endpoint(blp, "/nonce", "get", public=True, ip_limit="AGENT_NONCE_RATE_LIMIT", ok=NonceSchema)
def nonce():
    """Get a single-use sign-in nonce (valid 5 minutes). Rate-limited to 30/minute per IP."""
    return agents.issue_nonce()


@endpoint(blp, "/signin", "post", public=True, ip_limit="AGENT_SIGNIN_RATE_LIMIT", body=SignInSchema,
          ok=AgentSessionSchema, errors={401: (
              "`malformed_signin` (bad prefix, base58 or length), `invalid_signature`, `unknown_agent`, "
              "`agent_disabled` (its owner disabled it: `DELETE /api/agent/{id}`), "
              "`unknown_nonce`, `nonce_used` (replay, or lost a concurrent race), `nonce_expired`.")})
def sign_in(body):
    """Exchange a signed nonce for a `svc_sess_` session (30/minute per IP).

    `signature` is the ed25519 signature of the exact UTF-8 bytes of `nonce`, as
    `base58:<signature>`. The nonce is consumed by the first valid sign-in only.
    """
    return agents.sign_in(pubkey=body["pubkey"], nonce=body["nonce"], signature=body["signature"])


@endpoint(blp, "/siwx", "get", public=True, ip_limit="AGENT_NONCE_RATE_LIMIT", ok=SiwxChallengeSchema,
          name="SiwxChallengeView")
def siwx_challenge():
    """Get a Sign-In-With-X challenge for an agent with an EVM wallet (30/minute per IP).

    The x402 `sign-in-with-x` extension's challenge: pick a chain from `supportedChains`
    (the one the agent's `eip155:<chainId>:<address>` was registered with), sign the
    EIP-4361 message of `info` with the wallet (x402 `create_siwx_payload`) and send it to
    `POST /api/agent/siwx`. The nonce is single use and valid 5 minutes. 503
    `service_unavailable` when the server was installed without SIWX support.
    """
    return siwx.challenge()


@endpoint(blp, "/siwx", "post", public=True, ip_limit="AGENT_SIGNIN_RATE_LIMIT", headers=SiwxHeadersSchema,
          ok=AgentSessionSchema, name="SiwxSignInView", errors={
              401: "`malformed_signin` (the header does not decode to a SIWX payload), `siwx_unsupported_chain`, "
                   "`siwx_wrong_domain` (domain or uri not this API's), `siwx_message_expired` (expirationTime "
                   "passed, issuedAt older than 5 minutes or in the future, notBefore ahead), "
                   "`invalid_signature` (not signed by `address`), `unknown_agent` (no agent registered with "
                   "`eip155:<chainId>:<address>`), `agent_disabled`, `unknown_nonce`, `nonce_used`, `nonce_expired`."})
def siwx_sign_in(sign_in_with_x):
    """Sign in with an EVM wallet (Sign-In-With-X, CAIP-122 / EIP-4361) for a `svc_sess_`
    session, the same as the ed25519 sign-in's (30/minute per IP).

    Send the wallet-signed challenge in the `SIGN-IN-WITH-X` header (no body). Only
    externally owned accounts (EIP-191 signatures, verified offline); the nonce is
    consumed by the first valid sign-in only; any refusal changes nothing.
    """
    return siwx.sign_in(sign_in_with_x)


_NEW_AGENT = "$response.body#/id"


@endpoint(blp, "/register", "post", "agent:write", body=RegisterSchema, ok=AgentRegisteredSchema, status=201,
          errors={403: "`org_role_required`: the member's role cannot register agents for the organisation.",
                  404: "`org_id`: not an organisation of the caller.",
                  409: "The pubkey belongs to another account's agent, or to a disabled agent.",
                  422: "`unprocessable`: the `pubkey` has the documented shape but is not a key: base58 that "
                       "is not the canonical spelling of 32 bytes, a point that is not an ed25519 public key, "
                       "an EIP-55 checksum mismatch, or a chain id outside the deployment's "
                       "`AGENT_SIWX_CHAINS`; or the `webhook`: " + netguard.REFUSED_DOC},
          links={"AgentUsage": link("/api/agent/{agent_id}/usage", "get", "The agent's usage.", agent_id=_NEW_AGENT),
                 "AgentEarnings": link("/api/agent/{agent_id}/earnings", "get", "Its earnings.", agent_id=_NEW_AGENT),
                 "DisableAgent": link("/api/agent/{agent_id}", "delete", "Disable it.", agent_id=_NEW_AGENT)})
def register(body):
    """Register an agent (and its own account, without promotional credit) owned by the
    calling account. Idempotent on `pubkey`: the same account gets the same agent back
    (201, `name`/`webhook` updated to the values sent; `webhook_secret` is shown when the
    agent is created only, null on a repeat). Sessions cannot register agents (403).
    With `org_id` (or with an organisation key) the organisation owns the agent: it funds
    it and the agent earns for it (docs/teams.md)."""
    p = principal()
    owner = acting_account(body.get("org_id"), "agent:write")
    agent, created = agents.register(owner, name=body["name"], pubkey=body["pubkey"],
                                     webhook=body["webhook"], caller_is_agent=p.kind == "session", mode=p.mode,
                                     registered_by=orgs.person_of(p))
    return Extended(agent, webhook_secret=agent.webhook_secret if created else None)


@endpoint(blp, "/build", "post", "agent:write", body=BuildSubmitSchema, ok=BuildSchema, status=202,
          errors={409: "Slug taken, or already pending review; or no `webhook` sent and the agent has none, "
                       "or has one longer than a module's upstream URL holds (`conflict`).",
                  422: "The `webhook` (or the agent's): " + netguard.REFUSED_DOC + " Or " + INTEGER_RANGE_DOC})
def build(body):
    """Submit an agent-built module for review (caller: the agent's session). Approved
    modules are listed and callable; calls are forwarded to `webhook`, signed per
    Standard Webhooks with the returned `webhook_secret`."""
    p = principal()
    return builds.submit(
        p.agent_id, slug=body["slug"], price_cents=body["price_cents"], actions=body["actions"],
        webhook=body["webhook"], description=body["description"])


@endpoint(blp, "/builds", "get", "agent:read", ok=BuildListSchema)
def list_builds():
    """The caller's submissions, newest first, with status and review notes (an agent
    session: its own; a key of an owner account: those of all its agents; max 500)."""
    p = principal()
    return {"builds": builds.list_builds(agent_id=p.agent_id, account_id=p.account_id, mode=p.mode)}


@endpoint(blp, "/<string:agent_id>/usage", "get", "agent:read", ok=AgentUsageSchema, errors={404: None})
def agent_usage(agent_id):
    """The agent's own calls and spend in the current billing period (calendar month,
    UTC), total, by module and by chat model (`by_model`), in the agent's mode (a
    test-mode agent's sessions make test calls: those are counted). Visible to the agent
    and its owner account only."""
    p = principal()
    return earnings.usage_for(agent_id, account_id=p.account_id, caller_agent_id=p.agent_id, mode=p.mode)


@endpoint(blp, "/<string:agent_id>/earnings", "get", "agent:read", ok=EarningsSchema, errors={404: None})
def agent_earnings(agent_id):
    """Lifetime earnings of the modules the agent owns (30% of their revenue): accrued
    (not yet settled) and settled, with recent monthly statements. Visible to the agent
    and its owner account only."""
    p = principal()
    return earnings.earnings_for(agent_id, account_id=p.account_id, caller_agent_id=p.agent_id, mode=p.mode)


@endpoint(blp, "/leaderboard", "get", "agent:read", query=LeaderboardQuerySchema, ok=LeaderboardSchema)
def leaderboard(query):
    """Top agents by earnings accrued in the current ISO week (Monday 00:00 UTC on), net
    of the week's refunds (also those taken from a carry-over after a settlement); ties in
    agent id order; `limit` entries (default 10, max 100)."""
    return earnings.leaderboard(query["limit"])


@endpoint(blp, "/<string:agent_id>/fund", "post", "billing:write", body=AgentFundSchema, ok=AgentFundedSchema,
          errors={402: "`insufficient_funds`: the owner's balance cannot cover it; `key_spend_limit_reached` / "
                       "`member_budget_exceeded`: the amount does not fit the key's spend limit or the member's "
                       "monthly budget (it counts as spending by the key); nothing moved.",
                  403: "`org_role_required`: the member's role cannot fund from the organisation.",
                  404: "`not_found`: no agent of this account (or `org_id` not an organisation of the caller).",
                  409: "`idempotency_key_reused`: the key funded another agent or amount; "
                       "`agent_not_fundable`: the agent was disabled (`DELETE /api/agent/{id}`)."},
          name="AgentFundView", headers=FundHeadersSchema, idempotent=True)
def fund_agent(body, agent_id, idempotency_key=None):
    """Move `amount_cents` from the owner's balance to its agent's (one ledger transfer;
    exactly once per `Idempotency-Key`). Only a credential of the owner account may fund;
    another account's agent is 404. An organisation's agent is funded from the
    organisation's balance by an organisation key, or with `org_id`, of an owner or
    billing member (403 `org_role_required` for the other roles)."""
    p = principal()
    owner = acting_account(body.get("org_id"), "billing:write")
    return funding.fund(owner, agent_id, body["amount_cents"], idempotency_key=idempotency_key,
                        mode=p.mode, spend_key=auth.key_of(p))


@endpoint(blp, "/<id:agent_id>", "delete", "agent:write", query=AgentDisableQuerySchema, ok=AgentDisabledSchema,
          errors={403: "`org_role_required`: the member's role cannot change the organisation's agents.",
                  404: "`not_found`: no agent of this account in this mode (a developer of an organisation: "
                       "none they registered), or `org_id` not an organisation of the caller."},
          name="AgentView")
def disable_agent(query, agent_id):
    """Disable an agent: its sessions are revoked at once (on every worker), it can no
    longer sign in (401 `agent_disabled`) and its pubkey cannot be registered again (409);
    its whole balance moves back to the owner right after (`agent_return`, before the
    answer: `returned_micros`), and what reaches it later (a refund of a call that was in
    flight) follows within minutes.
    Its usage, earnings and modules stay. Idempotent: a repeat answers `replayed: true`
    and changes nothing. Only a credential of the owner account (or `org_id`) may disable;
    removing an organisation member disables the agents they registered for it."""
    p = principal()
    owner = acting_account(query.get("org_id"), "agent:write")
    return disable.disable(owner, agent_id, mode=p.mode, registered_by=orgs.own_items_only(p, owner))
