"""Chat charged exactly (issue 15): a stream that runs past CHAT_HOLD_TTL_SECONDS keeps its
hold (its heartbeat extends it; the stale-hold sweep leaves it alone) and is charged when
it ends; cache-read / cache-write tokens priced per provider; holds sized with the real
tokenizer for OpenAI models."""
from __future__ import annotations

import time

import orjson
import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import ChatCompletion
from app.services.money import holds
from tests.api.test_chat import START, _events, acct, chat, fakes, figures, upstreams  # noqa: F401
from tests.chatfakes import CATALOG

GPT = """
  - id: m-gpt
    auto: false
    context_window: 128000
    max_output_tokens: 1000
    capabilities: [streaming]
    providers:
      - {provider: cheap, upstream_model: gpt-4o-mini, input_usd_per_mtok: "10", output_usd_per_mtok: "2"}
"""


def test_long_stream_keeps_its_hold_and_is_charged(app, client, fakes, acct, ledger_clean):  # noqa: F811
    app.config["CHAT_HOLD_TTL_SECONDS"] = 0.3
    r = chat(client, acct, model="m-small", max_tokens=100, stream=True)
    assert r.status_code == 200
    body = iter(r.response)
    first = next(body)
    assert first.startswith(b"data: ")
    time.sleep(1.0)  # the client (or the upstream) is slow: the stream outlives the hold TTL
    with app.app_context():
        assert holds.release_stale_holds(0.3) == 0  # a live stream's hold is never released
    rest = b"".join(body)
    events = [orjson.loads(line[6:]) for line in (first + rest).split(b"\n\n") if line.startswith(b"data: {")]
    assert events[-1]["usage"]["cost_micros"] == 200
    assert figures(app, acct.id)["balance"] == START - 200
    assert figures(app, acct.id)["held"] == 0
    with app.app_context():  # once ended, nothing is left for the sweep
        assert holds.release_stale_holds(0) == 0
    ledger_clean()


def test_a_completion_released_by_the_sweep_mid_call_says_it_was_not_charged(app, client, fakes, acct,  # noqa: F811
                                                                            monkeypatch, ledger_clean):
    """A non-streamed completion has no heartbeat: one that outlives CHAT_HOLD_TTL_SECONDS
    (a trickling provider, several attempts) has its hold released by the sweep while it
    runs, and its settle then finds nothing to charge. It was answered with
    ``cost_micros: 200`` and ``X-Chat-Cost-Micros: 200`` while nothing was charged; now the
    answer states 0 (answered and not charged, the house's loss, as a module call's
    ``call_finalize_late``) and the ledger stays clean."""
    import threading

    from app.services.chat import providers

    real = providers.complete

    def slow_complete(offer, body, max_tokens):
        out = real(offer, body, max_tokens)

        def sweep():  # the scheduled job, while this request is still in the provider call
            with app.app_context():
                holds.release_stale_holds(0.0)
                db.session.remove()
        t = threading.Thread(target=sweep)
        t.start()
        t.join()
        return out

    monkeypatch.setattr(providers, "complete", slow_complete)
    r = chat(client, acct, model="m-small", max_tokens=100)
    assert r.status_code == 200
    assert r.get_json()["usage"]["cost_micros"] == 0 and r.headers["X-Chat-Cost-Micros"] == "0"
    with app.app_context():
        row = db.session.execute(select(ChatCompletion)).scalar_one()
        db.session.remove()
    assert (row.status, row.cost_micros) == ("released", 0)
    assert figures(app, acct.id)["balance"] == START and figures(app, acct.id)["held"] == 0
    ledger_clean()


def test_openai_cached_tokens_priced_at_the_cache_read_price(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """m-small at cheap: $1 input, $0.5 cache read, $2 output per Mtok. 100 prompt tokens of
    which 80 cached + 50 completion = 20×1 + 80×0.5 + 50×2 = 160 micros (not 200)."""
    fakes.cheap.usage_extra = {"prompt_tokens_details": {"cached_tokens": 80}}
    r = chat(client, acct, model="m-small", max_tokens=100)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["usage"]["cost_micros"] == 160
    assert figures(app, acct.id)["balance"] == START - 160
    ledger_clean()


def test_anthropic_cache_read_and_write_priced(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """m-claude: $4 input, $0.4 cache read, $5 cache write, $20 output per Mtok. 20 input +
    1000 read + 200 written, 10 output = 80 + 400 + 1000 + 200 = 1680 micros (full price
    would be 1220×4 + 200 = 5080), streamed or not."""
    fakes.claude.usage_extra = {"cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200}
    # a cached prefix as long as the fake reports (the charge never exceeds the hold, which
    # is sized from the prompt sent)
    r = chat(client, acct, model="m-claude", max_tokens=64, messages=[{"role": "user", "content": "x" * 4800}])
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["usage"]["prompt_tokens"] == 1220 and r.get_json()["usage"]["cost_micros"] == 1680
    r = chat(client, acct, model="m-claude", max_tokens=64, stream=True,
             messages=[{"role": "user", "content": "x" * 4800}])
    final = [orjson.loads(x[6:]) for x in r.data.split(b"\n\n") if x.startswith(b"data: {")][-1]
    assert final["usage"]["cost_micros"] == 1680
    assert figures(app, acct.id)["balance"] == START - 2 * 1680
    ledger_clean()


def _usage(r, stream: bool) -> dict:
    """The completion's usage: the answer's, or a stream's last chunk's (before ``[DONE]``)."""
    return _events(r)[-2]["usage"] if stream else r.get_json()["usage"]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_usage_without_input_tokens_is_the_flagged_estimate_not_a_free_prompt(app, client, fakes, acct,
                                                                                      ledger_clean, stream):  # noqa: F811
    """An Anthropic-shaped provider reporting ``output_tokens`` but no (or a null)
    ``input_tokens``: the prompt was charged as 0 tokens and the usage not flagged. As for
    an OpenAI-shaped provider without full usage, the usage is the gateway's estimate:
    prompt 12 (the Claude estimator), completion ceil(len("Hello from claude") / 4) = 5 at
    $4 / $20: 12×4 + 5×20 = 148 micros."""
    fakes.claude.usage_extra = {"input_tokens": None}
    r = chat(client, acct, model="m-claude", max_tokens=64, stream=stream)
    assert r.status_code == 200, r.get_data(as_text=True)
    usage = _usage(r, stream)
    assert usage["estimated"] is True and (usage["prompt_tokens"], usage["completion_tokens"]) == (12, 5)
    assert usage["cost_micros"] == 148
    assert figures(app, acct.id)["balance"] == START - 148
    ledger_clean()


@pytest.mark.parametrize("stream", [False, True])
def test_openai_usage_with_a_null_count_is_the_flagged_estimate_not_a_server_error(app, client, fakes, acct,
                                                                                 ledger_clean, stream):  # noqa: F811
    """``"prompt_tokens": null`` from an OpenAI-shaped provider failed the completion with
    500 (``int(None)``; a stream broke before its usage, the hold left for the sweep). It is
    usage without the count: the gateway's estimate, prompt 10 + ceil(len("Hello from
    cheap") / 4) = 4 at cheap ($1 / $2): 10 + 8 = 18 micros."""
    fakes.cheap.usage_extra = {"prompt_tokens": None}
    r = chat(client, acct, model="m-small", max_tokens=64, stream=stream)
    assert r.status_code == 200, r.get_data(as_text=True)
    usage = _usage(r, stream)
    assert usage["estimated"] is True and (usage["prompt_tokens"], usage["completion_tokens"]) == (10, 4)
    assert usage["cost_micros"] == 18 and figures(app, acct.id)["balance"] == START - 18
    ledger_clean()


def test_openai_hold_sized_by_the_tokenizer_lets_a_low_balance_through(app, client, monkeypatch, tmp_path,
                                                                        fakes, make_account, ledger_clean):  # noqa: F811
    """A prompt of long common words: 2,000 o200k tokens, but 28,000 characters. The hold is
    2,008 (2,000 + 3 per message + 1 for the role + 3 for the reply) × 10 + 100 × 2 = 20,280
    micros, which 3 cents cover; the characters/4 hold (7,007 × 10 + 200 = 70,270) did not."""
    path = tmp_path / "models-gpt.yaml"
    path.write_text(CATALOG % fakes.urls + GPT)
    monkeypatch.setitem(app.config, "CHAT_CATALOG", str(path))
    app.extensions.pop("chat_catalog", None)
    poor = make_account(cents=3)
    prompt = [{"role": "user", "content": "understanding" + " understanding" * 1999}]
    r = chat(client, poor, model="m-gpt", messages=prompt, max_tokens=100)
    assert r.status_code == 200, r.get_json()
    with app.app_context():
        assert db.session.execute(select(ChatCompletion.hold_micros)).scalar_one() == 20_280
    assert r.get_json()["usage"]["cost_micros"] == 100 * 10 + 50 * 2  # what the upstream reported
    assert figures(app, poor.id)["balance"] == 30_000 - 1_100
    ledger_clean()
