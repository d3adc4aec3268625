"""Admin review of agent-built modules (the API twin of ``flask modules …``)."""
from app.auth import principal
from app.blueprints.builds.schemas import (ApproveSchema, PendingListSchema, RejectSchema,
                                           ReviewBuildSchema)
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.agents import builds

blp = Blueprint("review", __name__, url_prefix="/api/admin/modules",
                description="Admin only: review agent-built module submissions.")

_NOT_PENDING = "No submission for this slug is pending."


@endpoint(blp, "/pending", "get", admin=True, ok=PendingListSchema)
def pending():
    """Submissions waiting for review, oldest first."""
    return {"pending": builds.pending()}


@endpoint(blp, "/<string:slug>/approve", "post", admin=True, body=ApproveSchema, ok=ReviewBuildSchema,
          errors={404: _NOT_PENDING, 409: "`conflict`: the slug now belongs to another module, or the "
                                              "submitting agent was disabled (reject the submission)."},
          body_optional=True)
def approve(body, slug):
    """Approve the pending submission for `slug`: the module is listed and callable at
    once, owned by the submitting agent; the agent gets a `module.approved` event. The
    body (optional `notes`) may be omitted. A submission of an agent its owner disabled
    is not approved (409): its key, and so the server it submitted, is no longer trusted."""
    return builds.approve(slug, reviewer=f"api:{principal().account_id}", notes=body["notes"])


@endpoint(blp, "/<string:slug>/reject", "post", admin=True, body=RejectSchema, ok=ReviewBuildSchema,
          errors={404: _NOT_PENDING})
def reject(body, slug):
    """Reject the pending submission for `slug` with a `reason` (shown to the agent as
    `review_notes`; `module.rejected` event)."""
    return builds.reject(slug, reviewer=f"api:{principal().account_id}", reason=body["reason"])
