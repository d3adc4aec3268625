"""Chains: network constants, the JSON-RPC client and USDC reads (EVM ``balanceOf`` /
``eth_getLogs``; Solana token accounts). RPC endpoints and USDC contracts come from
config (``RPC_URL_<CHAIN>``, ``USDC_CONTRACT_<CHAIN>``) with mainnet defaults."""
from __future__ import annotations

import itertools
import logging

from eth_utils import is_hex_address, to_checksum_address
from flask import current_app

from app.errors import InvalidRequest, ServiceUnavailable, Unprocessable
from app.services.platform import crypto, http

log = logging.getLogger(__name__)

EVM_CHAINS = ("base", "ethereum", "polygon")
CHAINS = EVM_CHAINS + ("solana",)
CHAIN_IDS = {"base": 8453, "ethereum": 1, "polygon": 137}
CAIP2 = {name: f"eip155:{cid}" for name, cid in CHAIN_IDS.items()}
USDC_DECIMALS = 6
# keccak256("Transfer(address,address,uint256)")
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
BALANCE_OF_SELECTOR = "0x70a08231"
# ERC-20 ``transfer(address,uint256)``
TRANSFER_SELECTOR = "0xa9059cbb"
# EIP-3009 (USDC FiatTokenV2): keccak256("AuthorizationUsed(address,bytes32)") and the
# selector of ``authorizationState(address,bytes32)``.
AUTHORIZATION_USED_TOPIC = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"
AUTHORIZATION_STATE_SELECTOR = "0xe94a0102"
# EIP-712 domain of the USDC contracts (FiatTokenV2) on the supported mainnets.
USDC_EIP712 = {"base": ("USD Coin", "2"), "ethereum": ("USD Coin", "2"), "polygon": ("USD Coin", "2")}

_ids = itertools.count(1)


def format_usdc(atomic: int) -> str:
    """Atomic USDC units (6 decimals) as decimal text with six places."""
    sign = "-" if atomic < 0 else ""
    atomic = abs(int(atomic))
    return f"{sign}{atomic // 10**USDC_DECIMALS}.{atomic % 10**USDC_DECIMALS:06d}"


def normalize_address(chain: str, address: str) -> tuple[str, str]:
    """(display address, unique key) for ``address`` on ``chain``. 422 ``unprocessable``
    when it is not one of ``chain``'s: the document states each family's shape (a request
    body per chain; the query's two parameters only one by one), not a checksum, a decoded
    length, or which family a query's ``chain`` wants."""
    address = (address or "").strip()
    if chain in EVM_CHAINS:
        if not is_hex_address(address):
            raise Unprocessable(f"address: not a 0x-prefixed 20-byte EVM address (chain {chain}).", param="address")
        checksum = to_checksum_address(address)
        body = address[2:]
        if body != body.lower() and body != body.upper() and address != checksum:
            raise Unprocessable("address: EIP-55 checksum mismatch.", param="address")
        return checksum, checksum.lower()
    if chain == "solana":
        if crypto.b58decode(address, crypto.ED25519_KEY_BYTES) is None:
            raise Unprocessable("address: not the canonical base58 of a 32-byte Solana public key.", param="address")
        return address, address
    raise InvalidRequest(f"chain: must be one of {', '.join(CHAINS)}.")


def usdc_contract(chain: str) -> str:
    return current_app.config["USDC_CONTRACTS"][chain]


def rpc_url(chain: str) -> str | None:
    return (current_app.config.get("RPC_URLS") or {}).get(chain)


def rpc(chain: str, method: str, params: list):
    """One JSON-RPC call; 503 ``service_unavailable`` when the node fails or errs."""
    url = rpc_url(chain)
    if not url:
        raise ServiceUnavailable(f"No JSON-RPC endpoint configured for {chain}.")
    try:
        resp = http.call("POST", url, purpose="rpc", json={"jsonrpc": "2.0", "id": next(_ids),
                                                           "method": method, "params": params},
                         timeout=float(current_app.config["RPC_TIMEOUT_SECONDS"]))
        resp.raise_for_status()
        body = resp.json()
    except (*http.ERRORS, ValueError) as exc:
        log.warning("rpc %s %s failed: %s", chain, method, exc)
        raise ServiceUnavailable(f"The {chain} JSON-RPC endpoint is unavailable.") from None
    if not isinstance(body, dict) or body.get("error") is not None or "result" not in body:
        log.warning("rpc %s %s error: %s", chain, method, body if isinstance(body, dict) else "?")
        raise ServiceUnavailable(f"The {chain} JSON-RPC endpoint returned an error.")
    return body["result"]


def _hex_int(value) -> int:
    if isinstance(value, int):
        return value
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ServiceUnavailable("Unexpected JSON-RPC result.")
    return int(value, 16) if value != "0x" else 0


def usdc_balance(chain: str, address: str) -> int:
    """On-chain USDC balance of ``address`` in atomic units."""
    if chain in EVM_CHAINS:
        data = BALANCE_OF_SELECTOR + address.lower()[2:].rjust(64, "0")
        return _hex_int(rpc(chain, "eth_call", [{"to": usdc_contract(chain), "data": data}, "latest"]))
    result = rpc(chain, "getTokenAccountsByOwner",
                 [address, {"mint": usdc_contract(chain)}, {"encoding": "jsonParsed"}])
    total = 0
    try:
        for acc in (result or {}).get("value", []):
            total += int(acc["account"]["data"]["parsed"]["info"]["tokenAmount"]["amount"])
    except (KeyError, TypeError, ValueError):
        raise ServiceUnavailable("Unexpected Solana token-account result.") from None
    return total


def block_number(chain: str) -> int:
    return _hex_int(rpc(chain, "eth_blockNumber", []))


def transfer_logs(chain: str, to_address: str, from_block: int, to_block: int) -> list[dict]:
    """USDC ``Transfer`` logs to ``to_address`` in [from_block, to_block], parsed to
    ``{tx, log_index, block, from, to, value}``; removed (re-orged) logs are skipped."""
    topic_to = "0x" + to_address.lower()[2:].rjust(64, "0")
    logs = rpc(chain, "eth_getLogs", [{
        "address": usdc_contract(chain), "fromBlock": hex(from_block), "toBlock": hex(to_block),
        "topics": [TRANSFER_TOPIC, None, topic_to],
    }]) or []
    out = []
    for item in logs:
        try:
            if item.get("removed"):
                continue
            topics = item["topics"]
            if topics[0].lower() != TRANSFER_TOPIC or item["address"].lower() != usdc_contract(chain).lower():
                continue
            out.append({
                "tx": item["transactionHash"].lower(), "log_index": _hex_int(item["logIndex"]),
                "block": _hex_int(item["blockNumber"]),
                "from": to_checksum_address("0x" + topics[1][-40:]),
                "to": to_checksum_address("0x" + topics[2][-40:]),
                "value": _hex_int(item["data"]),
            })
        except (KeyError, IndexError, TypeError, AttributeError):
            log.warning("skipping malformed log on %s: %r", chain, item)
    return out


def transfer_data(to_address: str, atomic: int) -> str:
    """The call data of an ERC-20 ``transfer(to, atomic)``."""
    return TRANSFER_SELECTOR + to_address.lower()[2:].rjust(64, "0") + format(int(atomic), "064x")


def chain_id(chain: str) -> int:
    return _hex_int(rpc(chain, "eth_chainId", []))


def gas_price(chain: str) -> int:
    return _hex_int(rpc(chain, "eth_gasPrice", []))


def transaction_count(chain: str, address: str, block: str = "latest") -> int:
    """``address``'s nonce: transactions mined (``latest``) or also waiting (``pending``)."""
    return _hex_int(rpc(chain, "eth_getTransactionCount", [address, block]))


def send_raw_transaction(chain: str, raw: str):
    """Broadcast a signed transaction (``0x`` hex). 503 when the node refuses or fails."""
    return rpc(chain, "eth_sendRawTransaction", [raw])


def receipt(chain: str, tx: str) -> dict | None:
    """The transaction's receipt, or None when the node does not know it."""
    out = rpc(chain, "eth_getTransactionReceipt", [tx])
    return out if isinstance(out, dict) else None


def receipt_block(got: dict) -> int:
    """The block a receipt's transaction was mined in."""
    return _hex_int(got.get("blockNumber", "0x0"))


def succeeded(got: dict | None) -> bool:
    """A receipt of a transaction that did not revert."""
    return bool(got) and _hex_int(got.get("status", "0x0")) == 1


def receipt_transfers(chain: str, got: dict | None) -> list[tuple[str, str, int]]:
    """(from, to, value) of every USDC ``Transfer`` the chain's USDC contract emitted in a
    receipt (checksum addresses, atomic units)."""
    out = []
    for item in (got or {}).get("logs") or []:
        try:
            topics = item["topics"]
            if topics[0].lower() == TRANSFER_TOPIC and item["address"].lower() == usdc_contract(chain).lower():
                out.append((to_checksum_address("0x" + topics[1][-40:]), to_checksum_address("0x" + topics[2][-40:]),
                            _hex_int(item["data"])))
        except (KeyError, IndexError, TypeError, AttributeError, ServiceUnavailable):
            log.warning("skipping malformed receipt log on %s: %r", chain, item)
    return out


def authorizations_used(chain: str, got: dict | None) -> list[tuple[str, str]]:
    """(authorizer, nonce) of every EIP-3009 ``AuthorizationUsed`` event the USDC contract
    emitted in a receipt: a transfer made by ``transferWithAuthorization`` (x402)."""
    out = []
    for item in (got or {}).get("logs") or []:
        try:
            topics = item["topics"]
            if topics[0].lower() == AUTHORIZATION_USED_TOPIC \
                    and item["address"].lower() == usdc_contract(chain).lower():
                out.append((to_checksum_address("0x" + topics[1][-40:]), topics[2].lower()))
        except (KeyError, IndexError, TypeError, AttributeError):
            log.warning("skipping malformed receipt log on %s: %r", chain, item)
    return out


def authorization_state(chain: str, authorizer: str, nonce: str) -> bool:
    """EIP-3009 ``authorizationState``: True once the authorization was used on chain."""
    data = AUTHORIZATION_STATE_SELECTOR + authorizer.lower()[2:].rjust(64, "0") + nonce.lower()[2:].rjust(64, "0")
    return _hex_int(rpc(chain, "eth_call", [{"to": usdc_contract(chain), "data": data}, "latest"])) != 0
