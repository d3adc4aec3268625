"""The money engine: every money operation, written once."""
