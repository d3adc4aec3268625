"""Loading the app (every `flask` command, every gunicorn master, every test process that
starts one) does not import the libraries only some requests need: the OpenAI tokenizer,
eth-account, web3 (x402's EVM mechanism). Together they were about half of the app's load
time (docs/decisions.md §10); each is imported where it is used, and works there."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.apps import ROOT

HEAVY = ("bpe_openai", "eth_account", "web3", "x402.mechanisms.evm")

# In a fresh process: which of HEAVY are loaded after create_app(), then after a token
# count and a signature check.
PROBE = f"""
import json, sys
from app import create_app
create_app()
loaded = lambda: {{m: m in sys.modules for m in {HEAVY!r}}}
after_load = loaded()
from app.services.chat import tokens
from app.services.platform import crypto
counted = tokens.count_text("hello world", tokens.O200K)
recovered = crypto.recover_personal_message("x", bytes(65))
print(json.dumps({{"after_load": after_load, "after_use": loaded(), "counted": counted,
                  "recovered": recovered}}))
"""


def test_loading_the_app_imports_no_heavy_library_and_each_is_imported_where_used():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["after_load"] == {m: False for m in HEAVY}
    assert result["counted"] == 2 and result["recovered"] is None  # a malformed (r, s, v)
    assert result["after_use"]["bpe_openai"] and result["after_use"]["eth_account"]
