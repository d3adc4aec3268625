"""Chat host: OpenAI-compatible ``/v1/chat/completions`` (SPEC endpoint 34).

Owns ``completions`` (validate, route, hold, call with failover, settle), ``catalog``
(models, providers, prices from ``catalog/models*.yaml``), ``providers`` (OpenAI and
Anthropic adapters) and ``cooldown`` (provider cool-down shared through Redis).

Transactions: the hold and the settlement are each their own unit of work (in
``app.services.money.holds``); no transaction is open while a provider is called.
"""
