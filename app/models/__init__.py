"""Re-exports every model so Alembic and the app see the whole schema."""
from app.models.accounts import Account, ApiKey, KeySpend  # noqa: F401
from app.models.ratewindows import RateWindow  # noqa: F401
from app.models.ledger import LedgerEntry, LedgerTransaction  # noqa: F401
from app.models.catalog import Module, ModuleAction  # noqa: F401
from app.models.usage import UsageDaily, UsageHourly, UsageRollupState  # noqa: F401
from app.models.payments import BillingProfile, ExternalCredit, Payment, PaymentEvent, SavedMethod  # noqa: F401
from app.models.wallets import ChainCursor, Wallet, X402Authorization  # noqa: F401
from app.models.outbox import OutboxMessage  # noqa: F401
from app.models.tracking import TrackEvent  # noqa: F401
from app.models.public import ContactMessage, Subscription  # noqa: F401
from app.models.agents import Agent, AgentSession, AgentSettlement, ModuleSubmission  # noqa: F401
from app.models.alerts import Alert, AlertEvent  # noqa: F401
from app.models.calls import IdempotencyRecord, ModuleCall  # noqa: F401
from app.models.chat import ChatCompletion  # noqa: F401
from app.models.tokens import SingleUseToken  # noqa: F401
from app.models.orgs import MemberSpend, OrgAuditEntry, OrgInvite, OrgMember  # noqa: F401
from app.models.providerkeys import ProviderKey  # noqa: F401
from app.models.autotopup import AutoTopup, AutoTopupRun  # noqa: F401
from app.models.invoices import BillingDetails, Invoice, InvoiceCounter  # noqa: F401
from app.models.payouts import Payout, PayoutDestination  # noqa: F401
