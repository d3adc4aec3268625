"""Issue 42 item 11: configuration values are compared case-insensitively and an unknown
value refuses to start. ``APP_ENV=Production`` loaded the development configuration
(sandbox payments, private URLs allowed); a misspelt switch silently meant "off"."""
from __future__ import annotations

import pytest

from config import ConfigError, load_config

PROD = {"SECRET_KEY": "s", "DATABASE_URL": "postgresql://x@127.0.0.1/db", "REDIS_URL": "redis://127.0.0.1:6379/0",
        "RECEIPT_SIGNING_KEY": "A" * 43 + "="}


@pytest.fixture
def env(monkeypatch):
    for name in ("APP_ENV", "PAYMENTS_PROCESSOR", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "ALLOW_PRIVATE_URLS",
                 "PAYMENTS_SANDBOX_ENABLED", "DEFAULT_PLAN", "X402_NETWORKS", "RATELIMIT_ENABLED"):
        monkeypatch.delenv(name, raising=False)

    def set_env(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return set_env


@pytest.mark.parametrize("spelling", ["Production", "PRODUCTION", " production "])
def test_app_env_any_case_is_production(env, spelling):
    env(APP_ENV=spelling, **PROD)
    cfg = load_config()
    assert cfg["APP_ENV"] == "production" and cfg["PRODUCTION"] is True
    assert cfg["ALLOW_PRIVATE_URLS"] is False and cfg["PAYMENTS_PROCESSOR"] == ""


def test_app_env_any_case_needs_the_production_secrets(env):
    env(APP_ENV="Production")
    with pytest.raises(ConfigError, match="production configuration incomplete"):
        load_config()


@pytest.mark.parametrize("name,value", [("APP_ENV", "prod"), ("APP_ENV", "staging"), ("PAYMENTS_PROCESSOR", "strip"),
                                        ("DEFAULT_PLAN", "gold"), ("RATELIMIT_ENABLED", "flase"),
                                        ("ALLOW_PRIVATE_URLS", "nope"), ("X402_NETWORKS", "base,solana")])
def test_unknown_values_refuse_to_start(env, name, value):
    env(**{name: value})
    with pytest.raises(ConfigError, match=name):
        load_config({"APP_ENV": "test"} if name != "APP_ENV" else None)


def test_enumerations_in_any_case(env):
    env(PAYMENTS_PROCESSOR="Sandbox", DEFAULT_PLAN="Pro", RATELIMIT_ENABLED="OFF", X402_NETWORKS="Base, Polygon")
    cfg = load_config({"APP_ENV": "test"})
    assert (cfg["PAYMENTS_PROCESSOR"], cfg["DEFAULT_PLAN"], cfg["RATELIMIT_ENABLED"]) == ("sandbox", "pro", False)
    assert cfg["X402_NETWORKS"] == ["base", "polygon"]


def test_stripe_in_any_case_turns_the_production_sandbox_off(env):
    env(APP_ENV="production", PAYMENTS_PROCESSOR="Stripe", STRIPE_SECRET_KEY="sk", STRIPE_WEBHOOK_SECRET="wh", **PROD)
    cfg = load_config()
    assert cfg["PAYMENTS_PROCESSOR"] == "stripe" and cfg["PAYMENTS_SANDBOX_ENABLED"] is False


def test_x402_networks_are_the_evm_chains():
    from app.services.billing.chains import EVM_CHAINS
    from config import X402_NETWORKS

    assert X402_NETWORKS == EVM_CHAINS


@pytest.mark.parametrize("name,value", [("DB_POOL_SIZE", "eight"), ("MAX_BODY_BYTES", "1m"),
                                        ("RATELIMIT_LEASE_FRACTION", "1%")])
def test_a_malformed_number_names_its_variable(monkeypatch, name, value):
    # an operator's typo in a numeric setting said only "invalid literal for int() with base
    # 10: 'eight'", naming no variable among the hundred the environment file holds
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}={value!r}: not a number"):
        load_config({"APP_ENV": "test"})
