"""Schemas of the agent endpoints (SPEC part 2: Agent, Nonce, Session, agent module
submission; and the shapes SPEC leaves open: builds, agent usage, earnings, leaderboard)."""
import marshmallow as ma

from app.blueprints.orgs.schemas import org_id_field
from app.blueprints.usage.schemas import UsageByModuleSchema
from app.blueprints.fields import (HTTPS_PATTERN, HeaderString, InputSchema, JsonInteger, Pattern, QueryInteger,
                                  idempotency_key_header)
from app.scopes import SESSION_SCOPES
from app.services.agents.builds import MAX_WEBHOOK_CHARS

B58 = "[1-9A-HJ-NP-Za-km-z]"
# the base58 of 32 bytes: 32 characters (all zero bytes, each a "1") to 44
ED25519_PUBKEY_PATTERN = rf"ed25519:{B58}{{32,44}}"
# CAIP-10 account of an EVM wallet (chain id up to 13 digits, so it fits 64 characters)
EVM_PUBKEY_PATTERN = r"eip155:[1-9][0-9]{0,12}:0x[0-9a-fA-F]{40}"
PUBKEY_PATTERN = rf"^(?:{ED25519_PUBKEY_PATTERN}|{EVM_PUBKEY_PATTERN})$"
BASE64_PATTERN = r"^[A-Za-z0-9+/]+={0,2}$"
# Explicit character classes (no \s or .), so Python and ECMA regexes agree exactly.
_WS = r"\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NAME_PATTERN = rf"^[^{_WS}]([^\x00-\x1f\x7f-\x9f\u2028\u2029]*[^{_WS}])?$"
SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
ACTION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"  # builds.ACTION_RE


def _unique(values):
    if len(set(values)) != len(values):
        raise ma.ValidationError("Must not contain duplicates.")


class NonceSchema(ma.Schema):
    nonce = ma.fields.String(required=True, metadata={
        "description": "`n_` + 32 base62 characters (≈190 random bits). Sign its exact UTF-8 bytes."})
    expires_at = ma.fields.DateTime(required=True, metadata={
        "description": "5 minutes after issue (AGENT_NONCE_TTL_SECONDS). Single use."})


class SignInSchema(InputSchema):
    pubkey = ma.fields.String(required=True, validate=ma.validate.Length(max=200),
                              metadata={"description": "`ed25519:<base58 of the 32-byte public key>`"})
    nonce = ma.fields.String(required=True, validate=ma.validate.Length(max=200),
                             metadata={"description": "A nonce from `GET /api/agent/nonce`."})
    signature = ma.fields.String(required=True, validate=ma.validate.Length(max=200), metadata={
        "description": "`base58:<64-byte ed25519 signature of the nonce's UTF-8 bytes>`"})


class SiwxInfoSchema(ma.Schema):
    domain = ma.fields.String(required=True, metadata={"description": "This API's host (from BASE_URL)."})
    uri = ma.fields.String(required=True, metadata={"description": "`<API origin>/api/agent/siwx`."})
    version = ma.fields.String(required=True, metadata={"description": "`1` (EIP-4361)."})
    statement = ma.fields.String(required=True)
    nonce = ma.fields.String(required=True, metadata={
        "description": "32 letters and digits: a single-use sign-in nonce (the `GET /api/agent/nonce` kind "
                       "without its `n_` prefix, as EIP-4361 nonces are alphanumeric), valid 5 minutes."})
    issuedAt = ma.fields.String(required=True, metadata={"description": "RFC 3339, UTC."})
    expirationTime = ma.fields.String(required=True, metadata={
        "description": "RFC 3339, UTC: when the nonce expires (5 minutes after issuedAt)."})


class SiwxChainSchema(ma.Schema):
    chainId = ma.fields.String(required=True, metadata={"description": "CAIP-2, e.g. `eip155:8453`."})
    type = ma.fields.String(required=True, metadata={"description": "`eip191` (EVM personal_sign)."})


class SiwxChallengeSchema(ma.Schema):
    """The x402 `sign-in-with-x` extension's challenge (as its server side declares it in a 402)."""

    info = ma.fields.Nested(SiwxInfoSchema, required=True)
    supportedChains = ma.fields.List(ma.fields.Nested(SiwxChainSchema), required=True, metadata={
        "description": "The chains an agent's `eip155:<chainId>:<address>` identity may name; sign with the "
                       "chain the agent was registered with."})
    schema = ma.fields.Dict(required=True, metadata={
        "description": "JSON Schema of the payload sent in `SIGN-IN-WITH-X` (the extension's)."})


class SiwxHeadersSchema(InputSchema):
    """Headers of ``POST /api/agent/siwx``."""

    class Meta:
        unknown = ma.EXCLUDE

    sign_in_with_x = HeaderString(
        data_key="SIGN-IN-WITH-X", required=True,
        validate=[ma.validate.Length(min=1, max=8000), Pattern(BASE64_PATTERN)],
        metadata={"description": "Base64 of the SIWX payload JSON (x402 `encode_siwx_header`): `domain`, "
                                 "`address`, `uri`, `version`, `chainId`, `type` (`eip191`), `nonce`, "
                                 "`issuedAt`, `expirationTime`, `statement`, `signature` (0x hex, EIP-191 "
                                 "signature of the EIP-4361 message built from these fields)."})


class AgentSessionSchema(ma.Schema):
    agent_id = ma.fields.String(required=True)
    session = ma.fields.String(required=True, metadata={
        "description": "`svc_sess_…` bearer token; acts as the agent's account with scopes "
                       + ", ".join(f"`{s}`" for s in SESSION_SCOPES)
                       + " (it calls, reads its account, usage and wallet and tops itself up; it "
                         "cannot manage keys or alerts, nor register agents)."})
    expires_in = ma.fields.Integer(required=True, metadata={"description": "Seconds (3600 by default)."})


class RegisterSchema(InputSchema):
    name = ma.fields.String(required=True, validate=[ma.validate.Length(min=1, max=100),
                                                     Pattern(NAME_PATTERN)],
                            metadata={"description": "No control characters; no leading or trailing white space."})
    pubkey = ma.fields.String(required=True, validate=Pattern(
        PUBKEY_PATTERN, error="must be ed25519:<base58 public key> or eip155:<chainId>:<0x address>."), metadata={
        "description": "The agent's identity, one of: `ed25519:<base58 of the 32-byte public key>` (must be "
                       "a valid ed25519 point), signs in with `POST /api/agent/signin`; or an EVM wallet as "
                       "CAIP-10 `eip155:<chainId>:<0x address>` (chainId one of the supported chains, "
                       "default 1, 8453, 84532; a mixed-case address must be a valid EIP-55 checksum; "
                       "stored and returned checksummed), signs in with Sign-In-With-X "
                       "(`POST /api/agent/siwx`). Another shape is 400; what the pattern cannot state (the "
                       "canonical base58 of exactly 32 bytes, a valid point, the checksum, a supported "
                       "chain) is 422 `unprocessable`."})
    webhook = ma.fields.String(load_default=None, allow_none=True,
                               validate=[ma.validate.Length(max=2000), Pattern(HTTPS_PATTERN)],
                               metadata={"description": "https URL receiving the agent's signed events "
                                                        "(settlement.completed, module.approved, "
                                                        "module.rejected). Optional."})
    org_id = org_id_field("the organisation owns the agent: it funds it (`POST /api/agent/{id}/fund` with an "
                          "organisation key of an owner or billing member) and the agent's earnings are the "
                          "organisation's; roles owner, admin, developer (`agent:write`)")

class AgentSchema(ma.Schema):
    id = ma.fields.String(required=True)
    name = ma.fields.String(required=True)
    pubkey = ma.fields.String(required=True)
    webhook = ma.fields.String(required=True, allow_none=True, metadata={
        "format": "uri", "description": "https URL receiving the agent's signed events; null: none."})
    account_id = ma.fields.String(required=True, metadata={"description": "The agent's own account."})


class AgentRegisteredSchema(AgentSchema):
    webhook_secret = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "Standard Webhooks signing secret (`whsec_…`) of the events sent to `webhook`. "
                       "Shown once: in the response that created the agent; null on an idempotent "
                       "repeat (the secret is never returned again)."})


class BuildSubmitSchema(InputSchema):
    slug = ma.fields.String(required=True, validate=Pattern(SLUG_PATTERN),
                            metadata={"description": "Unique across modules (409 when taken or pending)."})
    price_cents = JsonInteger(required=True, validate=ma.validate.Range(min=0, max=1_000_000),
                              metadata={"description": "Price of each call of every action, in cents."})
    actions = ma.fields.List(ma.fields.String(validate=Pattern(ACTION_PATTERN)),
                             required=True, validate=[ma.validate.Length(min=1, max=50), _unique],
                             metadata={"description": "Distinct action names.", "uniqueItems": True})
    webhook = ma.fields.String(load_default=None, allow_none=True,
                               validate=[ma.validate.Length(max=MAX_WEBHOOK_CHARS), Pattern(HTTPS_PATTERN)],
                               metadata={"description": "https URL the approved module's calls are "
                                                        "forwarded to; defaults to the agent's webhook "
                                                        f"(409 when that one is over {MAX_WEBHOOK_CHARS} "
                                                        "characters, what a module's upstream URL holds)."})
    description = ma.fields.String(load_default=None, allow_none=True,
                                   validate=ma.validate.Length(max=1000), metadata={"multiline": True})


class BuildSchema(ma.Schema):
    id = ma.fields.String(required=True)
    agent_id = ma.fields.String(required=True)
    slug = ma.fields.String(required=True)
    status = ma.fields.String(required=True, validate=ma.validate.OneOf(
        ["pending_review", "approved", "rejected"]))
    price_cents = ma.fields.Integer(required=True)
    actions = ma.fields.List(ma.fields.String(), required=True)
    webhook = ma.fields.String(required=True)
    description = ma.fields.String(required=True)
    review_notes = ma.fields.String(required=True, allow_none=True,
                                    metadata={"description": "Reviewer's notes / rejection reason."})
    created_at = ma.fields.DateTime(required=True)
    reviewed_at = ma.fields.DateTime(required=True, allow_none=True)
    webhook_secret = ma.fields.String(required=True, metadata={
        "description": "Standard Webhooks secret (`whsec_…`) with which the gateway signs the calls "
                       "it forwards to `webhook` once approved. Verify `webhook-signature` with it. "
                       "Shown once, in this response to the submission (not in the list)."})


class BuildListedSchema(BuildSchema):
    """A build in the list: without its `webhook_secret` (shown once, at submission)."""

    class Meta:
        exclude = ("webhook_secret",)


class BuildListSchema(ma.Schema):
    builds = ma.fields.List(ma.fields.Nested(BuildListedSchema), required=True)


class AgentUsageSchema(UsageByModuleSchema):
    """The agent's usage: totals, and ``by_module`` / ``by_model`` as ``GET /api/usage/by-module``."""

    agent_id = ma.fields.String(required=True)
    period_start = ma.fields.DateTime(required=True)
    period_end = ma.fields.DateTime(required=True)
    calls = ma.fields.Integer(required=True, metadata={
        "description": "Module calls and chat completions made by the agent in its mode (live; test "
                       "for a test-mode agent), failed ones included."})
    errors = ma.fields.Integer(required=True)
    spend_cents = ma.fields.Integer(required=True, metadata={"description": "Module calls and chat completions."})


class StatementSchema(ma.Schema):
    id = ma.fields.String(required=True)
    month = ma.fields.String(required=True, metadata={"description": "YYYY-MM"})
    amount_cents = ma.fields.Integer(required=True, metadata={
        "description": "What the settlement moved to the balance (or `payable`): `earned` less "
                       "`carry_over_repaid`. The statements add up to `settled`."})
    amount_micros = ma.fields.Integer(required=True)
    earned_cents = ma.fields.Integer(required=True, metadata={
        "description": "What the settlement took out of the accrued earnings (the month's shares, net "
                       "of their refunds, not yet settled)."})
    earned_micros = ma.fields.Integer(required=True)
    carry_over_repaid_cents = ma.fields.Integer(required=True, metadata={
        "description": "The part of `earned` that repaid a carry-over (a refund of a call whose month "
                       "was already settled), so did not reach the balance; 0 otherwise."})
    carry_over_repaid_micros = ma.fields.Integer(required=True)
    settled_at = ma.fields.DateTime(required=True, attribute="created_at")


class EarningsSchema(ma.Schema):
    agent_id = ma.fields.String(required=True)
    share_pct = ma.fields.Integer(required=True, metadata={"description": "Owner share of module revenue (30)."})
    accrued_cents = ma.fields.Integer(required=True, metadata={
        "description": "Earned, not yet settled, net of any carry-over: negative after a refund of a call "
                       "whose month was already settled, until the next earnings repay it."})
    settled_cents = ma.fields.Integer(required=True, metadata={
        "description": "Moved to the agent account's balance by settlements (not what repaid a carry-over)."})
    lifetime_cents = ma.fields.Integer(required=True, metadata={
        "description": "The shares of its modules' calls, net of refunds: the floor of `lifetime_micros`. "
                       "Every `_cents` field is the floor of its `_micros` twin, so this can be one more "
                       "than accrued_cents + settled_cents; the sum is exact in micros."})
    accrued_micros = ma.fields.Integer(required=True)
    settled_micros = ma.fields.Integer(required=True)
    lifetime_micros = ma.fields.Integer(required=True, metadata={
        "description": "accrued_micros + settled_micros (1 cent = 10,000 micros)."})
    settlements = ma.fields.List(ma.fields.Nested(StatementSchema), required=True,
                                 metadata={"description": "The 12 most recent monthly statements."})


class LeaderboardQuerySchema(InputSchema):
    limit = QueryInteger(load_default=10, validate=ma.validate.Range(min=1, max=100))


class LeaderboardEntrySchema(ma.Schema):
    rank = ma.fields.Integer(required=True)
    agent_id = ma.fields.String(required=True)
    name = ma.fields.String(required=True)
    earnings_cents = ma.fields.Integer(required=True)


class LeaderboardSchema(ma.Schema):
    week_start = ma.fields.DateTime(required=True, metadata={"description": "Monday 00:00 UTC"})
    week_end = ma.fields.DateTime(required=True, metadata={
        "description": "The next Monday 00:00 UTC, exclusive: the week is [week_start, week_end)."})
    limit = ma.fields.Integer(required=True)
    entries = ma.fields.List(ma.fields.Nested(LeaderboardEntrySchema), required=True)


class AgentFundSchema(InputSchema):
    amount_cents = JsonInteger(required=True, validate=ma.validate.Range(min=1, max=10_000_000), metadata={
        "description": "Cents to move from the owner's balance to the agent's (integer, 1 to 10,000,000)."})
    org_id = org_id_field("the organisation that owns the agent funds it; roles owner, billing (`billing:write`)")


class AgentFundedSchema(ma.Schema):
    agent_id = ma.fields.String(required=True)
    amount_cents = ma.fields.Integer(required=True, metadata={"description": "Cents moved."})
    transaction_id = ma.fields.String(required=True, metadata={"description": "The ledger transaction."})
    owner_balance_cents = ma.fields.Integer(required=True, metadata={"description": "Owner's balance after."})
    agent_balance_cents = ma.fields.Integer(required=True, metadata={"description": "Agent's balance after."})
    replayed = ma.fields.Boolean(required=True, metadata={
        "description": "True when the ledger already had this key's transfer but its first answer was "
                       "no longer stored (after `IDEMPOTENCY_TTL_SECONDS`); within that time a repeat "
                       "gets the first answer itself, with `Idempotent-Replayed: true`."})


class AgentDisableQuerySchema(InputSchema):
    org_id = org_id_field("an agent the organisation owns; owners and admins disable any, developers those "
                          "they registered (`agent:write`)")


class AgentDisabledSchema(ma.Schema):
    agent_id = ma.fields.String(required=True)
    disabled = ma.fields.Boolean(required=True, metadata={"description": "Always true."})
    disabled_at = ma.fields.DateTime(required=True, metadata={"description": "When it was disabled (the first time)."})
    revoked_sessions = ma.fields.Integer(required=True, metadata={
        "description": "Live sessions revoked by this request (0 on a repeat)."})
    returned_micros = ma.fields.Integer(required=True, metadata={
        "description": "The agent's balance moved back to the owner by this request, in micros "
                       "(1 cent = 10,000; exact, sub-cent amounts included; 0 on a repeat). What reaches the "
                       "agent later (a refund of a call in flight) follows within minutes."})
    owner_balance_cents = ma.fields.Integer(required=True, metadata={"description": "Owner's balance after."})
    replayed = ma.fields.Boolean(required=True, metadata={
        "description": "True when the agent was already disabled: nothing changed."})


class FundHeadersSchema(InputSchema):
    """Headers of ``POST /api/agent/{id}/fund``."""

    class Meta:
        unknown = ma.EXCLUDE

    idempotency_key = idempotency_key_header(
        "Optional, 1–128 characters: the transfer happens once per key "
        "(Stripe's semantics: the same key and body answer the first response, another body is 409).")
