"""Local demo servers used by the embedded default (``make run``) and by tests."""
