"""Benchmark baseline: a bare forwarding route (no auth, metering or receipts).

Registered ONLY when ``BENCH_PASSTHROUGH=1`` (``make bench`` sets it for its own gunicorn);
it never exists in a normal run. It measures what this stack (gunicorn gthread + Flask +
a pooled ``requests`` session) costs by itself, so ``bench/`` can report the metered call
as a ratio against it. The upstream is fixed by ``BENCH_UPSTREAM_URL`` and must be a
loopback address, so the route can never be used as an open proxy.
"""
from flask import Response, request
from flask.views import MethodView

from app.auth import public
from app.blueprints.bench.schemas import PassthroughResultSchema
from app.extensions import Blueprint
from app.services import passthrough

blp = Blueprint("bench", __name__, url_prefix="/bench",
                description="Benchmark-only baseline (exists only when BENCH_PASSTHROUGH=1).")


@blp.route("/passthrough")
class PassthroughView(MethodView):
    @public
    @blp.response(200, PassthroughResultSchema)
    def post(self):
        """Forward the raw request body to the bench upstream and return its answer
        unchanged. Benchmark baseline only: absent unless the server was started with
        `BENCH_PASSTHROUGH=1`."""
        status, body, content_type = passthrough.forward(request.get_data())
        return Response(body, status=status, content_type=content_type)
