"""Keeps a live chat stream's hold alive: while a stream runs, a daemon thread calls
``holds.extend`` every third of ``CHAT_HOLD_TTL_SECONDS``, so the stale-hold sweep (which
releases holds silent for a TTL) never releases the hold under a running request, however
long the stream or a stall of its upstream lasts. Stopped when the stream settles."""
from __future__ import annotations

import logging
import threading

from flask import current_app

from app.extensions import db
from app.services.money import holds

log = logging.getLogger(__name__)


class HoldHeartbeat:
    """``start()`` when the stream opens, ``stop()`` once it settled (idempotent)."""

    def __init__(self, completion_id: str):
        self.completion_id = completion_id
        self.app = current_app._get_current_object()
        self.every = max(0.05, float(self.app.config["CHAT_HOLD_TTL_SECONDS"]) / 3)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hold-heartbeat-{completion_id}", daemon=True)

    def start(self) -> "HoldHeartbeat":
        self._thread.start()
        return self

    def _run(self) -> None:
        with self.app.app_context():
            try:
                while not self._stop.wait(self.every):
                    try:
                        if not holds.extend(self.completion_id):
                            return  # settled or released: nothing left to keep alive
                    except Exception:  # a database hiccup: try again at the next beat
                        log.warning("chat %s: hold heartbeat failed", self.completion_id, exc_info=True)
            finally:
                db.session.remove()

    def stop(self) -> None:
        self._stop.set()
