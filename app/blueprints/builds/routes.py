"""Admin review of agent-built modules (the API twin of ``flask modules …``)."""
from flask.views import MethodView

from app.auth import authenticated, principal
from app.blueprints.builds.schemas import (ApproveSchema, PendingListSchema, RejectSchema,
                                           ReviewBuildSchema)
from app.extensions import Blueprint
from app.services.agents import builds

blp = Blueprint("review", __name__, url_prefix="/api/admin/modules",
                description="Admin only: review agent-built module submissions.")


@blp.route("/pending")
class PendingView(MethodView):
    @authenticated(admin=True)
    @blp.response(200, PendingListSchema)
    def get(self):
        """Submissions waiting for review, oldest first."""
        return {"pending": builds.pending()}


@blp.route("/<string:slug>/approve")
class ApproveView(MethodView):
    @authenticated(admin=True)
    @blp.arguments(ApproveSchema)
    @blp.response(200, ReviewBuildSchema)
    @blp.alt_response(404, response="NOT_FOUND", description="No submission for this slug is pending.")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, body, slug):
        """Approve the pending submission for `slug`: the module is listed and callable at
        once, owned by the submitting agent; the agent gets a `module.approved` event."""
        return builds.approve(slug, reviewer=f"api:{principal().account_id}", notes=body["notes"])


@blp.route("/<string:slug>/reject")
class RejectView(MethodView):
    @authenticated(admin=True)
    @blp.arguments(RejectSchema)
    @blp.response(200, ReviewBuildSchema)
    @blp.alt_response(404, response="NOT_FOUND", description="No submission for this slug is pending.")
    def post(self, body, slug):
        """Reject the pending submission for `slug` with a `reason` (shown to the agent as
        `review_notes`; `module.rejected` event)."""
        return builds.reject(slug, reviewer=f"api:{principal().account_id}", reason=body["reason"])
