"""Configuration: every setting comes from the environment, with safe local defaults.

Two ways to run (DESIGN §2):

* embedded default (``APP_ENV`` unset or ``development``): with no ``DATABASE_URL``, an
  embedded PostgreSQL with its data under ``instance/pg`` (app/services/platform/embedded_pg.py),
  no Redis (jobs inline, rate limits in memory), mail to ``instance/outbox/``,
  sandbox payments, demo providers on loopback.
* production (``APP_ENV=production``): PostgreSQL + Redis, and start-up fails
  when a required secret or service address is missing.

``APP_ENV=test`` is the embedded default used by the test-suite (it still honours
``DATABASE_URL`` / ``REDIS_URL``); it turns no production mechanism off: tests run the
hot routes' one entry (app/blueprints/gateway/hotpath.py) and the production finalize
(``CALL_FINALIZE_DEFERRED``).
PostgreSQL is the only database everywhere.
"""
from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent


class ConfigError(RuntimeError):
    """Raised at start-up when the configuration is incomplete (production) or a setting
    has a value the service does not know."""


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
APP_ENVS = ("development", "test", "production")
PROCESSORS = ("sandbox", "stripe")
X402_NETWORKS = ("base", "ethereum", "polygon")  # app.services.billing.chains.EVM_CHAINS


# Production's default JSON-RPC endpoints (RPC_URL_<CHAIN> overrides each): public mainnet nodes.
PUBLIC_RPC_URLS = {
    "base": "https://mainnet.base.org",
    "ethereum": "https://ethereum-rpc.publicnode.com",
    "polygon": "https://polygon-rpc.com",
    "solana": "https://api.mainnet-beta.solana.com",
}


def _bool(name: str, default: bool) -> bool:
    """A yes/no setting, read case-insensitively; anything but 1/0, true/false, yes/no,
    on/off refuses to start (a typo must not silently mean "off")."""
    value = _env(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ConfigError(f"{name}={value!r}: use one of {', '.join(_TRUE + _FALSE)}")
    return word in _TRUE


def _choice(name: str, value: str | None, choices: tuple[str, ...], *, allow_empty: bool = False) -> str:
    """An enumerated setting, compared case-insensitively (``APP_ENV=Production`` is
    production); an unknown value refuses to start instead of falling back to a default."""
    word = (value or "").strip().lower()
    if word in choices or (allow_empty and word == ""):
        return word
    raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")


def _number(name: str, default, kind):
    """A numeric setting; a malformed one refuses to start naming the variable (int() alone
    said "invalid literal for int()", naming none of the environment's variables)."""
    value = _env(name)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: not a number (expected {'an integer' if kind is int else 'a number'})") from None


def _int(name: str, default: int) -> int:
    return _number(name, default, int)


def _float(name: str, default: float) -> float:
    return _number(name, default, float)


# Plans: one table (DESIGN §3). plan_cents is the monthly included spend used by
# /api/usage/current and plan_pct alerts; rate_limit is the account's limit (all its API
# keys and agent sessions together, applied by app.ratelimits.per_credential; the `limits` syntax).
PLANS: dict[str, dict] = {
    "starter": {"plan_cents": 2_000, "rate_limit": "60/minute;10/second"},
    "pro": {"plan_cents": 20_000, "rate_limit": "600/minute;50/second"},
    "scale": {"plan_cents": 200_000, "rate_limit": "6000/minute;200/second"},
    "enterprise": {"plan_cents": 2_000_000, "rate_limit": "60000/minute;1000/second"},
}


# Chat providers configured from the environment: <ID>_BASE_URL and <ID>_API_KEY for
# each id here (plus any listed in CHAT_EXTRA_PROVIDERS); the catalog YAML names them.
CHAT_PROVIDER_IDS = ("openai", "anthropic", "demo_llm")


def _chat_providers(production: bool) -> dict:
    extra = tuple(p.strip() for p in (_env("CHAT_EXTRA_PROVIDERS", "") or "").split(",") if p.strip())
    out = {}
    for pid in CHAT_PROVIDER_IDS + extra:
        name = pid.upper()
        out[pid] = {"base_url": _env(f"{name}_BASE_URL"), "api_key": _env(f"{name}_API_KEY")}
    if out["demo_llm"]["base_url"] is None and not production:
        out["demo_llm"]["base_url"] = f"http://127.0.0.1:{_env('DEMO_LLM_PORT', '8790')}/v1"
    return out



def _prepare_threshold(pgbouncer: bool) -> int | None:
    """psycopg's ``prepare_threshold`` from ``DB_PREPARE_THRESHOLD`` (``none``: never
    prepare); default 5 (psycopg's own), none behind PgBouncer (``DATABASE_PGBOUNCER``)."""
    raw = _env("DB_PREPARE_THRESHOLD")
    if raw is None:
        return None if pgbouncer else 5
    if raw.strip().lower() in ("none", "off"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"DB_PREPARE_THRESHOLD must be a number of executions or 'none', not {raw!r}") from None
    if value < 0:
        raise ConfigError(f"DB_PREPARE_THRESHOLD must be 0 or more (or 'none'), not {value}")
    return value


def engine_options(cfg: dict) -> dict:
    """``create_engine`` options of the app's ONE connection pool per process
    (docs/architecture.md, "Connections"; docs/operations.md, "PostgreSQL connections"):
    every statement of a process — requests, the finalize writer, the background
    flushes — checks a connection out of it and returns it when the statement or unit of
    work ends, so a worker holds at most ``DB_POOL_SIZE + DB_MAX_OVERFLOW`` connections
    whatever its thread count. A checkout waits at most ``DB_POOL_TIMEOUT`` seconds for
    one, then the request answers 503 ``service_unavailable`` (app/errors.py).

    Default 8 + 0: connections are opened on demand and KEPT. An overflow connection is
    closed when it is returned to a full pool, so under load 4 + 4 opened and closed
    connections all the time (a PostgreSQL backend forked per burst: 267 sessions against
    28 over the same two bench scenarios, bench/DIARY.md 2026-11-28 "Pool churn")."""
    pool_size, overflow = _int("DB_POOL_SIZE", 8), _int("DB_MAX_OVERFLOW", 0)
    timeout = _float("DB_POOL_TIMEOUT", 5.0)
    if pool_size < 1 or overflow < 0 or timeout <= 0:
        raise ConfigError(f"DB_POOL_SIZE must be at least 1, DB_MAX_OVERFLOW 0 or more and DB_POOL_TIMEOUT "
                          f"above 0 seconds (not {pool_size}, {overflow}, {timeout})")
    return {
        "pool_size": pool_size,
        "max_overflow": overflow,
        "pool_timeout": timeout,
        # Idle connections are checked at checkout without a round trip (a server that
        # restarted or ended the session has closed the socket: dbpool.py), not pinged.
        "pool_pre_ping": False,
        "pool_recycle": _int("DB_POOL_RECYCLE", 1800),
        "connect_args": {"prepare_threshold": _prepare_threshold(cfg["DATABASE_PGBOUNCER"])},
    }


# What ``make run`` chose (deploy/run-local.sh writes it under the instance folder while it
# runs, and removes it on the way out): its demo servers' ports and addresses, the demo
# facilitator and chain, DATABASE_URL and REDIS_URL when set. ``KEY=VALUE`` lines.
RUN_LOCAL_ENV = "run-local.env"


def _adopt_run_local(instance_dir: Path) -> None:
    """In development, a process started outside ``make run`` (a ``flask`` command in
    another shell) takes the settings of the running ``make run`` that its environment does
    not set, so it talks to the same database, facilitator and chain (``flask money
    resolve-x402`` had no X402_FACILITATOR_URL). Into ``os.environ``: the catalog's
    ``${VAR}`` and every other reader see them too. The environment always wins."""
    try:
        lines = (instance_dir / RUN_LOCAL_ENV).read_text().splitlines()
    except OSError:
        return
    for line in lines:
        name, sep, value = line.strip().partition("=")
        if sep and name and not name.startswith("#") and value:
            os.environ.setdefault(name, value)


def load_config(overrides: dict | None = None) -> dict:
    """Build the Flask config mapping from the environment (plus test overrides)."""
    app_env = _choice("APP_ENV", (overrides or {}).get("APP_ENV") or _env("APP_ENV", "development"), APP_ENVS)
    production = app_env == "production"
    instance_dir = Path(_env("INSTANCE_PATH", str(BASE_DIR / "instance")))
    if app_env == "development":
        _adopt_run_local(instance_dir)

    cfg: dict = {
        "APP_ENV": app_env,
        "PRODUCTION": production,
        "INSTANCE_PATH": str(instance_dir),
        "SECRET_KEY": _env("SECRET_KEY"),
        # --- database -------------------------------------------------------
        # PostgreSQL only. Unset outside production: the embedded server (see below).
        "SQLALCHEMY_DATABASE_URI": _env("DATABASE_URL", ""),
        "SQLALCHEMY_TRACK_MODIFICATIONS": False,
        # DATABASE_URL points at PgBouncer in transaction mode: no server-side prepared
        # statements unless DB_PREPARE_THRESHOLD says otherwise (PgBouncer >= 1.21 with
        # max_prepared_statements). Pool settings: engine_options() below.
        "DATABASE_PGBOUNCER": _bool("DATABASE_PGBOUNCER", False),
        # --- redis / jobs ---------------------------------------------------
        "REDIS_URL": _env("REDIS_URL"),
        "RQ_QUEUE": _env("RQ_QUEUE", "default"),
        "JOBS_INLINE": _bool("JOBS_INLINE", _env("REDIS_URL") is None),
        # --- HTTP -----------------------------------------------------------
        "MAX_CONTENT_LENGTH": _int("MAX_BODY_BYTES", 1024 * 1024),
        "BASE_URL": _env("BASE_URL", f"http://127.0.0.1:{_env('PORT', '8000')}"),
        "TRUSTED_PROXIES": _int("TRUSTED_PROXIES", 1 if production else 0),
        # Origins allowed to POST the public endpoints from a browser (/api/track, /api/contact,
        # /api/email/subscribe and /unsubscribe, /api/signup; comma-separated, or "*").
        # Default "*" outside production; in production nothing unless configured.
        "CORS_ORIGINS": _env("CORS_ORIGINS", "" if production else "*"),
        # --- accounts / credentials -----------------------------------------
        "PLANS": PLANS,
        "DEFAULT_PLAN": _choice("DEFAULT_PLAN", _env("DEFAULT_PLAN", "starter"), tuple(PLANS)),
        "PROMO_GRANT_CENTS": _int("PROMO_GRANT_CENTS", 1_000),
        # Credential cache TTL in seconds: the upper bound for revocation when a
        # broadcast is missed. With Redis a broadcast makes it ~immediate.
        "AUTH_CACHE_TTL": _float("AUTH_CACHE_TTL", 30.0 if _env("REDIS_URL") else 2.0),
        "LAST_USED_FLUSH_SECONDS": _float("LAST_USED_FLUSH_SECONDS", 15.0),
        # --- agents (DESIGN §6) ------------------------------------------------
        "AGENT_NONCE_TTL_SECONDS": _int("AGENT_NONCE_TTL_SECONDS", 300),
        "AGENT_SESSION_TTL_SECONDS": _int("AGENT_SESSION_TTL_SECONDS", 3600),
        # CAIP-2 chains an agent's EVM identity (eip155:<chainId>:<address>) may name, for
        # registration and Sign-In-With-X (docs/agents.md): Ethereum, Base, Base Sepolia.
        "AGENT_SIWX_CHAINS": [c.strip() for c in (_env("AGENT_SIWX_CHAINS", "eip155:1,eip155:8453,eip155:84532")
                                                  or "").split(",") if c.strip()],
        # A month is settled only once it ended at least this long ago (late refunds).
        "SETTLEMENT_GRACE_SECONDS": _int("SETTLEMENT_GRACE_SECONDS", 3600),
        # Payouts (docs/payments.md#payouts): settled earnings owed to a payout destination
        # are paid out once they reach PAYOUT_MINIMUM_CENTS (below: they carry over); a
        # failed payout is retried after PAYOUT_RETRY_SECONDS × 2^(attempts-1) (at most 64×);
        # one whose answer was never booked (the worker died) is asked again, with the same
        # idempotency key, after PAYOUT_RECOVER_AFTER_SECONDS.
        "PAYOUT_MINIMUM_CENTS": _int("PAYOUT_MINIMUM_CENTS", 1000),
        "PAYOUT_RETRY_SECONDS": _int("PAYOUT_RETRY_SECONDS", 3600),
        "PAYOUT_RECOVER_AFTER_SECONDS": _int("PAYOUT_RECOVER_AFTER_SECONDS", 300),
        # USDC payouts: the payout wallet's secp256k1 private key (64 hex characters, a
        # secret); it signs each payout's USDC ``transfer`` on every EVM chain (it needs
        # USDC and gas there). Unset: USDC destinations answer 409 payout_rail_unavailable.
        "PAYOUT_WALLET_KEY": _env("PAYOUT_WALLET_KEY"),
        "PAYOUT_GAS_LIMIT": _int("PAYOUT_GAS_LIMIT", 100_000),
        # --- rate limits ----------------------------------------------------
        "RATELIMIT_ENABLED": _bool("RATELIMIT_ENABLED", True),
        # Where every rate limit counts (app/services/platform/ratecount.py): a redis://
        # URL, else PostgreSQL (the embedded default: every worker and node shares it).
        "RATELIMIT_STORAGE_URI": _env("RATELIMIT_STORAGE_URI", _env("REDIS_URL", "postgresql")),
        "RATELIMIT_KEY_PREFIX": _env("RATELIMIT_KEY_PREFIX", "gw"),
        # A process counts a plan's limit in leases of this fraction of
        # the smallest window's limit (app/services/platform/ratecount.py "Leases"): a high limit
        # (enterprise: 1,000/s -> 10) needs one round trip per lease, not per request,
        # and may admit up to lease-1 fewer requests per process and window than the
        # plan, never more. Small limits (a lease below 2) are counted exactly. 0: exact.
        "RATELIMIT_LEASE_FRACTION": _float("RATELIMIT_LEASE_FRACTION", 0.01),
        # --- mail -----------------------------------------------------------
        "SMTP_URL": _env("SMTP_URL"),
        "MAIL_FROM": _env("MAIL_FROM", "Gateway <no-reply@gateway.local>"),
        "MAIL_OUTBOX_DIR": _env("MAIL_OUTBOX_DIR", str(instance_dir / "outbox")),
        # --- outgoing requests ----------------------------------------------
        # Allow webhooks / upstreams on private or loopback addresses (tests, local demo).
        # Link-local and cloud metadata addresses are refused whatever this says
        # (policy: app/services/platform/http.py).
        "ALLOW_PRIVATE_URLS": _bool("ALLOW_PRIVATE_URLS", not production),
        # Largest response body read from webhooks, JSON-RPC, the facilitator (and the CLI).
        "HTTP_MAX_RESPONSE_BYTES": _int("HTTP_MAX_RESPONSE_BYTES", 4 * 1024 * 1024),
        # Largest LLM provider response (a whole stream counts), then the provider fails.
        "CHAT_MAX_RESPONSE_BYTES": _int("CHAT_MAX_RESPONSE_BYTES", 32 * 1024 * 1024),
        # --- payments, wallets, x402 (README "Payments and wallets", "x402") --
        # Hosts a checkout's return_url may name (comma-separated; subdomains included);
        # empty: any host (app/services/platform/redirects.py).
        "RETURN_URL_HOSTS": _env("RETURN_URL_HOSTS", ""),
        # sandbox | stripe. Production has no default: live card/ACH/checkout answer 503
        # payments_unavailable until Stripe is configured; "sandbox" is refused there.
        "PAYMENTS_PROCESSOR": _choice("PAYMENTS_PROCESSOR", _env("PAYMENTS_PROCESSOR", "" if production else "sandbox"),
                                      PROCESSORS, allow_empty=True),
        "STRIPE_SECRET_KEY": _env("STRIPE_SECRET_KEY"),
        "STRIPE_WEBHOOK_SECRET": _env("STRIPE_WEBHOOK_SECRET"),
        "STRIPE_API_BASE": _env("STRIPE_API_BASE"),
        "SANDBOX_WEBHOOK_SECRET": _env("SANDBOX_WEBHOOK_SECRET"),
        "PAYMENTS_SANDBOX_ENABLED": _bool(
            "PAYMENTS_SANDBOX_ENABLED",
            not (production and (_env("PAYMENTS_PROCESSOR") or "").strip().lower() == "stripe")),
        # Auto top-up (docs/payments.md): consecutive failed attempts before the rule is
        # disabled and the owner told; a failed attempt is retried after
        # AUTOTOPUP_RETRY_SECONDS × 2^(failures-1) while the balance stays under the threshold.
        "AUTOTOPUP_MAX_FAILURES": _int("AUTOTOPUP_MAX_FAILURES", 3),
        "AUTOTOPUP_RETRY_SECONDS": _int("AUTOTOPUP_RETRY_SECONDS", 3600),
        # Invoices (docs/payments.md "Invoices"): the seller printed on every invoice, its id
        # (numbers are gap-free per seller id and series) and the number prefix; a month's
        # usage invoice is issued once the month is over by INVOICE_USAGE_GRACE_SECONDS.
        "INVOICE_SELLER_ID": _env("INVOICE_SELLER_ID", "main"),
        "INVOICE_SELLER_NAME": _env("INVOICE_SELLER_NAME", "Metered API Gateway"),
        "INVOICE_SELLER_ADDRESS": _env("INVOICE_SELLER_ADDRESS", ""),
        "INVOICE_SELLER_TAX_ID": _env("INVOICE_SELLER_TAX_ID", ""),
        "INVOICE_SELLER_EMAIL": _env("INVOICE_SELLER_EMAIL", ""),
        "INVOICE_NUMBER_PREFIX": _env("INVOICE_NUMBER_PREFIX", "INV"),
        # credit notes (a refund of an invoiced payment) are numbered in their own series
        "CREDIT_NOTE_NUMBER_PREFIX": _env("CREDIT_NOTE_NUMBER_PREFIX", "CN"),
        # a Unicode TrueType font for invoice PDFs (unset: DejaVu Sans when installed, else Helvetica)
        "INVOICE_FONT_PATH": _env("INVOICE_FONT_PATH"),
        "INVOICE_USAGE_GRACE_SECONDS": _int("INVOICE_USAGE_GRACE_SECONDS", 3600),
        # JSON-RPC per chain: RPC_URL_<CHAIN>, defaulting to a public mainnet node in
        # production only (PUBLIC_RPC_URLS); elsewhere no chain unless one is named (make
        # run names its demo chain: deploy/run-local.d/30-demo-facilitator.sh), so neither
        # the embedded default nor the tests ever ask a public network.
        "RPC_URLS": {chain: _env(f"RPC_URL_{chain.upper()}", PUBLIC_RPC_URLS[chain] if production else None)
                     for chain in PUBLIC_RPC_URLS},
        "USDC_CONTRACTS": {
            "base": _env("USDC_CONTRACT_BASE", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"),
            "ethereum": _env("USDC_CONTRACT_ETHEREUM", "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"),
            "polygon": _env("USDC_CONTRACT_POLYGON", "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359"),
            "solana": _env("USDC_MINT_SOLANA", "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"),
        },
        "RPC_TIMEOUT_SECONDS": _float("RPC_TIMEOUT_SECONDS", 5.0),
        "WALLET_BALANCE_CACHE_SECONDS": _int("WALLET_BALANCE_CACHE_SECONDS", 15),
        "WALLET_NONCE_TTL_SECONDS": _int("WALLET_NONCE_TTL_SECONDS", 600),
        "CHAIN_CONFIRMATIONS": _int("CHAIN_CONFIRMATIONS", 5),
        "CHAIN_WATCH_MAX_BLOCKS": _int("CHAIN_WATCH_MAX_BLOCKS", 2000),
        "CHAIN_WATCH_LOOKBACK_BLOCKS": _int("CHAIN_WATCH_LOOKBACK_BLOCKS", 1000),
        "USDC_DEPOSIT_TTL_SECONDS": _int("USDC_DEPOSIT_TTL_SECONDS", 24 * 3600),
        # Sandbox-only default. In production, unset = x402 and USDC deposits are off.
        "X402_PAY_TO": _env("X402_PAY_TO", None if production else "0x0000000000000000000000000000000000000402"),
        "USDC_DEPOSIT_ADDRESS": _env("USDC_DEPOSIT_ADDRESS", _env("X402_PAY_TO")),
        "X402_NETWORKS": [_choice("X402_NETWORKS", n, X402_NETWORKS)
                          for n in (_env("X402_NETWORKS", "base") or "").split(",") if n.strip()],
        "X402_FACILITATOR_URL": _env("X402_FACILITATOR_URL"),
        "X402_MAX_TIMEOUT_SECONDS": _int("X402_MAX_TIMEOUT_SECONDS", 300),
        # Facilitator answer deadline; an unanswered /settle leaves the authorization
        # ``reserved`` and x402 reconciliation resolves it after X402_RECONCILE_AFTER_SECONDS.
        "X402_FACILITATOR_TIMEOUT_SECONDS": _float("X402_FACILITATOR_TIMEOUT_SECONDS", 30.0),
        "X402_RECONCILE_AFTER_SECONDS": _int("X402_RECONCILE_AFTER_SECONDS", 120),
        # --- module gateway (app/services/gateway/calls.py, receipts.py) -------------
        "CATALOG_PATH": _env("CATALOG_PATH", str(BASE_DIR / "catalog" / "modules")),
        "CATALOG_CACHE_TTL": _float("CATALOG_CACHE_TTL", 5.0),
        "CALL_SWEEP_MARGIN_SECONDS": _float("CALL_SWEEP_MARGIN_SECONDS", 60.0),
        # PostgreSQL: answer a metered call once its receipt is signed and let the
        # process's finalize writer record it right after (money/charging.py); a
        # process killed in between loses that record and the sweep refunds the call
        # (never the customer's money: docs/performance.md, "What a crash can lose").
        # 0: write, then answer. On by default in every environment, the test suite
        # included (tests run what production runs; a test that reads a call's state
        # first waits for the writer: money/charging.py drain_finalizer).
        "CALL_FINALIZE_DEFERRED": _bool("CALL_FINALIZE_DEFERRED", True),
        # The writer lets the first queued finalization wait this long for others to
        # share its statement (0: write whatever is queued at once). The window is added
        # to the time an answered call stays pending (a replay of its key meanwhile: 409).
        "CALL_FINALIZE_BATCH_MS": _float("CALL_FINALIZE_BATCH_MS", 10.0),
        # PostgreSQL: the opens, chat holds and chat settles of a process that arrive
        # together share one statement each (money/charging.py GroupStatement). Each lock
        # wait of such a statement lasts at most this long (PostgreSQL's lock_timeout, per
        # wait), then its rows are written one by one outside the queue, waiting as long as
        # it takes: a group gives up a deadlock before PostgreSQL's deadlock_timeout (1 s)
        # looks for it, and holds up other accounts' rows behind one account's locked row
        # for about this long.
        "GROUP_LOCK_WAIT_MS": _int("GROUP_LOCK_WAIT_MS", 100),
        # An hour is rolled into usage_hourly this long after it ended (billing/usage_log.py).
        "USAGE_ROLL_MARGIN_SECONDS": _float("USAGE_ROLL_MARGIN_SECONDS", 300.0),
        # The same job adds each minute's calls to its hour this long after the minute
        # ended, so readers aggregate only the last minute or two of the call log; 0: off.
        "USAGE_TAIL_MARGIN_SECONDS": _float("USAGE_TAIL_MARGIN_SECONDS", 60.0),
        "PROVIDER_MAX_RESPONSE_BYTES": _int("PROVIDER_MAX_RESPONSE_BYTES", 5 * 1024 * 1024),
        "IDEMPOTENCY_TTL_SECONDS": _int("IDEMPOTENCY_TTL_SECONDS", 24 * 3600),
        # A replay of a key whose call is still in flight waits up to this long for the
        # stored answer (a call answered just now by another worker is stored within the
        # finalize window) before 409 idempotency_key_in_use; 0: answer 409 at once.
        "IDEMPOTENCY_IN_FLIGHT_WAIT_MS": _int("IDEMPOTENCY_IN_FLIGHT_WAIT_MS", 2000),
        # --- call log partitions (PostgreSQL; app/services/platform/partitions.py) ---
        # Whole months of module_calls / chat_completions older than this many full months
        # are dropped by the call-log-retention job; 0 keeps everything. Never the ledger.
        "CALL_LOG_RETENTION_MONTHS": _int("CALL_LOG_RETENTION_MONTHS", 0),
        "PARTITIONS_AHEAD_MONTHS": _int("PARTITIONS_AHEAD_MONTHS", 3),
        "RECEIPT_SIGNING_KEY": _env("RECEIPT_SIGNING_KEY"),
        "RECEIPT_RETIRED_PUBLIC_KEYS": _env("RECEIPT_RETIRED_PUBLIC_KEYS", ""),
        # --- chat completions (README "Chat completions") -----------------------
        "CHAT_HOST": _env("CHAT_HOST"),
        # browser origins allowed on the chat host (comma-separated exact origins, or *)
        "CHAT_CORS_ORIGINS": _env("CHAT_CORS_ORIGINS", ""),
        "CHAT_CATALOG": _env("CHAT_CATALOG", str(BASE_DIR / "catalog" / "models*.yaml")),
        # seconds between checks of the catalog files' modification times (re-read on change)
        "CHAT_CATALOG_CHECK_SECONDS": _float("CHAT_CATALOG_CHECK_SECONDS", 5.0),
        "CHAT_PROVIDERS": _chat_providers(production),
        "CHAT_SANDBOX_PROVIDER": _env("CHAT_SANDBOX_PROVIDER", "demo_llm"),
        "CHAT_REFERENCE_MODEL": _env("CHAT_REFERENCE_MODEL", "gpt-4o"),
        "CHAT_DEFAULT_MAX_TOKENS": _int("CHAT_DEFAULT_MAX_TOKENS", 4096),
        # a request without max_tokens: the output allowance the hold covers at the most
        # expensive candidate (each candidate may then generate what that hold pays for at
        # its own prices, up to CHAT_DEFAULT_MAX_TOKENS): docs/chat.md "Billing"
        "CHAT_DEFAULT_HOLD_OUTPUT_TOKENS": _int("CHAT_DEFAULT_HOLD_OUTPUT_TOKENS", 1024),
        "CHAT_MAX_ATTEMPTS": _int("CHAT_MAX_ATTEMPTS", 4),
        # Bring your own key: a completion served with the caller's own provider key is
        # charged this percent of its cost at the model's price (docs/chat.md); provider
        # keys are sealed with BYOK_ENCRYPTION_KEY (64 hex characters; unset: derived from
        # SECRET_KEY); BYOK_PREVIOUS_KEYS: comma-separated keys that sealed them before a
        # rotation, read only (`flask chat reseal-keys` seals every key under the current one)
        "CHAT_BYOK_FEE_PERCENT": _env("CHAT_BYOK_FEE_PERCENT", "5"),
        "BYOK_ENCRYPTION_KEY": _env("BYOK_ENCRYPTION_KEY"),
        "BYOK_PREVIOUS_KEYS": _env("BYOK_PREVIOUS_KEYS", ""),
        "CHAT_CONNECT_TIMEOUT": _float("CHAT_CONNECT_TIMEOUT", 3.0),
        "CHAT_READ_TIMEOUT": _float("CHAT_READ_TIMEOUT", 60.0),
        "CHAT_RETRY_AFTER_CAP": _float("CHAT_RETRY_AFTER_CAP", 2.0),
        "CHAT_COOLDOWN_SECONDS": _float("CHAT_COOLDOWN_SECONDS", 30.0),
        "CHAT_COOLDOWN_FAILURES": _int("CHAT_COOLDOWN_FAILURES", 3),
        "CHAT_COOLDOWN_WINDOW": _float("CHAT_COOLDOWN_WINDOW", 60.0),
        # seconds a worker reuses its view of the shared cool-downs before asking Redis again
        "CHAT_COOLDOWN_REFRESH": _float("CHAT_COOLDOWN_REFRESH", 1.0),
        "CHAT_HOLD_TTL_SECONDS": _float("CHAT_HOLD_TTL_SECONDS", 900.0),
        "SALES_EMAIL": _env("SALES_EMAIL", "sales@gateway.local"),
        # --- public endpoints (analytics, contact, newsletter, sign-up) -----------
        "FUNNEL_STEPS": _env("FUNNEL_STEPS",
                             "signup_started,signup_completed,key_created,first_call,payment_completed"),
        "TRACK_MAX_BODY_BYTES": _int("TRACK_MAX_BODY_BYTES", 8192),
        # Event inserts skip the WAL-flush wait (synchronous_commit off for that statement).
        "TRACK_ASYNC_COMMIT": _bool("TRACK_ASYNC_COMMIT", True),
        "TRACK_RETENTION_DAYS": _int("TRACK_RETENTION_DAYS", 90),
        "SIGNUP_TOKEN_TTL_HOURS": _int("SIGNUP_TOKEN_TTL_HOURS", 24),
        "NEWSLETTER_TOKEN_TTL_HOURS": _int("NEWSLETTER_TOKEN_TTL_HOURS", 48),
        # --- rate limits by name (app/ratelimits.py, the one mechanism) -----
        # the `limits` syntax ("5/minute;30/hour": every window applies), read at request
        # time, each overridable by the environment variable of the same name. Per client
        # IP unless named *_EMAIL_* (per e-mail address in the body). Per-key limits are
        # the plan's ``rate_limit`` in PLANS above (per account: all its keys and sessions).
        "AGENT_NONCE_RATE_LIMIT": _env("AGENT_NONCE_RATE_LIMIT", "30/minute"),
        "AGENT_SIGNIN_RATE_LIMIT": _env("AGENT_SIGNIN_RATE_LIMIT", "30/minute"),
        "TRACK_RATE_LIMIT": _env("TRACK_RATE_LIMIT", "1200/minute"),
        "CONTACT_RATE_LIMIT": _env("CONTACT_RATE_LIMIT", "5/minute;30/hour"),
        "CONTACT_EMAIL_RATE_LIMIT": _env("CONTACT_EMAIL_RATE_LIMIT", "3/hour"),
        "SUBSCRIBE_RATE_LIMIT": _env("SUBSCRIBE_RATE_LIMIT", "10/minute;60/hour"),
        "SUBSCRIBE_EMAIL_RATE_LIMIT": _env("SUBSCRIBE_EMAIL_RATE_LIMIT", "5/hour;10/day"),
        "SIGNUP_RATE_LIMIT": _env("SIGNUP_RATE_LIMIT", "5/minute;30/hour"),
        "SIGNUP_EMAIL_RATE_LIMIT": _env("SIGNUP_EMAIL_RATE_LIMIT", "3/hour;10/day"),
        # invitations to one address (POST /api/orgs/{id}/invites): no mail bombing through invites
        "INVITE_EMAIL_RATE_LIMIT": _env("INVITE_EMAIL_RATE_LIMIT", "5/hour"),
        "PUBLIC_PAGE_RATE_LIMIT": _env("PUBLIC_PAGE_RATE_LIMIT", "30/minute"),
        # per recipient mailbox (canonical: +tags and Gmail dots folded), for the mail
        # someone else can make us send (outbox.add_email(throttle=…)); SIGNUP_ and
        # SUBSCRIBE_EMAIL_RATE_LIMIT above also count their mails this way
        "CONSOLE_SIGNIN_EMAIL_RATE_LIMIT": _env("CONSOLE_SIGNIN_EMAIL_RATE_LIMIT", "5/hour;20/day"),
        "ALERT_CONFIRM_EMAIL_RATE_LIMIT": _env("ALERT_CONFIRM_EMAIL_RATE_LIMIT", "3/hour;10/day"),
        # --- OpenAPI (flask-smorest) ----------------------------------------
        "API_TITLE": "Metered API Gateway",
        "API_VERSION": "1.0.0",
        "OPENAPI_VERSION": "3.1.0",
        "OPENAPI_URL_PREFIX": "/",
        "OPENAPI_JSON_PATH": "openapi.json",
        "OPENAPI_SWAGGER_UI_PATH": "docs",
        "OPENAPI_SWAGGER_UI_URL": "/docs/assets/",
        # --- logging --------------------------------------------------------
        "LOG_LEVEL": _env("LOG_LEVEL", "INFO"),
        "LOG_JSON": _bool("LOG_JSON", production),
        "ACCESS_LOG": _bool("ACCESS_LOG", True),
        # --- observability --------------------------------------------------
        # Bearer token for /metrics; unset: /metrics answers loopback clients only.
        "METRICS_TOKEN": _env("METRICS_TOKEN"),
    }
    if overrides:
        cfg.update(overrides)
        if "REDIS_URL" in overrides and "JOBS_INLINE" not in overrides:
            cfg["JOBS_INLINE"] = overrides["REDIS_URL"] is None

    if production:
        ov = overrides or {}
        missing = [
            name
            for name, present in (
                ("SECRET_KEY", bool(cfg.get("SECRET_KEY"))),
                ("DATABASE_URL", _env("DATABASE_URL") is not None or "SQLALCHEMY_DATABASE_URI" in ov),
                ("REDIS_URL", bool(cfg.get("REDIS_URL"))),
            )
            if not present
        ]
        # One receipt key for every node: a receipt signed by one verifies against all.
        if not cfg.get("RECEIPT_SIGNING_KEY"):
            missing.append("RECEIPT_SIGNING_KEY")
        if cfg["PAYMENTS_PROCESSOR"] == "stripe":
            missing += [n for n in ("STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET") if not cfg.get(n)]
        if missing:
            raise ConfigError("production configuration incomplete, set: " + ", ".join(missing))
        if cfg["PAYMENTS_PROCESSOR"] not in ("", "stripe"):
            raise ConfigError(f"PAYMENTS_PROCESSOR={cfg['PAYMENTS_PROCESSOR']} cannot sell live credit in "
                              "production: set PAYMENTS_PROCESSOR=stripe (with STRIPE_SECRET_KEY and "
                              "STRIPE_WEBHOOK_SECRET) or leave it unset (live payments answer 503)")
    elif not cfg["SECRET_KEY"]:
        cfg["SECRET_KEY"] = "dev-only-not-secret"

    _check_byok(cfg)
    _check_payout_wallet(cfg)
    if not 0 <= cfg["RATELIMIT_LEASE_FRACTION"] <= 0.05:
        raise ConfigError(f"RATELIMIT_LEASE_FRACTION must be between 0 and 0.05 (a fraction of the "
                          f"limit), not {cfg['RATELIMIT_LEASE_FRACTION']}")
    if not 1 <= cfg["GROUP_LOCK_WAIT_MS"] <= 900:
        raise ConfigError(f"GROUP_LOCK_WAIT_MS must be between 1 and 900 (milliseconds, below "
                          f"PostgreSQL's deadlock_timeout), not {cfg['GROUP_LOCK_WAIT_MS']}")
    if not 0 <= cfg["CALL_FINALIZE_BATCH_MS"] <= 1000:
        raise ConfigError(f"CALL_FINALIZE_BATCH_MS must be between 0 and 1000 (milliseconds), "
                          f"not {cfg['CALL_FINALIZE_BATCH_MS']}")

    uri = cfg["SQLALCHEMY_DATABASE_URI"]
    if not uri and not production:
        # No DATABASE_URL: the embedded PostgreSQL under instance/, started by the first
        # process that needs it and found by every other one (embedded_pg's docstring).
        from app.services.platform import embedded_pg

        uri = embedded_pg.start(instance_dir / "pg")
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://"):]
    if uri.startswith("postgresql://"):
        uri = "postgresql+psycopg://" + uri[len("postgresql://"):]
    if not uri.startswith("postgresql+psycopg://"):
        raise ConfigError(f"DATABASE_URL must name a PostgreSQL database (postgresql://…), not {uri!r}")
    cfg["SQLALCHEMY_DATABASE_URI"] = uri
    cfg["SQLALCHEMY_ENGINE_OPTIONS"] = engine_options(cfg)
    return cfg


def _check_payout_wallet(cfg: dict) -> None:
    """``PAYOUT_WALLET_KEY``, when set: 64 hex characters (an optional ``0x``), a usable
    secp256k1 key. A malformed key refuses to start rather than leaving payouts unsent."""
    key = cfg.get("PAYOUT_WALLET_KEY")
    if not key:
        return
    body = key[2:] if key.lower().startswith("0x") else key
    try:
        ok = len(bytes.fromhex(body)) == 32 and 0 < int(body, 16) < 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError("PAYOUT_WALLET_KEY must be a secp256k1 private key: 64 hex characters (32 bytes)")


def _check_byok(cfg: dict) -> None:
    """``CHAT_BYOK_FEE_PERCENT``: a decimal from 0 to 100; ``BYOK_ENCRYPTION_KEY``: 64 hex
    characters (32 bytes) when set; ``BYOK_PREVIOUS_KEYS``: such keys, comma-separated."""
    from decimal import Decimal, InvalidOperation

    try:
        pct = Decimal(str(cfg["CHAT_BYOK_FEE_PERCENT"]))
    except InvalidOperation:
        pct = Decimal(-1)
    if not pct.is_finite() or not 0 <= pct <= 100:
        raise ConfigError(f"CHAT_BYOK_FEE_PERCENT must be a number from 0 to 100, not "
                          f"{cfg['CHAT_BYOK_FEE_PERCENT']!r}")
    key = cfg.get("BYOK_ENCRYPTION_KEY")
    if key and not _is_box_key(key):
        raise ConfigError("BYOK_ENCRYPTION_KEY must be 64 hex characters (32 bytes)")
    for n, old in enumerate(byok_previous_keys(cfg.get("BYOK_PREVIOUS_KEYS")), 1):
        if not _is_box_key(old):
            raise ConfigError(f"BYOK_PREVIOUS_KEYS: key {n} must be 64 hex characters (32 bytes)")


def _is_box_key(text: str) -> bool:
    try:
        return len(bytes.fromhex(text)) == 32
    except ValueError:
        return False


def byok_previous_keys(raw: str | None) -> list[str]:
    """The keys of ``BYOK_PREVIOUS_KEYS`` (comma-separated, spaces around them ignored)."""
    return [k.strip() for k in (raw or "").split(",") if k.strip()]
