"""Product analytics (SPEC endpoints 27–30), with CORS on ``/api/track`` for browsers."""
from functools import wraps

from flask import current_app, request
from flask.views import MethodView

from app import cors
from app.auth import bearer_token, current_principal, principal, public
from app.jsonutil import INTEGER_RANGE_DOC
from app.blueprints.tracking.schemas import (FunnelQuerySchema, FunnelSchema, RecentSchema,
                                             SessionsSchema, TrackEventSchema)
from app.errors import Forbidden, Unauthorized
from app.blueprints.routing import document_errors, endpoint
from app.extensions import Blueprint
from app.ratelimits import per_ip
from app.services.public import tracking

blp = Blueprint("tracking", __name__, url_prefix="/api/track",
                description="Product analytics: event ingestion, funnel, recent events, sessions.")

TRACK_ENDPOINT = "tracking.TrackView"
cors.public_endpoints(blp, TRACK_ENDPOINT)


def _body_limit(config_name: str):
    """Cap this route's request body at ``config[config_name]`` bytes (413 above), and
    read a ``text/plain`` body as JSON: ``navigator.sendBeacon`` sends text/plain so that
    no CORS preflight is needed."""
    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            request.max_content_length = int(current_app.config[config_name])
            if request.mimetype == "text/plain":
                request.environ["CONTENT_TYPE"] = "application/json"
                request.__dict__.pop("_parsed_content_type", None)
            return func(*args, **kwargs)
        return wrapper
    return decorator


def _caller_account() -> str | None:
    """Account to attribute an event to: none without a credential (no lookup at all);
    a sent but invalid credential is 401 rather than silently dropped."""
    if request.headers.get("Authorization") is None:
        return None
    p = current_principal(optional=True)
    if p is None:
        raise Unauthorized("Invalid, expired or revoked credential (omit it to track anonymously)."
                           if bearer_token() else "Malformed Authorization header.")
    return p.account_id


@blp.route("", endpoint="TrackView")
class TrackView(MethodView):
    @public
    @per_ip("TRACK_RATE_LIMIT")
    @_body_limit("TRACK_MAX_BODY_BYTES")
    @blp.arguments(TrackEventSchema)
    @blp.response(204, description="Accepted; no body.")
    @document_errors(blp, {401: "A credential was sent and is invalid.",
                           413: "Body above `TRACK_MAX_BODY_BYTES` (8 KiB).",
                           422: f"`{tracking.PROPS_TOO_LARGE}` Or: {INTEGER_RANGE_DOC}",
                           429: "Per-IP limit `TRACK_RATE_LIMIT`."})
    def post(self, body):
        """Record a product-analytics event (no credential needed).

        With a valid `Authorization: Bearer …` the event is attributed to that account
        (its funnel). CORS: allowed origins from `CORS_ORIGINS`."""
        tracking.record(body["event"], body.get("session_id"), body.get("props"),
                        _caller_account())


@endpoint(blp, "/funnel", "get", "analytics:read", query=FunnelQuerySchema, ok=FunnelSchema)
def funnel(query):
    """Funnel over the last 7 days: sessions reaching each configured step
    (`FUNNEL_STEPS`) in order. Accounts see their attributed events; admins see
    every event by default (`?scope=account` for their own)."""
    p = principal()
    scope = query.get("scope") or ("global" if p.is_admin else "account")
    if scope == "global" and not p.is_admin:
        raise Forbidden("The global funnel is for admin accounts only.")
    return tracking.funnel(None if scope == "global" else p.account_id)


@endpoint(blp, "/recent", "get", "analytics:read", admin=True, ok=RecentSchema)
def recent():
    """The last 200 events of every account, newest first (admin only)."""
    return {"events": tracking.recent()}


@endpoint(blp, "/sessions", "get", "analytics:read", admin=True, ok=SessionsSchema)
def sessions():
    """Sessions active in the last hour with first/last seen and event count (admin only)."""
    return {"sessions": tracking.active_sessions()}
