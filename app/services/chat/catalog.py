"""Chat model catalog: models, providers and prices read from ``catalog/models*.yaml``,
cached in memory per process, plus request analysis, pricing and candidate routing.

The snapshot is built once per process with what routing needs precomputed (each
model's enabled offers, the ``auto``-eligible models, savings references), so a request
does no catalog work beyond pricing its candidates. Invalidation is cheap: at most every
``CHAT_CATALOG_CHECK_SECONDS`` the file list and modification times are compared (a few
``stat`` calls) and a changed catalog is re-read; an edit that does not load is logged
and the previous snapshot kept.

Prices are USD per million tokens, which is exactly micros per token, kept as
``Decimal`` so every cost is computed exactly and rounded once (half up) to a micro.
"""
from __future__ import annotations

import glob
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import yaml
from flask import current_app

from app.errors import CatalogError, InvalidRequest, NotFound, ServiceUnavailable
from app.services.chat import tokens

log = logging.getLogger(__name__)

CAPABILITIES = ("tools", "json_mode", "vision", "streaming", "reasoning")
# Thinking asked as OpenAI's ``reasoning_effort`` ↔ as Anthropic's ``thinking.budget_tokens``
# (LiteLLM's mapping; Anthropic's least budget is 1,024): an effort is sent to an Anthropic
# provider as its budget, a budget to an OpenAI-compatible one as the least effort whose
# budget covers it (``high`` above 2,048). ``none`` (and ``thinking.type: disabled``) asks for none.
EFFORT_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 2048, "high": 4096}
PROVIDER_TYPES = ("openai", "anthropic")
API_NAMES = {"openai": "OpenAI's chat completions", "anthropic": "Anthropic's Messages API"}
# The most stop sequences a provider of each type is sent: OpenAI's documented limit of 4
# (``stop``; more is its 400); for Anthropic's the 16 the gateway's own Messages API takes.
MAX_STOP_SEQUENCES = {"openai": 4, "anthropic": 16}



class ModelNotFound(NotFound):
    code, message = "model_not_found", "No such model."
    description = "Chat: no available model has this id (GET /v1/models lists them)."


class NoMatchingModel(InvalidRequest):
    code, message = "no_matching_model", "No available model fits the request."
    description = ("Chat: no available model supports what the request needs (tools, JSON mode, "
                   "images, context).")


class ContextLengthExceeded(InvalidRequest):
    code, message = "context_length_exceeded", "The messages exceed the model's context window."
    description = "Chat: the messages exceed the named model's context window."


class OutputLimitExceeded(InvalidRequest):
    """``max_tokens`` (or ``max_completion_tokens``) above the named model's maximum output:
    refused as OpenAI and Anthropic refuse it, never silently capped. The message is
    OpenAI's wording; ``for_messages()`` is the same refusal in Anthropic's (``/v1/messages``)."""

    def __init__(self, field: str, requested: int, maximum: int, model: str):
        super().__init__(f"{field} is too large: {requested}. This model supports at most {maximum} "
                         f"completion tokens, whereas you provided {requested}.", param=field)
        self.requested, self.maximum, self.model = requested, maximum, model

    def for_messages(self) -> InvalidRequest:
        return InvalidRequest(f"max_tokens: {self.requested} > {self.maximum}, which is the maximum allowed "
                              f"number of output tokens for {self.model}", param="max_tokens")

class TooManyStopSequences(NoMatchingModel):
    """More stop sequences than any candidate's API takes (``MAX_STOP_SEQUENCES``): refused
    before any hold, naming ``stop``; ``for_messages()`` is the same refusal naming the
    Messages API's ``stop_sequences``."""

    def __init__(self, count: int, model_name: str, field: str = "stop"):
        self.count, self.model_name = count, model_name
        most = ", ".join(f"{MAX_STOP_SEQUENCES[t]} for {API_NAMES[t]}" for t in PROVIDER_TYPES)
        whose = "any available model" if model_name == "auto" else f"any provider of the model {model_name!r}"
        super().__init__(f"{field}: {count} stop sequences, more than {whose} takes (at most {most}); "
                         "send fewer.", param=field)

    def for_messages(self) -> InvalidRequest:
        return TooManyStopSequences(self.count, self.model_name, "stop_sequences")


@dataclass(frozen=True)
class Provider:
    id: str
    type: str
    base_url: str | None
    api_key: str | None
    requires_key: bool
    timeout: float | None

    @property
    def enabled(self) -> bool:
        return bool(self.base_url) and (self.api_key is not None or not self.requires_key)


@dataclass(frozen=True)
class Offer:
    """One provider serving one model at a price (micros per token)."""

    model_id: str
    provider: Provider
    upstream_model: str
    input_price: Decimal
    output_price: Decimal
    # Prompt tokens read from / written to the provider's prompt cache (default: the input price);
    # written to Anthropic's 1-hour cache (``ttl: "1h"``; default: 2× the input price, Anthropic's).
    cache_read_price: Decimal | None = None
    cache_write_price: Decimal | None = None
    cache_write_1h_price: Decimal | None = None
    # The model can think (capability ``reasoning``): it is sent the request's thinking
    # (``providers``); an offer of a model that cannot is sent none (docs/chat.md "Thinking").
    reasoning: bool = False
    # Bring your own key (app.services.chat.byok): served with the caller's provider key
    # ``byok_key_id`` (in ``provider.api_key``) and charged ``fee_pct`` % of the list cost.
    byok_key_id: str | None = None
    fee_pct: Decimal | None = None

    def cost_micros(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                    cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0) -> int:
        """What the gateway charges for these tokens at this offer: the list cost, or for a
        BYOK offer the platform fee, ``fee_pct`` % of the exact list cost (rounded half up
        once). ``prompt_tokens`` counts every input token; ``cached_tokens`` and
        ``cache_write_tokens`` of them are priced at the cache read / write prices, of which
        ``cache_write_1h_tokens`` at the 1-hour cache's write price."""
        return self.list_cost_micros(prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens,
                                     cache_write_1h_tokens,
                                     factor=None if self.byok_key_id is None else self.fee_pct / 100)

    def list_cost_micros(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                         cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0,
                         factor: Decimal | None = None) -> int:
        """The cost at the model's list price (for a BYOK offer: what the caller's provider bills)."""
        return price_micros(self.input_price, self.output_price, prompt_tokens, completion_tokens,
                            cached_tokens=cached_tokens, cache_write_tokens=cache_write_tokens,
                            cache_write_1h_tokens=cache_write_1h_tokens,
                            cache_read_price=self.cache_read_price, cache_write_price=self.cache_write_price,
                            cache_write_1h_price=self.cache_write_1h_price, factor=factor)

    @property
    def cache_write_1h_usd(self) -> Decimal | None:
        """The price billing uses for a prompt token written to the 1-hour cache
        (``cache_write_1h_price``, default 2× input), or None for an OpenAI-compatible
        provider: it is never sent a cache mark, so it never writes to that cache."""
        if self.provider.type != "anthropic":
            return None
        return cache_write_1h_price_of(self.input_price, self.cache_write_1h_price)

    @property
    def cooldown_id(self) -> str:
        """Whose failures cool this offer down: the provider, or the caller's own key of it
        (a customer's bad key never cools the platform's provider down)."""
        return self.provider.id if self.byok_key_id is None else f"{self.provider.id}@{self.byok_key_id}"


@dataclass(frozen=True)
class Model:
    id: str
    description: str
    context_window: int
    max_output_tokens: int
    capabilities: frozenset[str]
    auto: bool
    offers: tuple[Offer, ...]  # catalog order: the first is the primary provider
    enabled: tuple[Offer, ...] = ()  # the offers whose provider is enabled (set at load)

    @property
    def primary(self) -> Offer:
        return self.offers[0]

    def enabled_offers(self) -> tuple[Offer, ...]:
        return self.enabled


@dataclass
class Catalog:
    models: dict[str, Model] = field(default_factory=dict)
    providers: dict[str, Provider] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    auto_models: tuple[Model, ...] = ()  # auto-eligible, in catalog order
    stamp: tuple = ()  # (file, mtime) of every file read: the invalidation check
    checked_at: float = 0.0  # monotonic time of the last check
    references: dict = field(default_factory=dict)  # (model name, CHAT_REFERENCE_MODEL) -> Offer


def price_micros(input_price: Decimal, output_price: Decimal, prompt_tokens: int,
                 completion_tokens: int, *, cached_tokens: int = 0, cache_write_tokens: int = 0,
                 cache_write_1h_tokens: int = 0, cache_read_price: Decimal | None = None,
                 cache_write_price: Decimal | None = None, cache_write_1h_price: Decimal | None = None,
                 factor: Decimal | None = None) -> int:
    """Exact cost in micros: tokens × micros-per-token ($/Mtok), rounded half up once. Of the
    ``prompt_tokens``, ``cached_tokens`` are priced at ``cache_read_price`` and
    ``cache_write_tokens`` at ``cache_write_price`` (each defaulting to the input price), except
    the ``cache_write_1h_tokens`` of them, written to Anthropic's 1-hour cache, at
    ``cache_write_1h_price`` (default 2× the input price, as Anthropic bills them).
    ``factor``: the exact total is multiplied by it before the rounding (a BYOK fee)."""
    cached = max(0, min(int(cached_tokens), int(prompt_tokens)))
    written = max(0, min(int(cache_write_tokens), int(prompt_tokens) - cached))
    written_1h = max(0, min(int(cache_write_1h_tokens), written))
    read_p = input_price if cache_read_price is None else cache_read_price
    write_p = input_price if cache_write_price is None else cache_write_price
    write_1h_p = cache_write_1h_price_of(input_price, cache_write_1h_price)
    total = input_price * (prompt_tokens - cached - written) + read_p * cached \
        + write_p * (written - written_1h) + write_1h_p * written_1h + output_price * completion_tokens
    if factor is not None:
        total *= factor
    return int(total.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def cache_write_1h_price_of(input_price: Decimal, cache_write_1h_price: Decimal | None) -> Decimal:
    """The 1-hour cache's write price: the catalog's, else 2× the input price (Anthropic's)."""
    return input_price * 2 if cache_write_1h_price is None else cache_write_1h_price


def _optional_price(value: Any, where: str) -> Decimal | None:
    return None if value is None else _price(value, where)


def _price(value: Any, where: str) -> Decimal:
    try:
        d = Decimal(str(value))
    except Exception as exc:  # noqa: BLE001
        raise CatalogError(f"{where}: price {value!r} is not a number") from exc
    if not d.is_finite() or d < 0:
        raise CatalogError(f"{where}: price must be a non-negative number")
    return d


def _load_provider(pid: str, spec: dict, settings: dict) -> Provider:
    if not isinstance(spec, dict) or spec.get("type") not in PROVIDER_TYPES:
        raise CatalogError(f"provider {pid}: type must be one of {', '.join(PROVIDER_TYPES)}")
    env = settings.get(pid) or {}
    base_url = env.get("base_url") or spec.get("base_url")
    timeout = spec.get("timeout")
    return Provider(id=pid, type=spec["type"], base_url=(base_url or "").rstrip("/") or None,
                    api_key=env.get("api_key"), requires_key=bool(spec.get("requires_key", False)),
                    timeout=float(timeout) if timeout is not None else None)


def load_catalog(pattern: str, settings: dict) -> Catalog:
    """Read every YAML file matching ``pattern`` (a glob); ``settings`` maps provider id →
    ``{"base_url", "api_key"}`` from the environment (overriding the YAML base_url)."""
    cat = Catalog()
    files = sorted(glob.glob(pattern))
    if not files:
        raise CatalogError(f"no chat catalog file matches {pattern}")
    raw_models: list[tuple[str, dict]] = []
    for path in files:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
        if not isinstance(doc, dict):
            raise CatalogError(f"{path}: top level must be a mapping")
        for pid, spec in (doc.get("providers") or {}).items():
            if pid in cat.providers:
                raise CatalogError(f"{path}: provider {pid} defined twice")
            cat.providers[pid] = _load_provider(pid, spec, settings)
        raw_models.extend((path, m) for m in (doc.get("models") or []))
        cat.files.append(path)
    for path, m in raw_models:
        mid = m.get("id") if isinstance(m, dict) else None
        if not mid or not isinstance(mid, str) or mid == "auto":
            raise CatalogError(f"{path}: every model needs a string id other than 'auto'")
        if mid in cat.models:
            raise CatalogError(f"{path}: model {mid} defined twice")
        caps = frozenset(m.get("capabilities") or ())
        if caps - set(CAPABILITIES):
            raise CatalogError(f"{path}: model {mid}: unknown capabilities {sorted(caps - set(CAPABILITIES))}")
        offers = []
        for o in m.get("providers") or []:
            prov = cat.providers.get(o.get("provider"))
            if prov is None:
                raise CatalogError(f"{path}: model {mid}: unknown provider {o.get('provider')!r}")
            where = f"{path}: model {mid} at {prov.id}"
            offers.append(Offer(model_id=mid, provider=prov,
                                upstream_model=str(o.get("upstream_model") or mid),
                                input_price=_price(o.get("input_usd_per_mtok"), where),
                                output_price=_price(o.get("output_usd_per_mtok"), where),
                                cache_read_price=_optional_price(o.get("cache_read_usd_per_mtok"), where),
                                cache_write_price=_optional_price(o.get("cache_write_usd_per_mtok"), where),
                                cache_write_1h_price=_optional_price(o.get("cache_write_1h_usd_per_mtok"), where),
                                reasoning="reasoning" in caps))
        if not offers:
            raise CatalogError(f"{path}: model {mid} has no providers")
        try:
            ctx, max_out = int(m["context_window"]), int(m.get("max_output_tokens") or m["context_window"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CatalogError(f"{path}: model {mid}: context_window must be an integer") from exc
        cat.models[mid] = Model(id=mid, description=str(m.get("description") or ""),
                                context_window=ctx, max_output_tokens=max_out, capabilities=caps,
                                auto=bool(m.get("auto", True)), offers=tuple(offers),
                                enabled=tuple(o for o in offers if o.provider.enabled))
    cat.auto_models = tuple(m for m in cat.models.values() if m.auto)
    cat.stamp = _stamp(pattern)
    cat.checked_at = time.monotonic()
    return cat


def _stamp(pattern: str) -> tuple:
    out = []
    for path in sorted(glob.glob(pattern)):
        try:
            out.append((path, os.stat(path).st_mtime_ns))
        except OSError:
            out.append((path, None))
    return tuple(out)


_lock = threading.Lock()


def catalog() -> Catalog:
    """This app's catalog snapshot, loaded once per process and kept in memory; re-read
    when its files changed (checked at most every ``CHAT_CATALOG_CHECK_SECONDS``)."""
    app = current_app
    cat = app.extensions.get("chat_catalog")
    if cat is not None and time.monotonic() - cat.checked_at < float(app.config["CHAT_CATALOG_CHECK_SECONDS"]):
        return cat
    with _lock:
        cat = app.extensions.get("chat_catalog")
        if cat is None:
            cat = app.extensions["chat_catalog"] = load_catalog(app.config["CHAT_CATALOG"],
                                                                app.config["CHAT_PROVIDERS"])
        elif time.monotonic() - cat.checked_at >= float(app.config["CHAT_CATALOG_CHECK_SECONDS"]):
            cat.checked_at = time.monotonic()
            if _stamp(app.config["CHAT_CATALOG"]) != cat.stamp:
                try:
                    cat = app.extensions["chat_catalog"] = load_catalog(app.config["CHAT_CATALOG"],
                                                                        app.config["CHAT_PROVIDERS"])
                    log.info("chat catalog re-read: %d models", len(cat.models))
                except CatalogError as exc:  # keep serving the last good snapshot
                    log.error("chat catalog changed but does not load (%s); keeping the previous one", exc)
    return cat


def reload() -> Catalog:
    current_app.extensions.pop("chat_catalog", None)
    return catalog()


# --- request analysis -------------------------------------------------------------------

@dataclass
class Needs:
    prompt_tokens: int  # the rule-of-thumb estimate (chat/tokens.py CHARS)
    max_tokens: int | None  # as requested (max_tokens or max_completion_tokens)
    capabilities: frozenset[str]
    choices: int = 1  # ``n``: every choice may use the whole output cap
    body: dict | None = None  # the request, for tokenizer estimates per upstream model
    cache_marked: bool = False  # prompt-cache breakpoints (cache_control): an Anthropic provider may write the prompt
    cache_1h: bool = False  # one of them is for Anthropic's 1-hour cache (``ttl: "1h"``), whose writes cost more
    max_tokens_field: str = "max_tokens"  # the name the request gave its output cap (errors name it)
    stops: int = 0  # how many stop sequences (``stop``: a string is one)
    thinking: int | None = None  # the thinking budget asked for (``thinking_asked``), None: no thinking
    _estimates: dict[str, int] = field(default_factory=dict, repr=False)

    def prompt_tokens_for(self, offer: Offer) -> int:
        """Estimated input tokens at ``offer``'s upstream model (its tokenizer where known,
        see chat/tokens.py); computed once per estimator."""
        if self.body is None:
            return self.prompt_tokens
        how = tokens.estimator(offer.upstream_model)
        if how not in self._estimates:
            self._estimates[how] = tokens.estimate_prompt_tokens(self.body, how)
        return self._estimates[how]

    def max_cost_micros(self, offer: Offer, completion_tokens: int) -> int:
        """The most ``offer`` may cost for the prompt and ``completion_tokens`` (a hold's
        size): with cache breakpoints an Anthropic provider may bill the whole prompt as
        written to its cache (``cache_write_price``, or with a 1-hour breakpoint the 1-hour
        cache's), which may be above the input price."""
        prompt = self.prompt_tokens_for(offer)
        cost = offer.cost_micros(prompt, completion_tokens)
        if self.cache_marked and offer.provider.type == "anthropic":
            cost = max(cost, offer.cost_micros(prompt, completion_tokens, cache_write_tokens=prompt))
            if self.cache_1h:
                cost = max(cost, offer.cost_micros(prompt, completion_tokens, cache_write_tokens=prompt,
                                                   cache_write_1h_tokens=prompt))
        return cost


def _marked(obj) -> bool:
    return isinstance(obj, dict) and "cache_control" in obj


def _marked_1h(obj) -> bool:
    """A breakpoint for Anthropic's 1-hour cache (``providers.cache_mark`` carries its ``ttl``)."""
    return _marked(obj) and isinstance(obj["cache_control"], dict) and obj["cache_control"].get("ttl") == "1h"


def thinking_asked(body: dict) -> tuple[int | None, str | None]:
    """(thinking budget, reasoning effort) a request asks for, ``(None, None)`` for none:
    Anthropic's ``thinking`` (``{"type": "enabled", "budget_tokens": N}``, as the Messages API
    and LiteLLM send it) or OpenAI's ``reasoning_effort``, each stated in the other's terms
    by ``EFFORT_BUDGETS``; an effort it does not know (a newer one) keeps its name for
    OpenAI-compatible providers and is a ``medium`` budget for Anthropic ones."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled" \
            and isinstance(thinking.get("budget_tokens"), int) and not isinstance(thinking["budget_tokens"], bool):
        budget = thinking["budget_tokens"]
        effort = next((e for e in ("low", "medium") if budget <= EFFORT_BUDGETS[e]), "high")
        return budget, body.get("reasoning_effort") if isinstance(body.get("reasoning_effort"), str) else effort
    effort = body.get("reasoning_effort")
    if not isinstance(effort, str) or effort == "none":
        return None, None
    return EFFORT_BUDGETS.get(effort, EFFORT_BUDGETS["medium"]), effort


def analyse(body: dict) -> Needs:
    """Estimate prompt tokens and derive the capabilities a request needs."""
    caps = set()
    marks = []  # every object that may carry a cache breakpoint
    for msg in body["messages"]:
        content = msg.get("content")
        if isinstance(content, list) and any(  # images, and PDF files (read as pages of images)
                isinstance(p, dict) and p.get("type") in ("image_url", "input_image", "file") for p in content):
            caps.add("vision")
        marks += [msg, *(content if isinstance(content, list) else ())]
    if body.get("tools"):
        caps.add("tools")
        marks += body["tools"]
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
        caps.add("json_mode")
    if body.get("stream"):
        caps.add("streaming")
    field = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    stop = body.get("stop")
    return Needs(prompt_tokens=tokens.estimate_prompt_tokens(body, tokens.CHARS), max_tokens=body.get(field),
                 capabilities=frozenset(caps), choices=int(body.get("n") or 1), body=body,
                 cache_marked=any(_marked(m) for m in marks), cache_1h=any(_marked_1h(m) for m in marks),
                 max_tokens_field=field, thinking=thinking_asked(body)[0],
                 stops=len(stop) if isinstance(stop, list) else 1 if isinstance(stop, str) and stop else 0)


# --- routing ------------------------------------------------------------------------------

def output_cap(model: Model, needs: Needs) -> int:
    """Completion tokens the gateway holds for on ``model`` (and checks against its context
    window): the request's ``max_tokens`` (never above the model's maximum: a named model
    refuses more, ``auto`` routes only to models that allow it, see ``candidates``), else the
    bounded allowance ``CHAT_DEFAULT_HOLD_OUTPUT_TOKENS``, at most the model's maximum. What
    the provider is sent is ``completions._upstream_cap`` (the same when the request set one)."""
    cap = needs.max_tokens or min(int(current_app.config["CHAT_DEFAULT_HOLD_OUTPUT_TOKENS"]),
                                  int(current_app.config["CHAT_DEFAULT_MAX_TOKENS"]))
    return max(1, min(cap, model.max_output_tokens))


@dataclass(frozen=True)
class OwnKeys:
    """The caller's provider keys (bring your own key, ``app.services.chat.byok``):
    provider id → (provider key id, API key); ``only``: route to them alone
    (``byok_only``); ``fallback``: after them, the platform's offers (``byok_fallback``)."""

    keys: dict
    only: bool = False
    fallback: bool = False
    fee_pct: Decimal = Decimal(5)

    def offers(self, model: Model) -> list[Offer]:
        """``model``'s offers served with the caller's keys (any provider with a base URL:
        one the platform has no key for too)."""
        out = []
        for o in model.offers:
            mine = self.keys.get(o.provider.id)
            if mine is not None and o.provider.base_url:
                out.append(replace(o, provider=replace(o.provider, api_key=mine[1]), byok_key_id=mine[0],
                                   fee_pct=self.fee_pct))
        return out


def candidates(model_name: str, needs: Needs, *, sandbox: str | None = None, own: OwnKeys | None = None,
               allowed: frozenset[str] | None = None) -> list[Offer]:
    """Offers to try, in order. Named model: its enabled providers, cheapest first.
    ``auto``: every auto-eligible model whose context window fits and whose capabilities
    cover the request, all its enabled offers, cheapest estimated cost first.
    ``sandbox``: only that provider (test mode; a model it does not list is served by it
    under the catalog id at the model's primary prices). ``allowed``: the key's allow-list
    of models (``auto`` routes among them only). ``own``: the caller's provider keys: the
    offers they serve come first (charged the fee), the platform's follow only when there
    are none or ``own.fallback`` (never with ``own.only``)."""
    cat = catalog()
    if sandbox and not (sandbox in cat.providers and cat.providers[sandbox].enabled):
        raise ServiceUnavailable("Test-mode chat needs the sandbox provider "
                                 f"({sandbox}), which is not configured on this deployment.")
    if sandbox:
        own = None  # test mode reaches the sandbox provider only
    if model_name == "auto":
        models = cat.auto_models if allowed is None else tuple(m for m in cat.auto_models if m.id in allowed)
    else:
        model = cat.models.get(model_name)
        if model is None or (not model.enabled_offers() and not sandbox and not (own and own.offers(model))):
            raise ModelNotFound(f"The model {model_name!r} does not exist or is not available; "
                                "GET /v1/models lists the models.", param="model")
        if needs.max_tokens and needs.max_tokens > model.max_output_tokens:
            raise OutputLimitExceeded(needs.max_tokens_field, needs.max_tokens, model.max_output_tokens, model.id)
        models = [model]
    scored: list[tuple[int, int, Offer]] = []
    mine: list[tuple[int, int, Offer]] = []
    stops_refused = False  # an offer was passed over for its API's stop-sequence limit
    for i, model in enumerate(models):
        if model_name == "auto" and not fits(model, needs):
            continue
        out = output_cap(model, needs) * needs.choices
        if sandbox:
            if not any(_takes_stops(o, needs) for o in model.offers):
                stops_refused = True  # judged on its own providers: test mode refuses what live mode does
                continue
            offers = [o for o in model.offers if o.provider.id == sandbox]
            if not offers and sandbox in cat.providers and cat.providers[sandbox].enabled:
                p = model.primary
                offers = [Offer(model.id, cat.providers[sandbox], model.id, p.input_price, p.output_price,
                                reasoning="reasoning" in model.capabilities)]
            offers = [o for o in offers if o.provider.enabled and _answers(o, needs)]
        else:
            offers = model.enabled_offers() if own is None or not own.only else ()
            if own is not None:
                theirs, refused = _servable(own.offers(model), needs)
                stops_refused |= refused
                mine.extend((o.list_cost_micros(needs.prompt_tokens_for(o), out), i, o) for o in theirs)
            offers, refused = _servable(offers, needs)
            stops_refused |= refused
        for o in offers:
            scored.append((o.cost_micros(needs.prompt_tokens_for(o), out), i, o))
    if stops_refused and not scored and not mine:
        raise TooManyStopSequences(needs.stops, model_name)
    if own is not None and own.only and not mine:
        raise NoMatchingModel(f"This account routes only to its own provider keys (byok_only), and none of "
                              f"them ({', '.join(sorted(own.keys)) or 'none'}) serves {model_name!r} for this "
                              "request.", param="model")
    if mine and not own.fallback:
        scored = []  # no fallback to the platform's keys
    if not scored and not mine:
        if needs.choices > 1 and model_name != "auto" and needs.capabilities <= models[0].capabilities:
            raise NoMatchingModel(f"The model {model_name!r} does not support n > 1: its providers answer one "
                                  "choice per request (Anthropic's Messages API has no n).", param="n")
        if model_name == "auto":
            output = f", up to {needs.max_tokens} output tokens" if needs.max_tokens else ""
            raise NoMatchingModel(
                "No available model fits this request (context window "
                f"{needs.prompt_tokens} tokens estimated{output}, capabilities "
                f"{', '.join(sorted(needs.capabilities)) or 'none'}).", param="model")
        raise NoMatchingModel(f"The model {model_name!r} does not support: "
                              f"{', '.join(sorted(needs.capabilities))}.", param="model")
    if model_name != "auto":
        model = models[0]
        missing = needs.capabilities - model.capabilities
        if missing:
            raise NoMatchingModel(f"The model {model.id!r} does not support: {', '.join(sorted(missing))}.",
                                  param="model")
        prompt = needs.prompt_tokens_for(model.primary)
        if prompt + 1 > model.context_window:
            # worded as OpenAI words it: LiteLLM raises ContextWindowExceededError on it
            raise ContextLengthExceeded(f"This model's maximum context length is {model.context_window} "
                                        f"tokens; the request (about {prompt} tokens) exceeds the "
                                        f"context window of {model.id!r}.", param="messages")
    if needs.thinking and model_name == "auto":  # thinking asked: the models that can think, when any fits
        scored, mine = ([t for t in scored if t[2].reasoning] or scored), ([t for t in mine if t[2].reasoning] or mine)
    scored.sort(key=lambda t: (t[0], t[1]))
    mine.sort(key=lambda t: (t[0], t[1]))
    return [o for _, _, o in mine] + [o for _, _, o in scored]


def _takes_stops(offer: Offer, needs: Needs) -> bool:
    """Whether ``offer``'s API takes the request's stop sequences (``MAX_STOP_SEQUENCES``)."""
    return needs.stops <= MAX_STOP_SEQUENCES[offer.provider.type]


def _servable(offers, needs: Needs) -> tuple[list[Offer], bool]:
    """The ``offers`` whose API can serve the request (``_answers``, ``_takes_stops``), and
    whether one was passed over for its stop-sequence limit alone."""
    answering = [o for o in offers if _answers(o, needs)]
    taking = [o for o in answering if _takes_stops(o, needs)]
    return taking, len(taking) < len(answering)


def _answers(offer: Offer, needs: Needs) -> bool:
    """Whether ``offer`` returns as many choices as the request asks for (``n``): an
    Anthropic provider answers one (its Messages API has no ``n``)."""
    return needs.choices == 1 or offer.provider.type != "anthropic"


def fits(model: Model, needs: Needs) -> bool:
    """Whether ``auto`` may route to ``model``: it has the capabilities, allows the output
    the request asked for (``max_tokens`` at most its maximum: a model that cannot write the
    answer asked for does not fit, as a named one refuses it), and its window holds the prompt
    and that output."""
    if needs.capabilities - model.capabilities:
        return False
    if needs.max_tokens and needs.max_tokens > model.max_output_tokens:
        return False
    return needs.prompt_tokens_for(model.primary) + output_cap(model, needs) <= model.context_window


def reference_offer(model_name: str) -> Offer | None:
    """The savings reference: for ``auto``, CHAT_REFERENCE_MODEL's primary offer (or, when
    that model is not in the catalog, the primary offer with the highest output price);
    for a named model, its primary provider's list price."""
    cat = catalog()
    if model_name != "auto":
        model = cat.models.get(model_name)
        return model.primary if model else None
    key = current_app.config["CHAT_REFERENCE_MODEL"] or ""
    if key not in cat.references:
        ref = cat.models.get(key)
        primaries = [m.primary for m in cat.models.values()]
        cat.references[key] = ref.primary if ref is not None else (
            max(primaries, key=lambda o: (o.output_price, o.input_price)) if primaries else None)
    return cat.references[key]


def savings_pct(cost_micros: int, ref_micros: int) -> float:
    """``round(max(0, (ref - cost) / ref * 100), 2)``; 0 when the reference costs nothing."""
    if ref_micros <= 0:
        return 0.0
    return round(max(0.0, (ref_micros - cost_micros) / ref_micros * 100), 2)


def list_models() -> list[Model]:
    """Models with at least one enabled provider, in catalog order."""
    return [m for m in catalog().models.values() if m.enabled_offers()]
