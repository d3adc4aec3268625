"""Serves the Swagger UI assets used by /docs (bundled, so /docs works offline)."""
from __future__ import annotations

from flask import Blueprint, send_from_directory

try:
    from swagger_ui_bundle import swagger_ui_path
except ImportError:  # pragma: no cover - the package is in requirements.txt
    swagger_ui_path = None

bp = Blueprint("docs_assets", __name__)


@bp.get("/docs/assets/<path:filename>")
def swagger_assets(filename: str):
    response = send_from_directory(swagger_ui_path, filename, max_age=86400)
    return response
