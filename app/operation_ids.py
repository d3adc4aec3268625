"""Every operation's ``operationId`` in the OpenAPI document, in one place.

Client generators (openapi-python-client, openapi-generator, the SDK builders) name a
function after its operation's ``operationId``; without one they fall back to the path
(``post_api_pay_methods_payment_method_id_default``). ``OPERATION_IDS`` maps a route's
Flask endpoint and HTTP method to its name; ``app.extensions.OperationIds`` (an apispec
plugin) writes it into the document. A route added without an entry here fails
``tests/test_openapi.py``, which names this file.

The rule (as Stripe's and OpenAI's documents name theirs, docs/decisions.md):

- lowerCamelCase, verb first, then the object in the singular (plural after ``list``):
  ``listKeys``, ``createKey``, ``getAccount``, ``deleteAlert``.
- The verbs: ``list`` (a collection), ``get`` (one object or a report), ``create`` (POST
  that makes an object), ``update`` (PATCH), ``set`` (PUT of a setting that replaces it),
  ``delete`` (it is gone); otherwise the action the route performs: ``rotateKey``,
  ``revokeKey``, ``cancelCheckout``, ``approveModule``, ``exportUsage``.
- The OpenAI- and Anthropic-compatible routes keep their providers' own names
  (``createChatCompletion``, ``listModels``, ``retrieveModel``, ``createMessage``), so a
  client generated from this document reads as the providers' SDKs do.
- HTML pages (e-mailed links, the sandbox checkout) are ``get…Page`` and ``submit…Page``.
- Unique across the document.

The names are part of the API contract: generated clients call them, so once published a
name never changes (a renamed route keeps its old name; only a new operation gets a new one).
"""
from __future__ import annotations

OPERATION_IDS: dict[tuple[str, str], str] = {
    # accounts, keys, provider keys
    ("accounts.AccountView", "GET"): "getAccount",
    ("accounts.BillingDetailsView", "GET"): "getBillingDetails",
    ("accounts.BillingDetailsSetView", "PUT"): "setBillingDetails",
    ("keys.KeysView", "GET"): "listKeys",
    ("keys.KeyCreateView", "POST"): "createKey",
    ("keys.KeyUpdateView", "PATCH"): "updateKey",
    ("keys.KeyView", "DELETE"): "revokeKey",
    ("keys.KeyRotateView", "POST"): "rotateKey",
    ("provider_keys.ProviderKeysView", "GET"): "listProviderKeys",
    ("provider_keys.ProviderKeyCreateView", "POST"): "createProviderKey",
    ("provider_keys.ProviderKeySettingsView", "PATCH"): "updateProviderKeySettings",
    ("provider_keys.ProviderKeyView", "DELETE"): "deleteProviderKey",
    # alerts
    ("alerts.AlertsView", "GET"): "listAlerts",
    ("alerts.AlertCreateView", "POST"): "createAlert",
    ("alerts.AlertEventsView", "GET"): "listAlertEvents",
    ("alerts.AlertView", "DELETE"): "deleteAlert",
    ("alert_pages.AlertConfirmPage", "GET"): "getAlertConfirmationPage",
    ("alert_pages.AlertConfirmPage", "POST"): "submitAlertConfirmationPage",
    # modules, receipts, usage
    ("modules.ModuleCallView", "POST"): "callModule",
    ("modules.ModuleListView", "GET"): "listModules",
    ("modules.ModuleDetailView", "GET"): "getModule",
    ("receipts.ReceiptKeysView", "GET"): "listReceiptKeys",
    ("usage.UsageCurrentView", "GET"): "getCurrentUsage",
    ("usage.UsageByModuleView", "GET"): "getUsageByModule",
    ("usage.UsageDailyView", "GET"): "getDailyUsage",
    ("usage.UsageExportView", "GET"): "exportUsage",
    # the chat host: OpenAI's and Anthropic's own names
    ("chat.ChatCompletionsView", "POST"): "createChatCompletion",
    ("chat.ModelsView", "GET"): "listModels",
    ("chat.ModelView", "GET"): "retrieveModel",
    ("chat.MessagesView", "POST"): "createMessage",
    ("chat.CountTokensView", "POST"): "countMessageTokens",
    # payments
    ("payments.CheckoutView", "POST"): "createCheckout",
    ("payments.CheckoutStateView", "GET"): "getCheckout",
    ("payments.CheckoutCancelView", "POST"): "cancelCheckout",
    ("payments.HistoryView", "GET"): "listPayments",
    ("payments.MethodView_", "POST"): "savePaymentMethod",
    ("payments.SavedMethodsView", "GET"): "listPaymentMethods",
    ("payments.SavedMethodDefaultView", "POST"): "setDefaultPaymentMethod",
    ("payments.SavedMethodView", "DELETE"): "deletePaymentMethod",
    ("payments.WebhookView", "POST"): "receivePaymentWebhook",
    ("payments.AutoTopupView", "GET"): "getAutoTopup",
    ("payments.AutoTopupSetView", "PUT"): "setAutoTopup",
    ("payments.AutoTopupDeleteView", "DELETE"): "deleteAutoTopup",
    ("payments.InvoiceListView", "GET"): "listInvoices",
    ("payments.InvoiceView", "GET"): "getInvoice",
    ("payments.InvoicePdfView", "GET"): "getInvoicePdf",
    ("sandbox.SandboxCheckoutView", "GET"): "getSandboxCheckoutPage",
    ("sandbox.SandboxCheckoutView", "POST"): "submitSandboxCheckoutPage",
    # wallet
    ("wallet.ConnectMessageView", "GET"): "getWalletConnectMessage",
    ("wallet.ConnectView", "POST"): "connectWallet",
    ("wallet.BalanceView", "GET"): "getWalletBalance",
    ("wallet.TransactionsView", "GET"): "listWalletTransactions",
    ("wallet.FundView", "POST"): "fundWallet",
    # operations
    ("ops.HealthView", "GET"): "getHealth",
    ("ops.ReadyView", "GET"): "getReadiness",
    ("ops.MetricsView", "GET"): "getMetrics",
    # product analytics, contact, e-mail lists
    ("tracking.TrackView", "POST"): "trackEvent",
    ("tracking.FunnelView", "GET"): "getFunnel",
    ("tracking.RecentView", "GET"): "listRecentEvents",
    ("tracking.SessionsView", "GET"): "listActiveSessions",
    ("contact.ContactView", "POST"): "contactSales",
    ("email.SubscribeView", "POST"): "subscribeEmail",
    ("email.UnsubscribeView", "POST"): "unsubscribeEmail",
    ("email_pages.ConfirmPage", "GET"): "getEmailConfirmationPage",
    ("email_pages.ConfirmPage", "POST"): "submitEmailConfirmationPage",
    ("email_pages.OneClickUnsubscribe", "GET"): "getUnsubscribePage",
    ("email_pages.OneClickUnsubscribe", "POST"): "unsubscribeOneClick",
    # sign-up
    ("signup.SignupView", "POST"): "startSignup",
    ("signup.SignupConfirmView", "POST"): "confirmSignup",
    ("signup_pages.SignupConfirmPage", "GET"): "getSignupConfirmationPage",
    ("signup_pages.SignupConfirmPage", "POST"): "submitSignupConfirmationPage",
    # agents
    ("agents.NonceView", "GET"): "getAgentNonce",
    ("agents.SignInView", "POST"): "signInAgent",
    ("agents.SiwxChallengeView", "GET"): "getSiwxChallenge",
    ("agents.SiwxSignInView", "POST"): "signInWithSiwx",
    ("agents.RegisterView", "POST"): "registerAgent",
    ("agents.BuildView", "POST"): "submitAgentBuild",
    ("agents.ListBuildsView", "GET"): "listAgentBuilds",
    ("agents.AgentUsageView", "GET"): "getAgentUsage",
    ("agents.AgentEarningsView", "GET"): "getAgentEarnings",
    ("agents.LeaderboardView", "GET"): "getAgentLeaderboard",
    ("agents.AgentFundView", "POST"): "fundAgent",
    ("agents.AgentView", "DELETE"): "disableAgent",
    # module review (admin)
    ("review.PendingView", "GET"): "listPendingModules",
    ("review.ApproveView", "POST"): "approveModule",
    ("review.RejectView", "POST"): "rejectModule",
    # MCP and discovery
    ("mcp.McpView", "POST"): "sendMcpRequest",
    ("discovery.X402DiscoveryView", "GET"): "getX402Discovery",
    ("discovery.McpServerCardView", "GET"): "getMcpServerCard",
    # organisations and audit
    ("orgs.OrgCreateView", "POST"): "createOrg",
    ("orgs.OrgListView", "GET"): "listOrgs",
    ("orgs.OrgView", "GET"): "getOrg",
    ("orgs.MemberListView", "GET"): "listOrgMembers",
    ("orgs.MemberUpdateView", "PATCH"): "updateOrgMember",
    ("orgs.MemberView", "DELETE"): "removeOrgMember",
    ("orgs.InviteCreateView", "POST"): "createOrgInvite",
    ("orgs.InviteListView", "GET"): "listOrgInvites",
    ("orgs.InviteView", "DELETE"): "revokeOrgInvite",
    ("orgs.InviteAcceptView", "POST"): "acceptOrgInvite",
    ("orgs.AuditView", "GET"): "listOrgAuditEvents",
    ("audit.OwnAuditView", "GET"): "listAuditEvents",
    # earnings and payouts
    ("payouts.OwnerEarningsView", "GET"): "getEarnings",
    ("payouts.ListPayoutsView", "GET"): "listPayouts",
    ("payouts.PayoutRequestView", "POST"): "createPayout",
    ("payouts.GetDestinationView", "GET"): "getPayoutDestination",
    ("payouts.DeleteDestinationView", "DELETE"): "deletePayoutDestination",
    ("payouts.StripeDestinationView", "PUT"): "setStripePayoutDestination",
    ("payouts.UsdcDestinationView", "PUT"): "setUsdcPayoutDestination",
}
