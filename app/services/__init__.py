"""Domain services: each owns its transaction and raises DomainError subclasses."""
