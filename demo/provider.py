"""Demo provider: a small WSGI app serving the demo catalog's modules offline.

Modules (see ``catalog/modules/``): ``echo`` (echo the body), ``text`` (word_count,
uppercase, slugify) and ``weather`` (deterministic current conditions / forecast per city).
Every request must carry ``X-Provider-Key: $DEMO_PROVIDER_SECRET`` (dev default
``demo-provider-dev-secret``) — the gateway adds it; callers never see it. Paths under
``/sandbox`` behave the same and mark results ``"sandbox": true``.

Run: ``python -m demo.provider`` (``DEMO_PROVIDER_PORT``, default 8901) or
``gunicorn demo.provider:app``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import unicodedata
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

DEV_SECRET = "demo-provider-dev-secret"
CONDITIONS = ("sunny", "partly cloudy", "cloudy", "light rain", "rain", "thunderstorms", "snow", "fog")


def _secret() -> str:
    return os.environ.get("DEMO_PROVIDER_SECRET") or DEV_SECRET


def _slugify(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _weather(city: str, day: int = 0) -> dict:
    h = hashlib.sha256(f"{city.strip().lower()}|{day}".encode()).digest()
    return {"temp_c": round(-10 + h[0] / 255 * 45, 1), "humidity_pct": 20 + h[1] % 80,
            "wind_kph": h[2] % 60, "conditions": CONDITIONS[h[3] % len(CONDITIONS)]}


def _text(body: dict):
    text = body.get("text")
    if not isinstance(text, str):
        return 400, {"error": "invalid_input", "message": "'text' (string) is required"}
    return 200, text


def handle(path: str, body: dict) -> tuple[int, dict]:
    if path == "/echo":
        return 200, {"echo": body}
    if path.startswith("/text/"):
        status, text = _text(body)
        if status != 200:
            return status, text
        op = path[len("/text/"):]
        if op == "word_count":
            words = re.findall(r"\w+", text)
            return 200, {"words": len(words), "characters": len(text),
                         "lines": text.count("\n") + 1 if text else 0}
        if op == "uppercase":
            return 200, {"text": text.upper()}
        if op == "slugify":
            return 200, {"slug": _slugify(text)}
    if path.startswith("/weather/"):
        city = body.get("city")
        if not isinstance(city, str) or not city.strip():
            return 400, {"error": "invalid_input", "message": "'city' (string) is required"}
        if path == "/weather/current":
            return 200, {"city": city, **_weather(city)}
        if path == "/weather/forecast":
            days = body.get("days", 3)
            if not isinstance(days, int) or not 1 <= days <= 7:
                return 400, {"error": "invalid_input", "message": "'days' must be 1..7"}
            return 200, {"city": city, "days": [{"day": d + 1, **_weather(city, d + 1)}
                                               for d in range(days)]}
    return 404, {"error": "not_found", "message": f"no such endpoint {path}"}


def app(environ, start_response):
    def reply(status: int, payload: dict):
        data = json.dumps(payload).encode()
        start_response(f"{status} {'OK' if status < 400 else 'Error'}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    key = environ.get("HTTP_X_PROVIDER_KEY", "")
    if not hmac.compare_digest(key.encode(), _secret().encode()):
        return reply(401, {"error": "unauthorized", "message": "missing or wrong X-Provider-Key"})
    if environ.get("REQUEST_METHOD") != "POST":
        return reply(405, {"error": "method_not_allowed"})
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = json.loads(environ["wsgi.input"].read(length) or b"{}") if length <= 1 << 20 else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return reply(400, {"error": "invalid_input", "message": "body must be a JSON object"})
    path = environ.get("PATH_INFO", "/")
    sandbox = path.startswith("/sandbox/")
    status, payload = handle(path[len("/sandbox"):] if sandbox else path, body)
    if sandbox and status == 200:
        payload["sandbox"] = True
    return reply(status, payload)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):  # keep the console for the gateway
        pass


def main() -> None:
    port = int(os.environ.get("DEMO_PROVIDER_PORT", "8901"))
    with make_server("127.0.0.1", port, app, server_class=_ThreadingServer,
                     handler_class=_QuietHandler) as server:
        print(f"demo provider on http://127.0.0.1:{port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
