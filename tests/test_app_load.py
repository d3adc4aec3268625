"""Loading the app (every `flask` command, every gunicorn master, every test process that
starts one) does not import the libraries only some requests need: the OpenAI tokenizer,
eth-account, web3 (x402's EVM mechanism). Together they were about half of the app's load
time (docs/decisions.md §10); each is imported where it is used, and still works there."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.apps import ROOT

HEAVY = ("bpe_openai", "eth_account", "web3", "x402.mechanisms.evm")


def _loaded_after(code: str) -> dict[str, bool]:
    probe = (
        "import json, sys\n"
        "from app import create_app\n"
        "app = create_app()\n"
        f"{code}\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_loading_the_app_imports_no_heavy_library():
    assert _loaded_after("") == {m: False for m in HEAVY}


def test_each_is_imported_where_it_is_used():
    from app.services.chat import tokens
    from app.services.platform import crypto

    assert tokens.count_text("hello world", tokens.O200K) == 2
    assert crypto.recover_personal_message("x", b"\x00" * 65) is None  # malformed (r, s, v)
    loaded = _loaded_after(
        "from app.services.chat import tokens\n"
        "tokens.count_text('hello', tokens.CL100K)\n"
        "from app.services.platform import crypto\n"
        "crypto.recover_personal_message('x', bytes(65))\n")
    assert loaded["bpe_openai"] and loaded["eth_account"]
