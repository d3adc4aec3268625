"""Chat completions: validate, route, hold, call the upstream with failover, then settle;
streaming responses are relayed as OpenAI server-sent events and settled when they end.
With tracing on (app/telemetry.py) the phases are the spans ``chat.route``, ``chat.hold``,
``chat.provider`` and ``chat.settle``."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import orjson
from flask import current_app, g

from app import telemetry
from app.errors import DomainError, InvalidRequest, PaymentRequired, ProviderTimeout, UpstreamError
from app.ids import random_b62
from app.services.billing import paywall, x402
from app.services.money import holds as chat_billing
from app.services.money import ledger
from app.services.platform.uow import unit_of_work
from app.services.accounts import key_controls
from app.services.chat import byok as byok_keys
from app.services.chat.heartbeat import HoldHeartbeat
from app.services.chat import cooldown as chat_cooldown
from app.services.chat import providers
from app.services.chat.catalog import (Model, ModelNotFound, Needs, Offer, analyse, candidates, catalog,
                                       list_models, output_cap, reference_offer,
                                       savings_pct)

log = logging.getLogger(__name__)

# the OpenAPI document states these rules too (blueprints/chat/schemas.py _MESSAGE, _TOOL)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
CONTENT_REQUIRED = ("user", "system", "developer")


@dataclass
class ChatResult:
    """What the route turns into a response: a JSON body (OpenAI's ``chat.completion``) or,
    for ``stream: true``, ``events`` yielding the server-sent event bytes; plus headers.
    ``prompt``: a stream's prompt usage as known when it opened (OpenAI's ``prompt_tokens``
    and ``prompt_tokens_details``), which ``/v1/messages`` states in ``message_start``."""

    headers: dict
    body: dict | None = None
    events: Callable[[], Iterator[bytes]] | None = None
    prompt: dict | None = None


@dataclass
class _Call:
    """One request's routing and billing state."""

    id: str
    account_id: str
    mode: str
    body: dict
    needs: Needs
    started: float
    key_id: str | None = None  # the key whose spend limit the hold counts against
    actor: str | None = None  # the credential that acted
    hold_micros: int = 0
    budget_micros: int = 0  # the hold's size (also computed for test keys, which hold nothing)
    t0: float = 0.0  # perf_counter at the request's arrival (the route's timer), for the overhead
    provider_s: float = 0.0  # seconds spent in provider calls, every attempt
    held_at: object = None  # the hold's time (``holds.hold`` returns it; ``settle`` takes it)
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    all_timeouts: bool = True
    tokens: key_controls.Ticket | None = None  # the key's tpm count taken at admission
    route: chat_billing.PaidRoute = chat_billing.CHAT  # what a 402's x402 request names
    ref_micros: int = 0  # the usage's tokens at the savings reference (``_usage``), for ``savings_pct``

    @property
    def live(self) -> bool:
        return self.mode == "live"


def _validate(body: dict) -> None:
    for i, msg in enumerate(body["messages"]):
        where = f"messages.{i}"
        if not isinstance(msg, dict):
            raise InvalidRequest(f"{where}: must be an object.", param=where)
        if msg.get("role") not in ROLES:
            raise InvalidRequest(f"{where}.role: must be one of {', '.join(ROLES)}.", param=f"{where}.role")
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidRequest(f"{where}.content: must be a string or an array of parts.",
                                 param=f"{where}.content")
        if msg["role"] in CONTENT_REQUIRED and content in (None, "", []):
            raise InvalidRequest(f"{where}.content: is required for role {msg['role']}.", param=f"{where}.content")
        calls = msg.get("tool_calls")
        if calls is not None and (not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)):
            raise InvalidRequest(f"{where}.tool_calls: must be an array of "
                                 "{id, type: function, function: {name, arguments}}.", param=f"{where}.tool_calls")
        if msg["role"] == "tool" and not msg.get("tool_call_id"):
            raise InvalidRequest(f"{where}.tool_call_id: is required for role tool.", param=f"{where}.tool_call_id")
        if msg.get("is_error") is not None and not isinstance(msg["is_error"], bool):
            raise InvalidRequest(f"{where}.is_error: must be a boolean.", param=f"{where}.is_error")
        blocks = msg.get("thinking_blocks")
        if blocks is not None and not (isinstance(blocks, list) and all(isinstance(b, dict) for b in blocks)):
            raise InvalidRequest(f"{where}.thinking_blocks: must be an array of objects.",
                                 param=f"{where}.thinking_blocks")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")
            for t in tools)):
        raise InvalidRequest("tools: must be an array of {type: function, function: {name, ...}}.", param="tools")


def _order(offers: list[Offer]) -> list[Offer]:
    """Skip providers cooling down (unless every candidate is), cap the attempts."""
    cool = chat_cooldown.cooling(sorted({o.cooldown_id for o in offers}))
    fresh = [o for o in offers if o.cooldown_id not in cool]
    ordered = fresh or offers
    return ordered[: int(current_app.config["CHAT_MAX_ATTEMPTS"])]


def _hold_for(offers: list[Offer], needs: Needs) -> int:
    """Estimated maximum: estimated input tokens (chat/tokens.py, per candidate's tokenizer)
    × input price (the cache write price when cache breakpoints may make an Anthropic
    provider write it, ``Needs.max_cost_micros``) plus the output cap × output price, at
    the most expensive candidate."""
    models = catalog().models
    return max(needs.max_cost_micros(o, output_cap(models[o.model_id], needs) * needs.choices) for o in offers)


def _upstream_cap(call: _Call, offer: Offer) -> int:
    """The output cap sent to ``offer``: the request's ``max_tokens`` (bounded by the
    model), or, when it set none, as many tokens as the hold pays for at this offer's
    prices (the hold is sized for ``CHAT_DEFAULT_HOLD_OUTPUT_TOKENS`` at the most expensive
    candidate, so a cheaper one may generate more), at most ``CHAT_DEFAULT_MAX_TOKENS`` and
    the model's maximum. Either way the provider never generates more than the hold covers."""
    model = catalog().models[offer.model_id]
    cap = output_cap(model, call.needs)
    ceiling = min(model.max_output_tokens, int(current_app.config["CHAT_DEFAULT_MAX_TOKENS"]))
    if call.needs.max_tokens or ceiling <= cap:
        return cap
    n = call.needs.choices
    if call.needs.max_cost_micros(offer, ceiling * n) <= call.budget_micros:
        return ceiling
    lo, hi = cap, ceiling - 1  # cap fits (the budget covers it at the dearest candidate)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if call.needs.max_cost_micros(offer, mid * n) <= call.budget_micros:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _attempt(call: _Call, offers: list[Offer], fn):
    """Run ``fn(offer)`` over the candidates with failover; returns (offer, result)."""
    cap = float(current_app.config["CHAT_RETRY_AFTER_CAP"])
    waited = False
    i = 0
    while i < len(offers):
        offer = offers[i]
        call.attempts += 1
        sent = time.perf_counter()
        try:
            return offer, fn(offer)
        except providers.ProviderFailure as exc:
            call.failures.append(str(exc))
            call.all_timeouts = call.all_timeouts and exc.timeout
            last = i == len(offers) - 1
            log.info("chat %s: %s failed (%s)", call.id, offer.provider.id, exc)
            if last and not waited and exc.retry_after is not None and exc.retry_after <= cap:
                waited = True  # honour Retry-After once, when there is nowhere else to go
                time.sleep(exc.retry_after)
                continue
            chat_cooldown.record_failure(offer.cooldown_id, exc.retry_after)
        finally:
            call.provider_s += time.perf_counter() - sent
        i += 1
    return None, None


def _fail(call: _Call, rejected: providers.UpstreamRejected | None = None):
    if rejected is not None:
        error = f"the provider rejected the request: {rejected}"
    else:
        error = "; ".join(call.failures)[-300:] or "no provider answered"
    if call.live:
        chat_billing.release(call.id, error=error, attempts=call.attempts, created_at=call.held_at)
    _tokens_done(call, 0)
    headers = {"X-Chat-Attempts": str(call.attempts), "X-Chat-Completion-Id": call.id}
    if rejected is not None:
        raise InvalidRequest(f"The provider rejected the request: {rejected}", headers=headers)
    if call.all_timeouts:
        raise ProviderTimeout(f"Every provider timed out ({_attempts(call)}); nothing was charged.",
                              headers=headers)
    raise UpstreamError(f"No provider could serve the request ({_attempts(call)}: {error}); "
                        "nothing was charged.", headers=headers)


def _attempts(call: _Call) -> str:
    return f"{call.attempts} attempt{'' if call.attempts == 1 else 's'}"


def _tokens_done(call: _Call, total: int) -> None:
    """Correct the key's tpm count to the completion's ``total`` tokens (0: nothing was
    generated), once."""
    ticket, call.tokens = call.tokens, None
    if ticket is not None:
        try:
            key_controls.settle_tokens(ticket, total)
        except Exception:  # a rate counter, not money: the window ends within a minute
            log.exception("chat %s: could not correct the key's token count", call.id)


def _reasoning(upstream: dict, prompt: int, completion: int) -> tuple[int, int]:
    """(billable completion tokens, reasoning tokens). OpenAI counts reasoning tokens
    (``completion_tokens_details.reasoning_tokens``) inside ``completion_tokens``; an
    upstream that reports them apart (its ``total_tokens`` = prompt + completion +
    reasoning) has them added, so they are always metered at the output price."""
    details = upstream.get("completion_tokens_details") or {}
    reasoning = int(details.get("reasoning_tokens") or 0) if isinstance(details, dict) else 0
    total = upstream.get("total_tokens")
    if reasoning > 0 and isinstance(total, int) and total == prompt + completion + reasoning:
        completion += reasoning
    return completion, reasoning


def _count(value) -> bool:
    """A token count as a provider reports one: a non-negative integer."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _cache_split(upstream: dict) -> tuple[int, int, int]:
    """(cache reads, cache writes, of those the writes to the 1-hour cache) of a provider's
    prompt count (OpenAI's ``prompt_tokens_details``; Anthropic's counts mapped to it by
    providers)."""
    details = upstream.get("prompt_tokens_details") or {}
    return (int(details.get("cached_tokens") or 0), int(details.get("cache_write_tokens") or 0),
            int(details.get("cache_write_1h_tokens") or 0))


def _cache_details(cached: int, written: int, hour: int) -> dict:
    """``prompt_tokens_details`` of a usage: cache reads and writes, the 1-hour writes when any."""
    return {"cached_tokens": cached, "cache_write_tokens": written, **({"cache_write_1h_tokens": hour} if hour else {})}


def _usage(call: _Call, offer: Offer, upstream: dict | None, generated_chars: int, cut: bool = False) -> dict:
    """OpenAI usage plus cost_usd, cost_micros, savings_pct, latency_ms (and estimated);
    for a completion served with the caller's own key (BYOK) also ``byok``,
    ``byok_fee_pct`` and ``provider_cost_micros`` (the list cost its provider bills).
    ``cut``: a stream that did not finish (client gone, provider broke off): a prompt count
    the provider already reported (Anthropic's ``message_start``) is used, the output estimated."""
    # usage without an integer prompt and completion count is no usage (the flagged estimate)
    estimated = not (isinstance(upstream, dict) and _count(upstream.get("prompt_tokens"))
                     and _count(upstream.get("completion_tokens")))
    cached = written = hour = reasoning = 0
    if estimated:
        prompt, completion = call.needs.prompt_tokens_for(offer), -(-generated_chars // 4)
        if cut and isinstance(upstream, dict) and _count(upstream.get("prompt_tokens")):
            prompt = int(upstream["prompt_tokens"])
            cached, written, hour = _cache_split(upstream)
    else:
        prompt = int(upstream["prompt_tokens"])
        completion, reasoning = _reasoning(upstream, prompt, int(upstream["completion_tokens"]))
        cached, written, hour = _cache_split(upstream)
    cost = offer.cost_micros(prompt, completion, cached, written, hour)
    ref = reference_offer(call.body["model"])
    ref_cost = call.ref_micros = ref.cost_micros(prompt, completion, cached, written, hour) if ref else 0
    listed = offer.list_cost_micros(prompt, completion, cached, written, hour) if offer.byok_key_id else None
    # BYOK: the savings compare what the caller pays in all (its provider's bill + the fee)
    paid = cost + (listed or 0)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "cost_usd": cost / 1_000_000, "cost_micros": cost, "savings_pct": savings_pct(paid, ref_cost),
           "latency_ms": int((time.monotonic() - call.started) * 1000), "estimated": estimated}
    if cached or written:  # OpenAI's name for cache reads; the Messages API reports both
        out["prompt_tokens_details"] = _cache_details(cached, written, hour)
    if reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    if listed is not None:
        out.update(byok=True, byok_fee_pct=float(offer.fee_pct), provider_cost_micros=listed)
    return out


def _settle(call: _Call, offer: Offer, usage: dict, error: str | None = None) -> None:
    with telemetry.span("chat.settle"):  # gw_chat_settles on PostgreSQL
        _record(call, offer, usage, error)
    # ``cost`` (USD): the name LiteLLM keeps from a stream's final usage (OpenRouter's field)
    usage["cost"] = usage["cost_usd"]


def _record(call: _Call, offer: Offer, usage: dict, error: str | None) -> None:
    args = dict(model=offer.model_id, provider=offer.provider.id, prompt_tokens=usage["prompt_tokens"],
                completion_tokens=usage["completion_tokens"], estimated=usage["estimated"],
                attempts=call.attempts, latency_ms=usage["latency_ms"], error=error)
    if call.live:
        if offer.byok_key_id is not None:  # recorded before the fee is charged
            byok_keys.mark(call.id, call.held_at, offer.byok_key_id, usage["provider_cost_micros"])
        charged = chat_billing.settle(call.id, call.account_id, call.hold_micros, usage["cost_micros"],
                                      created_at=call.held_at, **args)
        if charged is None:
            # the stale-hold sweep released the hold first (a request silent for
            # CHAT_HOLD_TTL_SECONDS: only a stream has a heartbeat): answered, not charged —
            # and the answer says so instead of a cost nobody paid
            log.warning("chat_settle_late: completion %s was released by the sweep before it "
                        "settled; answered and not charged", call.id)
            charged = 0
        if charged != usage["cost_micros"]:  # capped at the hold, or released late: what was charged
            usage["cost_micros"], usage["cost_usd"] = charged, charged / 1_000_000
            usage["savings_pct"] = savings_pct(charged + usage.get("provider_cost_micros", 0), call.ref_micros)
    else:
        chat_billing.record_sandbox(call.id, call.account_id, requested_model=call.body["model"],
                                    cost_micros=usage["cost_micros"], stream=bool(call.body.get("stream")),
                                    **args)
    _tokens_done(call, usage["total_tokens"])


def _chars(message_or_delta: dict) -> int:
    """Characters of an answer's text and tool calls (the output estimate when the provider
    reports no usage). The answer is the provider's, passed on as it came: a value of
    another shape than OpenAI's (content parts, a number, a name that is no string) counts
    by its text or not at all, never as an error after the provider was paid."""
    n = _text_len(message_or_delta.get("content"))
    calls = message_or_delta.get("tool_calls")
    for tc in calls if isinstance(calls, list) else ():
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            n += _text_len(fn.get("name")) + _text_len(fn.get("arguments"))
    return n


def _text_len(value) -> int:
    """Length of a string, or of the ``text`` of a list of content parts; else 0."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(p["text"]) for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def _fund_hold(call: _Call, payment: str) -> x402.X402Payment:
    """Pay the hold by x402 (``X-Payment`` / ``PAYMENT-SIGNATURE``), when the balance cannot
    cover it: the 402 asked for the hold rounded up to cents (scheme ``exact``), so the
    payment is verified for that amount, reserved (single use) and settled
    (``x402.accept``: no transaction open), then booked as a credit to the payer's balance
    in a unit of work of its own (``x402.book``). The normal hold, settle or release then
    run on the balance: what the completion does not cost stays there. A refused payment
    is 402 ``payment_invalid`` with a fresh ``PAYMENT-REQUIRED``; nothing is credited."""
    price = -(-call.hold_micros // ledger.MICROS_PER_CENT) * ledger.MICROS_PER_CENT
    url = paywall.resource_url(call.route.path)
    pay = x402.accept(payment, account_id=call.account_id, price_micros=price, resource_url=url,
                      mode=call.mode, description=call.route.description, extensions=call.route.extensions())
    with unit_of_work():
        x402.book(pay, call_id=call.id)
    log.info("chat %s: x402 payment of %s micros credited (%s)", call.id, pay.value_atomic, pay.auth_id)
    return pay


def _route(account_id: str, mode: str, body: dict, controls: key_controls.KeyControls | None, byok: bool,
           unseal: bool = True) -> tuple[Needs, list[Offer]]:
    """The request's needs and candidate offers, cheapest first (before cooldowns and the
    attempt cap): the key's allow-list (403 ``model_not_allowed``), the body's checks (400),
    the model (404 ``model_not_found``), what it needs (400 ``no_matching_model``,
    ``context_length_exceeded``). ``unseal``: open the account's own provider keys (a
    completion calls with them; an estimate only needs to know which providers they serve)."""
    allowed = key_controls.allowed_models(controls, body.get("model"))
    _validate(body)
    needs = analyse(body)
    sandbox = current_app.config["CHAT_SANDBOX_PROVIDER"] if mode == "test" else None
    own = byok_keys.own_keys(account_id, unseal=unseal) if byok and mode == "live" else None
    return needs, candidates(body["model"], needs, sandbox=sandbox, own=own, allowed=allowed)


def prompt_estimate(account_id: str, mode: str, body: dict, controls: key_controls.KeyControls | None = None,
                    byok: bool = False) -> int:
    """The input tokens of ``body`` as ``create_completion`` estimates them to size its hold
    (chat/tokens.py, per candidate's tokenizer): the largest of its candidates' estimates.
    The same refusals as a completion before it holds anything; no hold, no call, no charge,
    and not counted in the key's rpm or tpm (``POST /v1/messages/count_tokens``)."""
    needs, offers = _route(account_id, mode, body, controls, byok, unseal=False)
    return max(needs.prompt_tokens_for(o) for o in offers)


def create_completion(account_id: str, mode: str, body: dict, key_id: str | None = None,
                      actor: str | None = None, payment: str | None = None,
                      controls: key_controls.KeyControls | None = None, byok: bool = False,
                      route: chat_billing.PaidRoute = chat_billing.CHAT) -> ChatResult:
    """Route, hold, call (with failover), settle. Test-mode keys use the sandbox provider
    only and move no money. ``key_id``: the API key whose spend limit the hold counts against;
    ``account_id`` pays, ``actor`` (the credential's id) acted: both are recorded.
    ``payment``: an x402 payment header; used only when the balance cannot cover the hold
    (``_fund_hold``), and then every answer carries ``PAYMENT-RESPONSE``.
    ``controls``: the key's models allow-list (403 ``model_not_allowed``), rpm and tpm limits
    (429). ``byok``: the account has provider keys of its own (read here, live mode only):
    the offers they serve come first and are charged the platform fee. ``route``: the route
    the caller called, as an x402 payment request names it (``holds.MESSAGES`` for
    ``/v1/messages``)."""
    started = time.monotonic()
    with telemetry.span("chat.route"):  # validation, request analysis, candidates, hold size
        needs, offers = _route(account_id, mode, body, controls, byok)
        offers = _order(offers)
        call = _Call(id="chatcmpl-" + random_b62(24), account_id=account_id, mode=mode, body=body,
                     needs=needs, started=started, t0=g.get("request_started") or time.perf_counter(),
                     key_id=key_id, actor=actor, route=route)
        call.budget_micros = _hold_for(offers, needs)
        if call.live:
            call.hold_micros = call.budget_micros
    # the key's tpm: the estimated prompt plus the output the request asked for; then its rpm
    # (a request either limit refuses counts in neither window: its tokens are given back)
    call.tokens = key_controls.reserve_tokens(controls, needs.prompt_tokens + (needs.max_tokens or 0) * needs.choices)
    try:
        key_controls.count_request(controls)
    except BaseException:
        _tokens_done(call, 0)
        raise
    paid_headers: dict = {}
    try:
        _hold(call, payment, paid_headers)
    except BaseException:
        _tokens_done(call, 0)
        raise
    try:
        result = _complete(call, offers)
    except DomainError as exc:  # e.g. every provider failed: the hold went back to the balance
        exc.headers.update(paid_headers)
        raise
    result.headers.update(paid_headers)
    return result


def _hold(call: _Call, payment: str | None, paid_headers: dict) -> None:
    """Take the hold (live mode), paying it by x402 first when the balance is short and a
    payment came with the request (its ``PAYMENT-RESPONSE`` headers go to ``paid_headers``)."""
    account_id, body, key_id, actor = call.account_id, call.body, call.key_id, call.actor
    if call.live:
        with telemetry.span("chat.hold"):  # gw_chat_holds on PostgreSQL
            def hold():
                return chat_billing.hold(call.id, account_id, body["model"], call.hold_micros,
                                         bool(body.get("stream")), key_id=key_id, actor=actor, route=call.route)
            try:
                call.held_at = hold()
            except PaymentRequired as exc:
                if not payment or exc.code != "payment_required":
                    raise
                paid_headers.update(x402.response_headers(_fund_hold(call, payment)))
                try:
                    call.held_at = hold()  # short again (spent meanwhile): the credit stays
                except DomainError as again:
                    again.headers.update(paid_headers)
                    raise


def _complete(call: _Call, offers: list[Offer]) -> ChatResult:
    """Call the provider (with failover) and settle, the hold being in place."""
    body = call.body
    models = catalog().models
    try:
        if body.get("stream"):
            return _start_stream(call, offers, models)
        try:
            with telemetry.span("chat.provider"):  # every attempt, failover included
                offer, data = _attempt(call, offers, lambda o: providers.complete(o, body, _upstream_cap(call, o)))
        except providers.UpstreamRejected as exc:
            _fail(call, exc)
        if offer is None:
            _fail(call)
        choices = data["choices"]
        chars = sum(_chars(c.get("message") or {}) for c in choices if isinstance(c, dict))
        usage = _usage(call, offer, data.get("usage"), chars)
        _settle(call, offer, usage)
    except BaseException:
        _tokens_done(call, 0)
        if call.live:  # an unexpected error must not leave money on hold
            try:
                chat_billing.release(call.id, error="internal error", attempts=call.attempts,
                                     created_at=call.held_at)
            except Exception:  # the sweep releases it later
                log.exception("chat %s: could not release the hold", call.id)
        raise
    out = {"id": call.id, "object": "chat.completion", "created": int(time.time()),
           "model": offer.model_id, "choices": choices, "usage": usage, "provider": offer.provider.id}
    if data.get("system_fingerprint"):
        out["system_fingerprint"] = data["system_fingerprint"]
    return ChatResult(body=out, headers=_headers(call, offer) | {
        "X-Chat-Cost-Micros": str(usage["cost_micros"]), "X-Gateway-Cost-Micros": str(usage["cost_micros"]),
        "X-Gateway-Savings-Pct": str(usage["savings_pct"])})


def _headers(call: _Call, offer: Offer) -> dict:
    """The ``X-Chat-*`` headers and ``X-Gateway-Overhead-Ms``: the time the gateway added
    so far, i.e. since the request arrived minus the time spent waiting for providers (a
    stream's headers leave at its first event: its overhead up to then)."""
    overhead = (time.perf_counter() - call.t0 - call.provider_s) * 1000
    out = {"X-Chat-Completion-Id": call.id, "X-Chat-Provider": offer.provider.id,
           "X-Chat-Model": offer.model_id, "X-Chat-Attempts": str(call.attempts),
           "X-Gateway-Overhead-Ms": f"{max(0.0, overhead):.2f}"}
    if offer.byok_key_id is not None:
        out["X-Chat-Byok"] = offer.byok_key_id  # served with the caller's own provider key
    return out


def _start_stream(call: _Call, offers: list[Offer], models: dict[str, Model]) -> ChatResult:
    """Open the stream at the first candidate that yields a first event (failover happens
    only before anything was sent to the client)."""
    def open_(offer: Offer):
        it = providers.stream(offer, call.body, _upstream_cap(call, offer))
        try:
            first = next(it)
        except StopIteration:
            raise providers.ProviderFailure(f"{offer.provider.id}: empty stream") from None
        return it, first

    try:
        with telemetry.span("chat.provider"):  # until the first event (failover happens before it)
            offer, opened = _attempt(call, offers, open_)
    except providers.UpstreamRejected as exc:
        _fail(call, exc)
    if offer is None:
        _fail(call)
    it, first = opened
    created = int(time.time())
    beat = None  # the hold's heartbeat runs with the body: a body never run keeps nothing alive
    # OpenAI sends a usage chunk (``choices: []``) only for ``stream_options.include_usage``;
    # without it the usage rides on the chunk that finished the answer, held back to the end
    usage_chunk = (call.body.get("stream_options") or {}).get("include_usage") is True

    def sse(obj: dict) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def events() -> Iterator[bytes]:
        upstream_usage = None
        chars = 0
        error = None
        settled = False

        def finish() -> dict:
            nonlocal settled
            settled = True
            if beat is not None:
                beat.stop()
            usage = _usage(call, offer, upstream_usage, chars, cut=error is not None)
            _settle(call, offer, usage, error)
            return usage

        nonlocal beat
        if call.live:
            beat = HoldHeartbeat(call.id).start()
        held = None  # the last chunk that finished a choice, when the usage rides on it
        try:
            chunk = first
            while chunk is not None:
                if chunk.get("usage"):
                    upstream_usage = chunk["usage"]
                choices = chunk.get("choices") or []
                if choices:
                    for c in choices:
                        chars += _chars(c.get("delta") or {})
                    out = {"id": call.id, "object": "chat.completion.chunk", "created": created,
                           "model": offer.model_id, "choices": choices}
                    if held is not None:  # a later chunk came: the held one goes first (order kept)
                        yield sse(held)
                        held = None
                    if not usage_chunk and any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
                        held = out  # the last chunk that finishes a choice carries the usage
                    else:
                        yield sse(out)
                try:
                    chunk = next(it)
                except StopIteration:
                    chunk = None
                except providers.ProviderFailure as exc:
                    error = f"stream interrupted: {exc}"
                    chunk = None
            usage = finish()
            if error:
                yield sse({"error": {"message": "The provider stream was interrupted; you were charged "
                                                "for the tokens generated so far.",
                                     "type": "server_error", "code": "provider_error", "param": None}})
            if held is not None:
                yield sse({**held, "usage": usage})
            else:  # asked for (include_usage), or no chunk finished the answer (cut: an error came first)
                yield sse({"id": call.id, "object": "chat.completion.chunk", "created": created,
                           "model": offer.model_id, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
        finally:
            if not settled:  # client went away (GeneratorExit) or an unexpected error
                close = getattr(it, "close", None)
                if close:
                    close()
                error = error or "client disconnected"
                try:
                    finish()
                except Exception:
                    log.exception("chat %s: settling the interrupted stream failed", call.id)

    return ChatResult(events=events, headers=_headers(call, offer), prompt=_opening_prompt(call, offer, first))


def _opening_prompt(call: _Call, offer: Offer, first: dict) -> dict:
    """The prompt's usage when a stream opens: the provider's count if its first event
    carried one (Anthropic's ``message_start``), else the gateway's estimate at ``offer``
    (the one its hold counted and an estimated charge would bill); the stream's final usage
    has the count that is billed."""
    upstream = first.get("usage")
    if isinstance(upstream, dict) and _count(upstream.get("prompt_tokens")):
        return {"prompt_tokens": int(upstream["prompt_tokens"]),
                "prompt_tokens_details": _cache_details(*_cache_split(upstream))}
    return {"prompt_tokens": call.needs.prompt_tokens_for(offer)}


@dataclass(frozen=True)
class ModelInfo:
    """One entry of ``GET /v1/models`` (OpenAI's model object plus the catalog's facts;
    ``auto`` has only the OpenAI fields and a description)."""

    id: str
    owned_by: str
    description: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    capabilities: list[str] | None = None
    pricing: dict | None = None
    object: str = "model"
    created: int = 0


AUTO = ModelInfo(id="auto", owned_by="gateway", description="Routes to the cheapest model that fits the request.")


def get_model(model_id: str, controls=None, own=None) -> ModelInfo:
    """``GET /v1/models/{id}``: one entry of ``models`` (404 ``model_not_found``, also for a
    model outside the key's allow-list)."""
    for entry in models(controls, own):
        if entry.id == model_id:
            return entry
    raise ModelNotFound(f"The model {model_id!r} does not exist or is not available.")


def models(controls=None, own=None) -> list[ModelInfo]:
    """``GET /v1/models``: ``auto`` and every model the caller can use, with the cheapest
    offer's prices: those the platform serves and, with ``own`` (the account's provider
    keys, ``byok.own_keys(unseal=False)``), those its keys serve — alone with ``byok_only``, as
    routing does (``catalog.candidates``); for a key with a model allow-list
    (``controls``), only its models (as OpenAI lists a restricted project's)."""
    allowed = key_controls.allowed_models(controls, "auto")
    out = [AUTO]
    for m in (list_models() if own is None else catalog().models.values()):
        if allowed is not None and m.id not in allowed:
            continue
        usable = list(m.enabled_offers()) if own is None or not own.only else []
        if own is not None:
            usable = own.offers(m) + usable
        if not usable:
            continue
        cheapest = min(usable, key=lambda o: (o.input_price + o.output_price))
        out.append(ModelInfo(id=m.id, owned_by=",".join(dict.fromkeys(o.provider.id for o in usable)),
                             description=m.description, context_window=m.context_window,
                             max_output_tokens=m.max_output_tokens, capabilities=sorted(m.capabilities),
                             pricing={"input_usd_per_mtok": str(cheapest.input_price),
                                      "output_usd_per_mtok": str(cheapest.output_price)}))
    return out
