"""The security suite (docs/security.md): one parametrized test per attack class."""
