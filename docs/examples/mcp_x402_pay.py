"""Pay for a gateway MCP tool call by x402 with x402's own MCP client, unmodified (docs/mcp.md,
"Paying").

x402 2.25's ``x402.mcp.x402MCPSession`` is written against mcp 1.x's ``ClientSession``, so
this runs in its own environment:

    python3 -m venv x402-mcp && x402-mcp/bin/pip install "x402[evm]==2.25.0" "mcp<2"
    GATEWAY_KEY=svc_sess_… x402-mcp/bin/python docs/examples/mcp_x402_pay.py

``GATEWAY_KEY``: a credential of the account that pays (a ``svc_live_`` key or an agent's
``svc_sess_`` session), typically one with an empty balance; ``GATEWAY_URL`` defaults to
``http://127.0.0.1:8000`` (``make run``). ``PAYER_PRIVATE_KEY``: the wallet that signs the
EIP-3009 authorization; without it a fresh one is made, which is enough against ``make
run``'s demo facilitator (no USDC moves) and never enough against a real one.
"""
import asyncio
import json
import os

from eth_account import Account
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from x402 import x402Client
from x402.mcp import x402MCPSession
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

URL = os.environ.get("GATEWAY_URL", "http://127.0.0.1:8000").rstrip("/") + "/mcp"
wallet = (Account.from_key(os.environ["PAYER_PRIVATE_KEY"]) if os.environ.get("PAYER_PRIVATE_KEY")
          else Account.create())
payer = register_exact_evm_client(x402Client(), EthAccountSigner(wallet))


async def main() -> None:
    headers = {"Authorization": f"Bearer {os.environ['GATEWAY_KEY']}"}
    async with streamablehttp_client(URL, headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            mcp = x402MCPSession(session, payer)
            res = await mcp.call_tool("text__word_count", {"text": "paid by x402 over MCP"})
            print("paid:", res.payment_made, "error:", res.is_error)
            print("settlement:", res.payment_response)       # x402's SettleResponse
            print("result:", res.content[0].text)
            # the gateway's call response, its signed receipt included
            print("receipt:", json.dumps(res.raw_result.structuredContent["receipt"]))


asyncio.run(main())
