"""``flask chat models`` / ``flask chat release-stale-holds``."""
from __future__ import annotations

import json


def _run(app, *args):
    return app.test_cli_runner().invoke(args=list(args))


def test_chat_models_lists_enabled_models_and_validates(app, monkeypatch, tmp_path):
    r = _run(app, "chat", "models")
    assert r.exit_code == 0, r.output
    ids = [json.loads(line)["id"] for line in r.output.splitlines()]
    assert ids == ["demo-mini", "demo-standard", "demo-large"]
    every = [json.loads(line)["id"] for line in _run(app, "chat", "models", "--all").output.splitlines()]
    assert "gpt-4o" in every and "claude-sonnet-4" in every
    (tmp_path / "models-bad.yaml").write_text("providers: {p: {type: carrier-pigeon}}")
    monkeypatch.setitem(app.config, "CHAT_CATALOG", str(tmp_path / "models*.yaml"))
    r = _run(app, "chat", "models")
    assert r.exit_code == 1 and "type must be" in r.output
    app.extensions.pop("chat_catalog", None)


def test_release_stale_holds_command(app):
    r = _run(app, "chat", "release-stale-holds", "--older-than", "0")
    assert r.exit_code == 0 and json.loads(r.output) == {"released": 0}
