"""Local fake LLM upstreams for the chat tests (OpenAI-compatible and Anthropic-shaped),
and a fixture-friendly helper that points the app's chat catalog at them."""
from __future__ import annotations

import json
import threading
import time
from contextlib import ExitStack, contextmanager

import pytest

from tests.support.standin import Reply, Request, StandIn, serve

USAGE = {"prompt_tokens": 100, "completion_tokens": 50}  # what the healthy fakes report


class FakeState:
    """Behaviour and observations of one fake upstream (shared with its handler)."""

    def __init__(self, name: str):
        self.name = name
        self.mode = "ok"  # ok | 503 | 429 | timeout | 400 | 401
        self.retry_after: str | None = None
        self.usage = True
        self.usage_extra: dict = {}  # merged into the reported usage (e.g. cache token counts)
        self.delta_usage: dict = {}  # Anthropic: merged into message_delta's (cumulative) usage
        self.stop_reason: str | None = None  # Anthropic: the stop reason it answers (else its own)
        self.sleep = 1.0
        self.fail_times: int | None = None  # fail this many times, then behave (mode -> ok)
        # a stream cut after this many events: the connection closes (the body is
        # close-delimited), no finish, no [DONE] / message_stop
        self.stream_cut: int | None = None
        self.calls = 0
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.accept_keys: set[str] | None = None  # the API keys it accepts (None: any, even none)
        self.key_checks: list[str | None] = []  # the keys of its model-list calls (a key's check)
        self.lock = threading.Lock()

    def refuses(self, req: Request) -> bool:
        """Whether the request's key (bearer or x-api-key) is not one this upstream accepts."""
        return self.accept_keys is not None and _key_of(req) not in self.accept_keys


    @property
    def text(self) -> str:
        return f"Hello from {self.name}"


def _key_of(req: Request) -> str | None:
    auth = req.headers.get("Authorization") or ""
    return auth[7:] if auth.startswith("Bearer ") else req.headers.get("x-api-key")


def _sse(events, cut: int | None = None) -> Reply:
    """A Server-Sent Events answer, one flushed write per event (only the first ``cut``
    events when set: the upstream breaks off mid-stream)."""
    if cut is not None:
        events = events[:cut]

    def chunks():
        for name, obj in events:
            prefix = f"event: {name}\n".encode() if name else b""
            payload = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
            yield prefix + b"data: " + payload + b"\n\n"
    return Reply(200, content_type="text/event-stream", chunks=chunks())


def _openai(state: FakeState, body: dict):
    if isinstance(body.get("stop"), list) and len(body["stop"]) > 4:  # as OpenAI refuses it
        return 400, {"error": {"message": f"Invalid 'stop': array too long. Expected an array with maximum length "
                                          f"4, but got an array with length {len(body['stop'])} instead.",
                               "type": "invalid_request_error", "param": "stop", "code": "array_above_max_length"}}
    usage = {**USAGE, "total_tokens": 150, **state.usage_extra}
    if body.get("tools"):
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": body["tools"][0]["function"]["name"], "arguments": '{"city": "Paris"}'}}]}
    else:
        message = {"role": "assistant", "content": state.text}
    if not body.get("stream"):
        out = {"id": "up-1", "object": "chat.completion", "created": 1, "model": body["model"],
               "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        if state.usage:
            out["usage"] = usage
        return 200, out
    base = {"id": "up-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
    events = [(None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    pieces = [w if i == 0 else " " + w for i, w in enumerate(state.text.split(" "))]
    n = body.get("n") or 1
    for k in range(n):  # n > 1: choice k+1's first piece rides on choice k's finishing chunk
        for piece in pieces[1 if k else 0:]:
            events.append((None, {**base, "choices": [{"index": k, "delta": {"content": piece}}]}))
        finish = [{"index": k, "delta": {}, "finish_reason": "stop"}]
        if k + 1 < n:
            finish.append({"index": k + 1, "delta": {"role": "assistant", "content": pieces[0]}})
        events.append((None, {**base, "choices": finish}))
    if state.usage and (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {**base, "choices": [], "usage": usage}))
    events.append((None, b"[DONE]"))
    return _sse(events, state.stream_cut)


THOUGHT = {"type": "thinking", "thinking": "The user greets me.", "signature": "sig-fake"}  # what it thinks


def _anthropic(state: FakeState, body: dict):
    usage = {"input_tokens": 20, "output_tokens": 10, **state.usage_extra}
    if body.get("tools"):
        content = [{"type": "text", "text": "Let me check."},
                   {"type": "tool_use", "id": "toolu_1", "name": body["tools"][0]["name"],
                    "input": {"city": "Paris"}}]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": state.text}]
        stop = "end_turn"
    stops = body.get("stop_sequences") if isinstance(body.get("stop_sequences"), list) else ()
    matched = next((s for s in stops if isinstance(s, str) and s and s in state.text), None)
    if matched and not body.get("tools"):  # the text ends before the first stop sequence it holds
        content = [{"type": "text", "text": state.text[: state.text.index(matched)]}]
        stop = "stop_sequence"
    stop = state.stop_reason or stop
    thinks = isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled"
    if not body.get("stream"):  # thinking: its block first (its tokens inside output_tokens, as Anthropic's)
        return 200, {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                     "content": ([THOUGHT] if thinks else []) + content, "stop_reason": stop,
                     "stop_sequence": matched, "usage": usage}
    events = [("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "usage": {"input_tokens": 20, "output_tokens": 1, **state.usage_extra}}})]
    if thinks:
        events += [("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                   ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
                       "type": "thinking_delta", "thinking": THOUGHT["thinking"]}}),
                   ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
                       "type": "signature_delta", "signature": THOUGHT["signature"]}}),
                   ("content_block_stop", {"type": "content_block_stop", "index": 0})]
    at = 1 if thinks else 0
    events.append(("content_block_start", {"type": "content_block_start", "index": at,
                                           "content_block": {"type": "text", "text": ""}}))
    for i, word in enumerate(content[0]["text"].split(" ")):
        events.append(("content_block_delta", {"type": "content_block_delta", "index": at, "delta": {
            "type": "text_delta", "text": word if i == 0 else " " + word}}))
    events.append(("content_block_stop", {"type": "content_block_stop", "index": at}))
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": matched},
                                     "usage": {"output_tokens": 10, **state.delta_usage}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return _sse(events, state.stream_cut)


def _upstream(fakes: "Fakes", name: str, anthropic: bool) -> StandIn:
    """One fake upstream: behaves as ``fakes.states[name]`` says at the time of each call."""
    server = StandIn()

    @server.route("GET", "*")
    def _models(req: Request):  # the model list: what a provider key's check calls
        state = fakes.states[name]
        with state.lock:
            state.key_checks.append(_key_of(req))
        if state.mode in ("503", "timeout"):
            return 503, {"error": {"message": f"{state.name} is down"}}
        if state.refuses(req):
            return 401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
        return 200, {"object": "list", "data": [{"id": "x", "object": "model"}]}

    @server.route("POST", "*")
    def _complete(req: Request):
        body = req.json()
        state = fakes.states[name]
        if state.refuses(req):
            with state.lock:
                state.calls += 1
                state.headers.append(dict(req.headers))
            return 401, {"error": {"message": "Incorrect API key provided"}}
        with state.lock:
            state.calls += 1
            state.bodies.append(body)
            state.headers.append(dict(req.headers))
            mode = state.mode
            if mode != "ok" and state.fail_times is not None:
                state.fail_times -= 1
                if state.fail_times <= 0:
                    state.mode, state.fail_times = "ok", None
        if mode == "timeout":
            time.sleep(state.sleep)
            return 200, {"choices": []}
        if mode in ("503", "429", "401", "400"):
            headers = {"Retry-After": state.retry_after} if state.retry_after else {}
            return int(mode), {"error": {"message": f"{state.name} says {mode}"}}, headers
        return (_anthropic if anthropic else _openai)(state, body)

    return server


CATALOG = """
providers:
  cheap: {type: openai, base_url: "%(cheap)s/v1"}
  pricey: {type: openai, base_url: "%(pricey)s/v1"}
  nousage: {type: openai, base_url: "%(nousage)s/v1"}
  claude: {type: anthropic, base_url: "%(claude)s", requires_key: true}
  demo_llm: {type: openai, base_url: "%(demo)s/v1"}
  offline: {type: openai, requires_key: true, base_url: "http://127.0.0.1:9/v1"}
models:
  - id: m-small
    context_window: 1000
    max_output_tokens: 500
    capabilities: [streaming]
    providers:
      - {provider: pricey, upstream_model: small-at-pricey, input_usd_per_mtok: "3", output_usd_per_mtok: "6"}
      - {provider: cheap, upstream_model: small-at-cheap, input_usd_per_mtok: "1", output_usd_per_mtok: "2",
         cache_read_usd_per_mtok: "0.5"}
  - id: m-big
    context_window: 100000
    max_output_tokens: 4000
    capabilities: [tools, json_mode, vision, streaming, reasoning]
    providers:
      - {provider: pricey, upstream_model: big, input_usd_per_mtok: "5", output_usd_per_mtok: "15"}
  - id: m-claude
    auto: false
    context_window: 200000
    max_output_tokens: 8000
    capabilities: [tools, vision, streaming, reasoning]
    providers:
      - {provider: claude, upstream_model: claude-test, input_usd_per_mtok: "4", output_usd_per_mtok: "20",
         cache_read_usd_per_mtok: "0.4", cache_write_usd_per_mtok: "5"}
  - id: m-nousage
    auto: false
    context_window: 8000
    capabilities: [streaming]
    providers:
      - {provider: nousage, upstream_model: nu, input_usd_per_mtok: "2", output_usd_per_mtok: "4"}
  - id: m-offline
    context_window: 8000
    capabilities: [streaming]
    providers:
      - {provider: offline, input_usd_per_mtok: "0.01", output_usd_per_mtok: "0.01"}
"""


class Fakes:
    """The running fake upstreams; ``reset()`` gives every one a fresh ``FakeState``."""

    NAMES = ("cheap", "pricey", "nousage", "claude")

    def __init__(self):
        self.urls: dict[str, str] = {}
        self.reset()

    def reset(self) -> None:
        self.states = {n: FakeState(n) for n in self.NAMES}
        self.states["nousage"].usage = False

    def __getattr__(self, name):
        states = self.__dict__.get("states", {})
        if name in states:
            return states[name]
        raise AttributeError(name)


@contextmanager
def running_fakes():
    """Start the fake upstreams and the demo LLM once (module-scoped fixtures)."""
    from demo.llm import DemoLLMHandler

    fakes = Fakes()
    with ExitStack() as stack:
        for name in Fakes.NAMES:
            fakes.urls[name] = stack.enter_context(_upstream(fakes, name, anthropic=(name == "claude")))
        fakes.urls["demo"] = stack.enter_context(serve(DemoLLMHandler))
        yield fakes


@contextmanager
def configured(app, monkeypatch, tmp_path, fakes: Fakes, **config):
    """Reset the fakes and point the app's chat catalog at them; every config change goes
    through ``monkeypatch`` (restored after the test)."""
    from app.services.chat import cooldown as chat_cooldown

    fakes.reset()
    path = tmp_path / "models-test.yaml"
    path.write_text(CATALOG % fakes.urls)
    settings = {"claude": {"base_url": None, "api_key": "sk-ant-test"}}
    overrides = {"CHAT_CATALOG": str(path), "CHAT_PROVIDERS": settings,
                 "CHAT_REFERENCE_MODEL": "m-big", "CHAT_READ_TIMEOUT": 0.3,
                 "CHAT_CONNECT_TIMEOUT": 1.0, "CHAT_SANDBOX_PROVIDER": "demo_llm",
                 "CHAT_HOST": None, "CHAT_COOLDOWN_FAILURES": 3, "CHAT_RETRY_AFTER_CAP": 0.0}
    overrides.update(config)
    for k, v in overrides.items():
        monkeypatch.setitem(app.config, k, v)
    app.extensions.pop("chat_catalog", None)
    chat_cooldown.reset()
    try:
        yield fakes
    finally:
        app.extensions.pop("chat_catalog", None)
        chat_cooldown.reset()


# --- fixtures (import them into a test module to use them) ---------------------------

@pytest.fixture(scope="module")
def upstreams():
    """The fake LLM providers, for the whole module."""
    with running_fakes() as f:
        yield f


@pytest.fixture
def fakes(app, monkeypatch, tmp_path, upstreams):
    """The app configured with the fake providers' catalog, for one test."""
    with configured(app, monkeypatch, tmp_path, upstreams) as f:
        yield f


@contextmanager
def live_server(app, name: str):
    """The app served on a loopback port by a threaded werkzeug server (real HTTP for the
    official clients); yields its base URL."""
    from werkzeug.serving import make_server

    srv = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()
        thread.join(5)
