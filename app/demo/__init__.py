"""Local demo services used by `make run` (never part of production traffic)."""
