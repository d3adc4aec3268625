"""``bench.scenarios.RatioRounds``: the interleaved rounds the throughput-ratio targets are
judged on (order reversed every other round, warm-up only in the first, peers started
again and stopped after, only what the run measured)."""
from __future__ import annotations

import pytest

from bench import peers, scenarios


class _Bench:
    """The part of ``bench.run.Bench`` the rounds use; ``measure`` answers a fixed row."""

    def __init__(self, specs, rounds=3):
        self.round_specs = specs
        self.ratio_rounds, self.ratio_duration = rounds, 5
        self.concurrency = [1, 16]
        self.results = {}
        self.calls = []

    def measure(self, name, url, **kw):
        self.calls.append((name, url, kw))
        return {"16": {"rps": 100.0, "errors": 0}}


def _ctx(bench):
    return scenarios.Context(bench=bench, env={}, ports={}, work=None, upstream="", gateway="",
                             paths={}, log=lambda msg: None)


def test_rounds_alternate_the_order_and_warm_up_only_once(monkeypatch):
    started, stopped = [], []
    monkeypatch.setattr(peers, "pid", lambda name: 4242)
    monkeypatch.setattr(peers, "stop", lambda ctx, name: stopped.append(name))
    specs = {"passthrough": (None, {"url": "p"}),
             "metered": (None, {"url": "m", "idempotency": True}),
             "portkey": (lambda ctx: started.append("portkey"), {"url": "k", "warmup": 5})}
    bench = _Bench(specs)
    scenarios.RatioRounds().run(_ctx(bench))
    names = [c[0] for c in bench.calls]
    assert names == ["passthrough-round1", "metered-round1", "portkey-round1",
                     "portkey-round2", "metered-round2", "passthrough-round2",
                     "passthrough-round3", "metered-round3", "portkey-round3"]
    warm = [c[2].get("warmup") for c in bench.calls]
    assert warm == [None, None, 5] + [0] * 6      # round 1: each scenario's own warm-up
    assert all(c[2]["concurrencies"] == [16] and c[2]["duration"] == 5 and c[2]["record"] is False
               for c in bench.calls)
    assert bench.calls[1][2]["idempotency"] is True  # the scenario's own request
    assert [c[2]["server_pid"] for c in bench.calls[:3]] == [None, None, 4242]
    assert started == ["portkey"] and stopped == ["portkey"]
    rr = bench.results["ratio_rounds"]
    assert rr["concurrency"] == 16 and rr["duration_s"] == 5
    assert [r["order"] for r in rr["rounds"]][:2] == [["passthrough", "metered", "portkey"],
                                                      ["portkey", "metered", "passthrough"]]
    assert set(rr["rounds"][0]["rows"]) == {"passthrough", "metered", "portkey"}


def test_a_peer_that_does_not_start_again_is_left_out(monkeypatch):
    def fail(ctx):
        raise scenarios.Unavailable("no node")

    monkeypatch.setattr(peers, "stop", lambda ctx, name: pytest.fail("nothing to stop"))
    bench = _Bench({"chat": (None, {"url": "c"}), "litellm": (fail, {"url": "l"}),
                    "metered": (None, {"url": "m"})}, rounds=2)
    scenarios.RatioRounds().run(_ctx(bench))
    assert [r["order"] for r in bench.results["ratio_rounds"]["rounds"]] == [["metered", "chat"],
                                                                            ["chat", "metered"]]


@pytest.mark.parametrize("rounds,specs", [(0, {"passthrough": (None, {}), "metered": (None, {})}),
                                          (5, {"metered": (None, {})})])
def test_no_rounds_without_a_pair_or_with_zero_rounds(rounds, specs):
    bench = _Bench(specs, rounds=rounds)
    with pytest.raises(scenarios.Unavailable):
        scenarios.RatioRounds().run(_ctx(bench))
    assert bench.calls == [] and "ratio_rounds" not in bench.results
