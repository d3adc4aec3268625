"""Local demo servers used by the embedded default (``make run``) and by tests."""
from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JSONHandler(BaseHTTPRequestHandler):
    """The demo servers' request handler base: no access log, JSON answers."""

    def log_message(self, *args):
        pass

    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve_main(handler: type[BaseHTTPRequestHandler], *, description: str, port: int, label: str,
               path: str = "", argv: list[str] | None = None) -> None:
    """``python -m demo.<server> [--host H] [--port P]``: serve ``handler`` until Ctrl-C."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    print(f"{label} on http://{args.host}:{args.port}{path}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
