"""Schemas of the MCP endpoint's request and of the discovery documents
(``app.services.gateway.discovery``)."""
import marshmallow as ma
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

from app.blueprints.fields import HeaderString, InputSchema, idempotency_key_header


class X402ResourceSchema(ma.Schema):
    """One paid module action, as the x402 Bazaar discovery API lists a resource."""

    resource = ma.fields.String(required=True, metadata={"description": "Absolute URL of the call (POST)."})
    type = ma.fields.String(required=True, metadata={"description": "`http`."})
    x402Version = ma.fields.Integer(required=True, metadata={"description": "2."})
    accepts = ma.fields.List(ma.fields.Dict(), required=True, metadata={
        "description": "x402 v2 `exact` payment requirements for the price, one per network (as in the 402's "
                       "`PAYMENT-REQUIRED`); empty when x402 is not offered (no pay-to address or facilitator)."})
    lastUpdated = ma.fields.String(required=True, metadata={"description": "When the module last changed (RFC 3339)."})
    description = ma.fields.String(required=True)
    mimeType = ma.fields.String(required=True)
    serviceName = ma.fields.String(required=True)
    tags = ma.fields.List(ma.fields.String(), required=True, metadata={"description": "The module slug."})
    extensions = ma.fields.Dict(required=True, metadata={
        "description": "`bazaar`: the Bazaar extension's `info` (input: a JSON POST body `{\"action\": …}`; "
                       "output: the call response's schema) and its JSON `schema`."})
    action = ma.fields.String(required=True)
    priceCents = ma.fields.Integer(required=True, metadata={"description": "Price per call in US cents."})
    mcpTool = ma.fields.String(required=True, metadata={"description": "The same action as an MCP tool at `/mcp`."})


class PaginationSchema(ma.Schema):
    limit = ma.fields.Integer(required=True)
    offset = ma.fields.Integer(required=True)
    total = ma.fields.Integer(required=True)


class McpLinkSchema(ma.Schema):
    url = ma.fields.String(required=True, metadata={"description": "The MCP endpoint (Streamable HTTP)."})
    serverCard = ma.fields.String(required=True)


class X402DiscoverySchema(ma.Schema):
    x402Version = ma.fields.Integer(required=True)
    items = ma.fields.List(ma.fields.Nested(X402ResourceSchema), required=True)
    pagination = ma.fields.Nested(PaginationSchema, required=True)
    mcp = ma.fields.Nested(McpLinkSchema, required=True)


class RemoteHeaderSchema(ma.Schema):
    name = ma.fields.String(required=True)
    description = ma.fields.String(required=True)
    isRequired = ma.fields.Boolean(required=True)
    isSecret = ma.fields.Boolean(required=True)


class RemoteSchema(ma.Schema):
    type = ma.fields.String(required=True, metadata={"description": "`streamable-http`."})
    url = ma.fields.String(required=True)
    supportedProtocolVersions = ma.fields.List(ma.fields.String(), required=True)
    headers = ma.fields.List(ma.fields.Nested(RemoteHeaderSchema), required=True)


class ServerCardSchema(ma.Schema):
    schema_ = ma.fields.String(required=True, data_key="$schema", attribute="$schema")
    name = ma.fields.String(required=True, metadata={"description": "Reverse-DNS name of the server."})
    title = ma.fields.String(required=True)
    description = ma.fields.String(required=True)
    version = ma.fields.String(required=True)
    websiteUrl = ma.fields.String(required=True)
    remotes = ma.fields.List(ma.fields.Nested(RemoteSchema), required=True)
    meta = ma.fields.Dict(required=True, data_key="_meta", attribute="_meta", metadata={
        "description": "`gateway/x402-discovery`, `gateway/modules`, `gateway/receipt-keys`, `gateway/docs`: "
                       "URLs; `gateway/instructions`: how tools are named and charged."})


# --- the MCP endpoint's request (validated before the SDK sees it: the input policy) ------

class McpMessageSchema(InputSchema):
    """A JSON-RPC 2.0 message of the Model Context Protocol (`initialize`, `tools/list`,
    `tools/call`, notifications, …). Only the envelope is checked here (`jsonrpc: "2.0"`; a
    request's `id` is a string or an integer); the MCP SDK reads the rest (a malformed MCP
    message is its JSON-RPC error)."""

    class Meta:
        unknown = ma.INCLUDE

    jsonrpc = ma.fields.String(required=True, validate=ma.validate.OneOf(["2.0"]),
                               metadata={"description": "`2.0`."})

    @ma.validates_schema
    def _request_id(self, data, **kwargs):
        """A request (``method`` with ``id``) has a string or integer id (MCP); the SDK would
        read any other as a notification and answer 202 with no body."""
        if "method" in data and "id" in data:
            rid = data["id"]
            if isinstance(rid, bool) or not isinstance(rid, (str, int)):
                raise ma.ValidationError("A request id is a string or an integer; leave id out for a "
                                         "notification.", "id")


class McpHeadersSchema(InputSchema):
    class Meta:
        unknown = ma.EXCLUDE

    accept = HeaderString(data_key="Accept", validate=ma.validate.Length(max=1000), metadata={
        "description": "Streamable HTTP asks clients to accept `application/json` and "
                       "`text/event-stream`; this endpoint answers `application/json` whatever "
                       "`Accept` says (it may be left out)."})
    mcp_protocol_version = HeaderString(
        data_key="MCP-Protocol-Version", validate=ma.validate.OneOf(list(KNOWN_PROTOCOL_VERSIONS)),
        metadata={"description": "The MCP protocol version of the request (after the handshake, or every "
                                 "request on 2026-07-28)."})
    idempotency_key = idempotency_key_header(
        "For a `tools/call`: the same as `_meta` `gateway/idempotency-key` (if both are sent they must "
        "match). The same key with the same call returns the stored result without a second charge.")
