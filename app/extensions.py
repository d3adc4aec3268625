"""Extensions: db, migrate, the flask-smorest Api and the Redis handle."""
from __future__ import annotations

import re
import threading

import marshmallow
import orjson
import redis as redis_lib
from apispec import BasePlugin
from flask import current_app
from flask_migrate import Migrate
from flask_smorest import Api as _SmorestApi
from flask_smorest import Blueprint as _SmorestBlueprint
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import MetaData
from sqlalchemy import text as sa_text
from sqlalchemy.orm import DeclarativeBase
from webargs.core import missing as core_missing
from webargs.flaskparser import FlaskParser
from webargs.flaskparser import abort as webargs_abort

from app import jsonutil
from app.errors import ErrorSchema, InvalidRequest, Unprocessable, handle_http_exception

# Stable constraint names, so Alembic migrations name every constraint the same way.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


db = SQLAlchemy(model_class=Base)
migrate = Migrate()


class _Parser(FlaskParser):
    """webargs parser whose validation failures are 400 (not 422), per DESIGN §4, and whose
    JSON bodies are read with orjson (``load_json``, webargs' public location loader)."""

    DEFAULT_VALIDATION_STATUS = 400

    def load_json(self, req, schema):
        # orjson: fast, and bounded nesting depth (deep JSON is a 400, not a RecursionError).
        if not req.is_json:
            if req.content_length or req.headers.get("Transfer-Encoding"):
                # a body under another media type: say so, rather than "missing data" for the
                # body's required fields (webargs reads such a body as no body at all)
                raise InvalidRequest("The request body must be JSON (Content-Type: application/json).")
            return core_missing
        data = req.get_data(cache=True)
        if not data:
            return core_missing  # no body at all (webargs: "missing", as for an empty document)
        try:
            return jsonutil.loads(data)
        except jsonutil.IntegerOutOfRange as exc:
            # well-formed JSON and valid by the document, but not a value the service can
            # pass on exactly: 422, a rule the schema cannot state (docs/decisions.md)
            raise Unprocessable(exc.msg) from None
        except orjson.JSONDecodeError as exc:
            # Always a 400 for a body that is there, bytes that are not UTF-8 included
            # (webargs' own loader reads an empty decode error as "no body").
            webargs_abort(400, exc=exc, messages={"json": ["Invalid JSON body."]})


class Blueprint(_SmorestBlueprint):
    """Project blueprint: arguments validate with 400 ``invalid_request``."""

    ARGUMENTS_PARSER = _Parser()


class Api(_SmorestApi):
    """flask-smorest Api whose error payload and documented errors follow DESIGN §4."""

    ERROR_SCHEMA = ErrorSchema

    def handle_http_exception(self, error):  # noqa: D401 - smorest hook
        return handle_http_exception(error)


class SchemaKeywords(BasePlugin):
    """Object-level JSON Schema keywords of a marshmallow schema in the OpenAPI document:
    ``class Meta: json_schema = {"minProperties": 1}`` (apispec emits field-level keywords
    from field metadata only). For constraints between fields that the server enforces
    exactly as written, so that a schema-valid request is not refused (the fuzz run's
    ``positive_data_acceptance``)."""

    def schema_helper(self, name, definition, **kwargs):
        schema = kwargs.get("schema")
        cls = schema if isinstance(schema, type) else type(schema)
        extra = getattr(getattr(cls, "Meta", None), "json_schema", None)
        return dict(extra) if extra else None


class BodyLimit(BasePlugin):
    """413 ``payload_too_large`` on every operation that reads a request body: Flask refuses
    a body over ``MAX_CONTENT_LENGTH`` (``MAX_BODY_BYTES``) on all of them while reading it,
    before the path's ids are looked up, and on no other. An operation that documents its
    own 413 (a tighter limit) keeps its text. Runs before ``ProviderErrors``, which gives
    the chat host's 413 its provider's schema."""

    DESCRIPTION = "`payload_too_large`: the body is over `MAX_BODY_BYTES` (1 MiB by default)."

    def operation_helper(self, path=None, operations=None, **kwargs):
        for operation in (operations or {}).values():
            responses = operation.get("responses")
            if "requestBody" in operation and isinstance(responses, dict) \
                    and not ({413, "413"} & set(responses)):
                responses[413] = {"description": self.DESCRIPTION, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


class ProviderErrors(BasePlugin):
    """The chat host's and the MCP endpoint's error responses in the OpenAPI document: on the
    paths that speak another error convention (``app.chathost.path_style``) every error
    response (4xx, 5xx, ``default``, named or inline) is declared with that convention's
    schema (``OpenAIError`` / ``AnthropicError``, DESIGN §4; ``McpError``, a JSON-RPC
    error), its description and headers kept."""

    _SCHEMAS = {"openai": "OpenAIError", "anthropic": "AnthropicError", "mcp": "McpError"}

    def init_spec(self, spec):
        super().init_spec(spec)
        self.spec = spec

    def operation_helper(self, path=None, operations=None, **kwargs):
        from app.chathost import GATEWAY, path_style
        from app.errors import AnthropicErrorSchema, McpErrorSchema, OpenAIErrorSchema

        style = path_style(re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", path or ""))
        if style == GATEWAY:
            return
        schemas = self.spec.components.schemas
        if "OpenAIError" not in schemas:
            self.spec.components.schema("OpenAIError", schema=OpenAIErrorSchema)
            self.spec.components.schema("AnthropicError", schema=AnthropicErrorSchema)
            self.spec.components.schema("McpError", schema=McpErrorSchema)
        named = self.spec.components.responses
        content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{self._SCHEMAS[style]}"}}}
        for operation in (operations or {}).values():
            responses = operation.get("responses") or {}
            for status, response in list(responses.items()):
                if str(status) != "default" and int(status) < 400:
                    continue
                if isinstance(response, dict) and "$ref" in response:
                    response = response["$ref"].rsplit("/", 1)[-1]
                if isinstance(response, str):  # a named response (UNAUTHORIZED …): its text
                    response = dict(named.get(response) or {"description": response})
                responses[status] = {**response, "content": content}


class RateLimitHeaders(BasePlugin):
    """The headers every 429 carries (``app.ratelimits``, ``accounts.key_controls``) on every
    429 of the document: the named response and those declared inline (a route's own
    text, the chat host's error schemas). Runs after ``ProviderErrors``."""

    HEADERS = {
        "Retry-After": {"description": "Seconds until the refused window has room again.",
                        "schema": {"type": "integer", "minimum": 1}},
        "RateLimit-Limit": {"description": "Requests the refused window allows.",
                            "schema": {"type": "integer", "minimum": 0}},
        "RateLimit-Remaining": {"description": "`0`.", "schema": {"type": "integer", "minimum": 0}},
        "RateLimit-Reset": {"description": "Seconds until the window resets.",
                            "schema": {"type": "integer", "minimum": 0}},
    }

    def init_spec(self, spec):
        super().init_spec(spec)
        self.spec = spec

    def operation_helper(self, path=None, operations=None, **kwargs):
        named = self.spec.components.responses.get("TOO_MANY_REQUESTS")
        if isinstance(named, dict):
            named.setdefault("headers", dict(self.HEADERS))
        for operation in (operations or {}).values():
            responses = operation.get("responses") or {}
            for status in (429, "429"):
                response = responses.get(status)
                if isinstance(response, dict) and "$ref" not in response:
                    response["headers"] = {**self.HEADERS, **(response.get("headers") or {})}


class OperationIds(BasePlugin):
    """Each operation's ``operationId`` from ``app.operation_ids.OPERATION_IDS`` (the route's
    endpoint and method; the naming rule is there). A route with no entry gets none, and
    ``tests/test_openapi.py`` fails naming it and that file."""

    def operation_helper(self, path=None, operations=None, **kwargs):
        from app.operation_ids import OPERATION_IDS

        endpoint = getattr(kwargs.get("rule"), "endpoint", None)
        for method, operation in (operations or {}).items():
            name = OPERATION_IDS.get((endpoint, method.upper()))
            if name and isinstance(operation, dict):
                operation["operationId"] = name


def make_api() -> Api:
    """A new ``Api`` for one app (``create_app``). flask-smorest keeps the app it was given
    and the spec it serves on the ``Api`` object itself (``init_app`` replaces both), and the
    plugins keep the spec they were given: one module-level ``Api`` shared by several apps in
    a process (the tests' apps, the bench's) served the last app's document from every app.
    So every app gets its own, plugins included."""
    api = Api(spec_kwargs={
        "extra_plugins": [SchemaKeywords(), BodyLimit(), ProviderErrors(), RateLimitHeaders(),
                          OperationIds()],
        "info": {
            "description": (
                "Metered API gateway: call catalog modules with one key, pay per call from a "
                "prepaid balance or with x402 USDC payments, and get a signed receipt for every call. "
                "Errors are always JSON `{error, message, request_id}`; the stable codes are listed "
                "in `x-error-codes`."
            ),
        },
    })
    # JSON Schema's name for a URL is ``uri`` (apispec writes marshmallow's ``Url`` as ``url``,
    # a format no validator or client generator knows).
    api.register_field(marshmallow.fields.Url, "string", "uri")
    return api


def api_of(app) -> Api:
    """The ``Api`` of ``app`` (``make_api``, registered by ``init_app``)."""
    return app.extensions["flask-smorest"]["apis"][""]["ext_obj"]


_redis_lock = threading.Lock()
_redis_clients: dict[str, redis_lib.Redis] = {}


def get_redis() -> redis_lib.Redis | None:
    """The shared Redis client for REDIS_URL, or None in the embedded default."""
    return redis_for(current_app.config.get("REDIS_URL") or "")


def redis_key(*parts: str, app=None) -> str:
    """A key of this deployment in Redis: ``RATELIMIT_KEY_PREFIX`` (default ``gw``), then
    ``parts``, joined by ``:``. Every key the app keeps there is named so, so two deployments
    sharing one Redis (with two prefixes) never read or claim each other's."""
    cfg = (app or current_app).config
    return ":".join((cfg.get("RATELIMIT_KEY_PREFIX") or "gw", *parts))


def redis_for(url: str) -> redis_lib.Redis | None:
    """The process-wide Redis client for a ``redis://`` / ``rediss://`` / ``unix://`` URL
    (one connection pool per URL), or None for anything else (e.g. ``memory://``)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    client = _redis_clients.get(url)
    if client is None:
        with _redis_lock:
            client = _redis_clients.get(url)
            if client is None:
                client = redis_lib.Redis.from_url(
                    url, socket_timeout=2, socket_connect_timeout=2, health_check_interval=30
                )
                _redis_clients[url] = client
    return client


def skip_commit_flush() -> None:
    """Let the current transaction's COMMIT return without waiting for the WAL flush
    (PostgreSQL ``SET LOCAL synchronous_commit = off``; nothing elsewhere).

    Only for a transaction that is always followed, before any answer leaves the
    process, by a durable commit on the same server (e.g. a call's finalize): PostgreSQL
    flushes the WAL in order, so that durable commit also makes this one durable. Losing
    it in a crash in between loses only a transaction nobody has been told about.
    Callers state why that is harmless for them."""
    db.session.execute(_ASYNC_COMMIT)


_ASYNC_COMMIT = sa_text("SET LOCAL synchronous_commit = off")
