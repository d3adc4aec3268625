"""Organisations (teams, issue 37): several people share one balance.

An organisation is a payer: an ``accounts`` row of kind ``org`` with its own live and test
balances in the one ledger, funded by every existing rail by its id. Its members are
people's own accounts (``org_members``: their role); an organisation key is
an ``api_keys`` row whose ``account_id`` is the organisation (it pays, through the money
engine's ``account_id``) and whose ``member_account_id`` is the member who owns it (the
calls' ``actor`` is the key). docs/teams.md.

* ``roles``: what each role may do (the table), and the 403 ``org_role_required`` naming
  the roles an action needs; ``app.auth.check_scopes`` applies it to organisation keys on
  every route.
* ``orgs``: entry points (each one unit of work): ``create_org``, ``list_orgs``,
  ``list_members``, ``update_member``, ``remove_member``; the helpers the other areas call
  to act in an organisation (``payer``, ``key_owner``, ``visible_key``).
* ``audit``: the append-only audit log, written in the unit of work of each change.
"""
