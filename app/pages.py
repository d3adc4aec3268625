"""Minimal HTML pages for people following e-mailed links (confirmation, unsubscribe,
first key): no external assets, everything escaped, no caching, no referrer (the URL may
carry a token), framing forbidden."""
from __future__ import annotations

from flask import Response
from markupsafe import Markup, escape

_STYLE = ("body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:36rem;"
          "margin:4rem auto;padding:0 1rem;color:#1f2328;line-height:1.5}"
          "button{font:inherit;padding:.6rem 1.2rem;border:0;border-radius:6px;"
          "background:#1f6feb;color:#fff;cursor:pointer}"
          "code{display:block;padding:.8rem;background:#f6f8fa;border-radius:6px;"
          "word-break:break-all;font-size:1.05rem}.muted{color:#57606a}")

HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'unsafe-inline'; "
                                "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "X-Robots-Tag": "noindex",
}


def render(title: str, *paragraphs: str | Markup, status: int = 200) -> Response:
    """A page titled ``title``; plain strings are escaped, ``Markup`` is trusted."""
    body = "".join(f"<p>{escape(p)}</p>" if not isinstance(p, Markup) else str(p)
                   for p in paragraphs)
    html = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<meta name="robots" content="noindex"><title>{escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>")
    return Response(html, status=status, headers=HEADERS, mimetype="text/html")


def form(action: str, button: str, fields: dict[str, str]) -> Markup:
    """A POST form with hidden ``fields`` and one submit button (a click, never a GET,
    performs the action, so link scanners that prefetch URLs change nothing)."""
    hidden = "".join(f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
                     for k, v in fields.items())
    return Markup(f'<form method="post" action="{escape(action)}">{hidden}'
                  f'<button type="submit">{escape(button)}</button></form>')


_STATUS_TEXT = {
    404: "HTML page explaining that the link is unknown, expired or already used.",
    409: "HTML page explaining that the address already has an account.",
}


def doc(description: str, statuses: tuple[int, ...] = (200,)) -> dict:
    """OpenAPI ``responses`` for a route answering with an HTML page (rate limiting is
    the JSON 429 of every public route)."""
    html = {"text/html": {"schema": {"type": "string"}}}
    responses: dict = {str(s): {"description": description if s == 200 else _STATUS_TEXT[s],
                                "content": html} for s in statuses}
    responses["429"] = {"$ref": "#/components/responses/TOO_MANY_REQUESTS"}
    return {"responses": responses}


def page(blp, description: str, statuses: tuple[int, ...] = (200,), *, schema=None,
         location: str = "query", **extra_doc):
    """Decorator of an HTML page's method: public (no credential), ``PUBLIC_PAGE_RATE_LIMIT``
    per client IP, ``schema`` loaded from ``location`` (the method receives it), and
    documented as an HTML response (``doc``) plus ``extra_doc``."""
    from app.auth import public
    from app.ratelimits import per_ip

    def decorator(func):
        view = blp.doc(**doc(description, statuses), **extra_doc)(func)
        if schema is not None:
            view = blp.arguments(schema, location=location)(view)
        return public(per_ip("PUBLIC_PAGE_RATE_LIMIT")(view))

    return decorator
