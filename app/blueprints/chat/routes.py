"""OpenAI-compatible chat host (SPEC endpoint 34): ``POST /v1/chat/completions`` and
``GET /v1/models``. When ``CHAT_HOST`` is set these routes answer only on that host name
(any port); on other hosts they are 404 ``not_found``."""
import orjson
from functools import wraps

from flask import Response, current_app, g, jsonify, request, stream_with_context
from flask.views import MethodView

from app import cors
from app import auth
from app.auth import authenticated, controls_of, key_of, principal
from app.chathost import ANTHROPIC, on_chat_host, path_style
from app.jsonutil import INTEGER_RANGE_DOC
from app.blueprints.chat.schemas import (AnthropicHeadersSchema, AnthropicModelListSchema, AnthropicModelSchema,
                                         ChatCompletionSchema, ChatRequestSchema, CountTokensRequestSchema,
                                         MessageSchema, MessagesRequestSchema, MessageTokensCountSchema,
                                         ModelListArgsSchema, ModelListSchema, ModelSchema)
from app.errors import AnthropicErrorSchema, ErrorSchema, NotFound
from app.blueprints.fields import PAYMENT_REQUIRED_HEADERS, PAYMENT_RESPONSE_HEADERS, X402_UNAVAILABLE_DOC
from app.blueprints.gateway.schemas import PaymentHeadersSchema
from app.blueprints.routing import document_errors
from app.extensions import Blueprint
from app.services.chat import byok as byok_keys
from app.services.chat import completions as chat
from app.services.chat import messages

blp = Blueprint("chat", __name__, url_prefix="/v1", description=(
    "OpenAI-compatible chat completions on the chat host: cheapest-model routing (`model: auto`), "
    "failover between providers, exact cost and savings in `usage`. Errors are OpenAI's "
    "`{error: {message, type, code, param}, request_id}` (`code`: the gateway's error code)."))


@blp.before_request
def _only_on_chat_host():
    if not on_chat_host(request.host, current_app.config.get("CHAT_HOST")):
        raise NotFound("The requested URL was not found on the server.")
    return None


# CORS on the chat host (``CHAT_CORS_ORIGINS``, default none): browsers may call every
# chat route and read the cost, request-id, rate-limit and x402 headers.
CORS_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Request-Id, x-api-key, "
                                    "anthropic-version, anthropic-beta",
    "Access-Control-Expose-Headers": "X-Request-Id, request-id, X-Gateway-Cost-Micros, X-Gateway-Savings-Pct, "
                                     "X-Gateway-Overhead-Ms, X-Chat-Provider, X-Chat-Model, X-Chat-Attempts, "
                                     "X-Chat-Completion-Id, X-Chat-Cost-Micros, Retry-After, RateLimit-Limit, "
                                     "RateLimit-Remaining, RateLimit-Reset, PAYMENT-REQUIRED, PAYMENT-RESPONSE, "
                                     "X-PAYMENT-RESPONSE, X-Price-Micros, X-Price-Cents",
    "Access-Control-Max-Age": "600",
}


@blp.after_request
def _cors(response):
    """CORS headers on the chat host's answers, preflights and errors included
    (``app.cors``, the mechanism ``/api/track`` uses too); Anthropic's ``request-id`` on
    ``/v1/messages`` and under it (``/v1/messages/count_tokens``)."""
    if not on_chat_host(request.host, current_app.config.get("CHAT_HOST")):
        return response
    if path_style(request.path) == ANTHROPIC and g.get("request_id"):
        response.headers["request-id"] = g.request_id  # Anthropic's header (its SDK's ``request_id``)
    return cors.apply(response, current_app.config.get("CHAT_CORS_ORIGINS"), CORS_HEADERS,
                      reflect_request_headers=True)


def _response(result: chat.ChatResult) -> Response:
    """The HTTP response of a completion: ``text/event-stream`` relayed as it is produced
    (not buffered by nginx), or the JSON body as the service built it (OpenAI's exact
    shape, passed through without re-validation); plus the ``X-Chat-*`` headers."""
    if result.events is not None:
        resp = Response(stream_with_context(result.events()), mimetype="text/event-stream")
        resp.headers["Cache-Control"] = "no-cache"
        resp.headers["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    else:
        resp = Response(orjson.dumps(result.body), mimetype="application/json")
    resp.headers.update(result.headers)
    return resp


@blp.route("/chat/completions")
class ChatCompletionsView(MethodView):
    @authenticated("call:write")
    @blp.arguments(PaymentHeadersSchema, location="headers", as_kwargs=True)
    @blp.arguments(ChatRequestSchema)
    @blp.response(200, ChatCompletionSchema, description=(
        "A chat completion, or with `stream: true` a `text/event-stream` of `chat.completion.chunk` "
        "objects ending with the chunk carrying the usage and `data: [DONE]`. Headers: `X-Chat-Provider`, "
        "`X-Chat-Model`, `X-Chat-Attempts`, `X-Chat-Completion-Id`, `X-Gateway-Overhead-Ms` (the gateway's added "
        "latency; for a stream: up to its first event); non-streaming also `X-Chat-Cost-Micros`, "
        "`X-Gateway-Cost-Micros` and `X-Gateway-Savings-Pct` (a stream's cost is in its final usage chunk); "
        "`PAYMENT-RESPONSE` when paid by x402."), headers=PAYMENT_RESPONSE_HEADERS)
    @blp.doc(responses={200: {"content": {"text/event-stream": {"schema": {
        "type": "string", "description": "`data: <chat.completion.chunk JSON>` events; the last chunk "
        "carries the `usage` (with cost): with `stream_options.include_usage` an extra chunk with empty "
        "`choices` (OpenAI's), else the chunk with the `finish_reason`; then `data: [DONE]`."}}}}})
    @document_errors(blp, {
        400: "`invalid_request`, or `invalid_payment` (the X-Payment / PAYMENT-SIGNATURE header is not "
             "base64/base64url JSON of an x402 exact EVM payload). Also, by OpenAI's convention (its clients "
             "read a 400 `invalid_request_error` as `BadRequestError`), for a schema-valid request no model "
             "serves: `no_matching_model` (`model: auto` with no model whose capabilities and context window "
             "fit, or none of the account's own keys with `byok_only`; `n` > 1 for a model only Anthropic "
             "providers serve, `param: n`; more `stop` sequences than any candidate takes — OpenAI-compatible "
             "providers at most 4, Anthropic's 16 — `param: stop`, before any hold), `context_length_exceeded`; "
             "`invalid_request` with `param` "
             "`max_tokens` / `max_completion_tokens` for an output cap above the named model's "
             "`max_output_tokens` (OpenAI's `max_tokens is too large`).",
        402: ("`payment_required`: the balance cannot cover the estimated maximum cost (the hold). Same "
              "body and headers as a module call's 402 (`X-Price-Cents` is the hold rounded up to cents; "
              "`X-Price-Micros` the exact hold; `PAYMENT-REQUIRED` asks for the rounded-up hold). "
              "`payment_invalid`: the x402 payment was refused (`reason` as for a module call); "
              "nothing was credited.", PAYMENT_REQUIRED_HEADERS),
        404: "`model_not_found` (off the chat host: the gateway's plain 404 `{error, message, request_id}`).",
        422: INTEGER_RANGE_DOC,
        502: "`provider_error`: every candidate failed; nothing charged.",
        503: X402_UNAVAILABLE_DOC,
        504: "`provider_timeout`: every candidate timed out; nothing charged."}, schema=ErrorSchema)
    def post(self, body, x_payment=None, payment_signature=None):
        """Create a chat completion (OpenAI's request and response shapes).

        `model: auto` picks the cheapest model whose context window fits and whose capabilities
        cover the request; a named model goes to its providers, cheapest first. Failover on
        connection errors, timeouts, 429 and 5xx before the first byte is sent. The estimated
        maximum is held on the balance before the call and settled to the exact cost after.

        x402: when the balance cannot cover the hold, a `PAYMENT-SIGNATURE` (or `X-Payment`)
        header paying the amount the 402 asked for is settled and credited to the balance, then
        the hold is taken and settled as usual: the unspent part stays in the balance, and a
        failed completion releases the whole hold to it. The answer carries `PAYMENT-RESPONSE`.
        """
        p = principal()
        return _response(chat.create_completion(p.account_id, p.mode, body, key_id=key_of(p),
                                                actor=p.credential_id, payment=payment_signature or x_payment,
                                                controls=controls_of(p), byok=bool(p.extra.get("byok"))))


def _x_api_key(view):
    """Anthropic's credential header: ``x-api-key: svc_…`` authenticates like
    ``Authorization: Bearer svc_…`` (which wins when both are sent)."""
    @wraps(view)
    def wrapper(*args, **kwargs):
        key = request.headers.get("x-api-key")
        if key and "principal" not in g and not request.headers.get("Authorization"):
            g.principal = auth.authenticate(key.strip())
            g.account_id = g.principal.account_id
        return view(*args, **kwargs)
    return wrapper


# Either credential on the model list too: the anthropic SDK lists models (models.list,
# models.retrieve) with its x-api-key header, as it calls /v1/messages.
EITHER_CREDENTIAL = [{auth.SECURITY_SCHEME: ["call:write"]}, {auth.API_KEY_HEADER_SCHEME: ["call:write"]}]


def _either_shape(openai_schema, anthropic_schema) -> dict:
    """The 200 of a model route: OpenAI's shape, or Anthropic's with ``anthropic-version``."""
    return {200: {"content": {"application/json": {"schema": {"oneOf": [openai_schema, anthropic_schema]}}}}}


@blp.route("/models")
class ModelsView(MethodView):
    @blp.doc(security=EITHER_CREDENTIAL)
    @_x_api_key
    @authenticated("call:write")
    @blp.arguments(AnthropicHeadersSchema, location="headers", as_kwargs=True)
    @blp.arguments(ModelListArgsSchema, location="query", as_kwargs=True)
    @blp.response(200, ModelListSchema)
    @blp.doc(responses=_either_shape(ModelListSchema, AnthropicModelListSchema))
    @blp.alt_response(404, schema=ErrorSchema, description=(
        "`model_not_found`: with `anthropic-version`, an `after_id` or `before_id` that is not a model of the list."))
    def get(self, anthropic_version=None, limit=20, after_id=None, before_id=None):
        """List the available models (plus `auto`), with context window, capabilities and
        per-million-token prices: the platform's and, for an account with provider keys of
        its own (live keys), the models they serve (only those with `byok_only`); for a key
        with a model allow-list (`allowed_models`), only those models.

        OpenAI's list (`object`, `data`), or, when the request carries `anthropic-version` (the
        anthropic SDK's `models.list`), Anthropic's: model objects with `type`, `display_name`,
        `created_at`, `max_input_tokens`, `max_tokens`, paged by `limit`, `after_id` and
        `before_id`."""
        entries = chat.models(controls_of(principal()), _own(principal()))
        if anthropic_version is not None:
            return jsonify(messages.anthropic_models(entries, limit, after_id, before_id))
        return {"object": "list", "data": entries}


@blp.route("/models/<string:model_id>")
class ModelView(MethodView):
    @blp.doc(security=EITHER_CREDENTIAL)
    @_x_api_key
    @authenticated("call:write")
    @blp.arguments(AnthropicHeadersSchema, location="headers", as_kwargs=True)
    @blp.response(200, ModelSchema)
    @blp.doc(responses=_either_shape(ModelSchema, AnthropicModelSchema))
    @blp.alt_response(404, schema=ErrorSchema, description="`model_not_found`")
    def get(self, model_id, anthropic_version=None):
        """One model of `GET /v1/models` (OpenAI's `models.retrieve`, or with
        `anthropic-version` Anthropic's): 404 for a model outside the key's allow-list too."""
        entry = chat.get_model(model_id, controls_of(principal()), _own(principal()))
        return jsonify(messages.anthropic_model(entry)) if anthropic_version is not None else entry


def _own(p):
    """The account's own provider keys when a completion of ``p`` would use them (a live
    key of an account that has some; ``create_completion``'s ``byok``), else None."""
    return byok_keys.own_keys(p.account_id, unseal=False) if p.extra.get("byok") and p.mode == "live" else None


@blp.route("/messages")
class MessagesView(MethodView):
    # either credential: the bearer, or Anthropic's x-api-key header (what its SDK sends)
    @blp.doc(security=EITHER_CREDENTIAL)
    @_x_api_key
    @authenticated("call:write")
    @blp.arguments(PaymentHeadersSchema, location="headers", as_kwargs=True)
    @blp.arguments(MessagesRequestSchema)
    @blp.response(200, MessageSchema, description=(
        "Anthropic's message object, or with `stream: true` Anthropic's `text/event-stream`. "
        "Headers as for `POST /v1/chat/completions`; `PAYMENT-RESPONSE` when paid by x402."),
        headers=PAYMENT_RESPONSE_HEADERS)
    @blp.doc(responses={200: {"content": {"text/event-stream": {"schema": {
        "type": "string", "description": "`message_start` (the prompt's tokens: the provider's count, or the "
        "gateway's estimate when the provider counts only at the end), `ping`, `content_block_start` / "
        "`content_block_delta` / `content_block_stop`, `message_delta` (stop reason, the cumulative usage "
        "that was billed, with cost), `message_stop`."}}}}})
    @document_errors(blp, {
        400: "`invalid_request_error`: a body outside the document (which states the content blocks each "
             "turn takes: text; image, document and tool_result in user turns; tool_use, thinking and "
             "redacted_thinking in assistant turns); and, by "
             "Anthropic's convention (its clients read a 400 as `BadRequestError`), a schema-valid request no "
             "model serves (`no_matching_model`: `model: auto` with no fitting model; more than 4 "
             "`stop_sequences` when no candidate is an Anthropic provider, before any hold; "
             "`context_length_exceeded`; `invalid_request` for a `thinking.budget_tokens` not below "
             "`max_tokens`, as Anthropic refuses it; a `max_tokens` above the named model's maximum output, in "
             "Anthropic's words: `max_tokens: N > M, which is the maximum allowed number of output tokens "
             "for <model>`).",
        402: ("`payment_required`: the balance cannot cover the hold (`billing_error`); pay it by x402 as for "
              "`POST /v1/chat/completions`. `payment_invalid`: the x402 payment was refused; nothing was "
              "credited.", PAYMENT_REQUIRED_HEADERS),
        404: "`model_not_found`.",
        422: INTEGER_RANGE_DOC,
        502: "`provider_error`: every candidate failed; nothing charged.",
        503: X402_UNAVAILABLE_DOC,
        504: "`provider_timeout`: every candidate timed out; nothing charged."}, schema=AnthropicErrorSchema)
    def post(self, body, x_payment=None, payment_signature=None):
        """Create a message (Anthropic's Messages API: request, response, streaming events and
        errors), over the same routing, failover, holds and settlement as chat completions.

        Authenticate with `x-api-key` or `Authorization: Bearer`; `anthropic-version` is
        accepted. `model: auto` picks the cheapest model that fits. x402: as for chat
        completions, a `PAYMENT-SIGNATURE` (or `X-Payment`) header pays the hold the 402 asked for.
        """
        p = principal()
        return _response(messages.create_message(p.account_id, p.mode, body, key_id=key_of(p),
                                                    actor=p.credential_id, controls=controls_of(p),
                                                    byok=bool(p.extra.get("byok")),
                                                    payment=payment_signature or x_payment))


@blp.route("/messages/count_tokens")
class CountTokensView(MethodView):
    @blp.doc(security=[{auth.SECURITY_SCHEME: ["call:write"]}, {auth.API_KEY_HEADER_SCHEME: ["call:write"]}])
    @_x_api_key
    @authenticated("call:write")
    @blp.arguments(CountTokensRequestSchema)
    @blp.response(200, MessageTokensCountSchema, description=(
        "`{\"input_tokens\": N}`: the gateway's estimate of the prompt, as it sizes a hold (free: nothing is "
        "held or charged)."))
    @document_errors(blp, {
        400: "`invalid_request_error`: a body outside the document (the content blocks each turn takes, as "
             "for `POST /v1/messages`); and, by Anthropic's convention, a schema-valid request no model "
             "serves (`no_matching_model`, `context_length_exceeded`), as `POST /v1/messages` refuses it.",
        404: "`model_not_found`.",
        422: INTEGER_RANGE_DOC}, schema=AnthropicErrorSchema)
    def post(self, body):
        """Count the input tokens of a message (Anthropic's `messages.count_tokens`), free.

        The Messages request without `max_tokens`; the answer is the gateway's own estimate of
        the prompt's input tokens (system, messages, tools) at the providers that would serve
        it, the number a `POST /v1/messages` with this prompt sizes its hold with. Providers
        count slightly differently: a message's `usage` reports theirs. Authenticated as
        `POST /v1/messages` (`x-api-key` or bearer, the key's `allowed_models`: 403
        `model_not_allowed`); counted by the plan's rate limit, not by the key's rpm or tpm.
        """
        p = principal()
        return messages.count_tokens(p.account_id, p.mode, body, controls=controls_of(p),
                                     byok=bool(p.extra.get("byok")))
