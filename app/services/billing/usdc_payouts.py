"""The USDC payout rail (docs/payments.md#payouts): the operator's payout wallet
(``PAYOUT_WALLET_KEY``) signs an ERC-20 ``transfer(to, amount)`` of the chain's USDC
(6 decimals: one atomic unit per ledger micro) as a raw EIP-155 transaction, sent with
``eth_sendRawTransaction`` and confirmed by its receipt (``chains.receipt``).

``payouts`` drives it through the payout state machine:

* ``prepare`` (before the claim, outside any transaction): the chain id, gas price and the
  wallet's pending nonce, read from the node;
* ``sign`` (inside the claim's unit of work): the nonce is the larger of the node's pending
  nonce and one above the highest nonce a payout of this wallet holds on the chain (under a
  transaction advisory lock, and a unique index), the transaction is signed and its nonce,
  hash and raw bytes are stored on the payout row with the ``sending`` claim;
* ``outcome`` (after the commit): the stored raw transaction is (re)sent, then the chain is
  read: a receipt confirmed by ``CHAIN_CONFIRMATIONS`` blocks that succeeded and shows the
  USDC contract's ``Transfer(wallet, destination, amount)`` is ``paid`` (ref = the hash),
  one that reverted (or moved nothing) is ``failed``; no receipt while the wallet's mined
  nonce is past ours means another transaction took the nonce and ours can never land
  (``failed``, ``dropped``); anything else is unknown (``None``): the payout stays
  ``sending`` and the recovery asks again with the same transaction. A second transfer is
  signed only for a new attempt, after the previous one is known not to have paid.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from flask import current_app
from sqlalchemy import func, select

from app.errors import DomainError
from app.extensions import db
from app.models import Payout
from app.services.billing import chains
from app.services.billing.processors import TransferResult
from app.services.platform.uow import lock_key

log = logging.getLogger(__name__)


def wallet():
    """The payout wallet (an eth-account ``LocalAccount``), or None when not configured."""
    key = current_app.config.get("PAYOUT_WALLET_KEY")
    if not key:
        return None
    from eth_account import Account  # about 1 s to import: only where a payout is signed

    return Account.from_key(key)


@dataclass
class Prepared:
    chain_id: int
    gas_price: int
    pending_nonce: int


def prepare(chain: str) -> Prepared:
    """What signing needs from the node; 503 ``service_unavailable`` when it cannot say."""
    return Prepared(chains.chain_id(chain), chains.gas_price(chain),
                    chains.transaction_count(chain, wallet().address, "pending"))


def sign(p: Payout, prepared: Prepared) -> None:
    """Give attempt ``p.attempts`` its one signed transaction: a fresh nonce, the signed
    ``transfer``, stored on the row (joins the caller's unit of work, which commits it with
    the ``sending`` claim)."""
    acct = wallet()
    lock_key(f"payout_nonce:{p.chain}:{acct.address.lower()}")
    highest = db.session.execute(select(func.max(Payout.tx_nonce)).where(
        Payout.chain == p.chain, Payout.tx_from == acct.address)).scalar_one()
    nonce = max(prepared.pending_nonce, -1 if highest is None else highest + 1)
    signed = acct.sign_transaction({
        "chainId": prepared.chain_id, "nonce": nonce, "gasPrice": prepared.gas_price,
        "gas": int(current_app.config["PAYOUT_GAS_LIMIT"]), "to": chains.usdc_contract(p.chain), "value": 0,
        "data": chains.transfer_data(p.target, p.amount_micros)})
    p.tx_from, p.tx_nonce = acct.address, nonce
    p.tx_hash, p.tx_raw = signed.hash.to_0x_hex(), signed.raw_transaction.to_0x_hex()


def outcome(p: Payout) -> TransferResult | None:
    """(Re)send the attempt's transaction and read its fate; None while unknown."""
    try:
        chains.send_raw_transaction(p.chain, p.tx_raw)
    except DomainError as exc:  # already known, already mined, or the node is down: read on
        log.info("payout %s: sending %s: %s", p.id, p.tx_hash, exc.message)
    mined = chains.transaction_count(p.chain, p.tx_from, "latest")  # before the receipt: no race
    got = chains.receipt(p.chain, p.tx_hash)
    if got is None:
        if mined > p.tx_nonce:
            return TransferResult("failed", code="dropped", message=(
                f"transaction {p.tx_hash} was replaced: nonce {p.tx_nonce} of {p.tx_from} was used by another"))
        return None
    if chains.block_number(p.chain) - chains.receipt_block(got) < int(current_app.config["CHAIN_CONFIRMATIONS"]):
        return None  # mined, not yet confirmed
    if not chains.succeeded(got):
        return TransferResult("failed", code="reverted", message=f"transaction {p.tx_hash} reverted")
    if not moved(p.chain, got, p.tx_from, p.target, p.amount_micros):
        # mined without moving the USDC (e.g. the node is not the chain the contract is on):
        # final, nothing left the wallet, so still owed
        return TransferResult("failed", code="no_transfer", message=(
            f"transaction {p.tx_hash} did not transfer USDC {chains.format_usdc(p.amount_micros)} to {p.target}"))
    return TransferResult("paid", p.tx_hash)


def moved(chain: str, got: dict | None, sender: str, to: str, atomic: int) -> bool:
    """The receipt succeeded and shows the USDC contract's ``Transfer(sender, to, atomic)``."""
    return chains.succeeded(got) and (sender, to, int(atomic)) in chains.receipt_transfers(chain, got)
