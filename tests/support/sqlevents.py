"""Listening to SQLAlchemy's statement events for the length of a block."""
from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import event


@contextmanager
def listening(target, *listeners):
    """``event.listen(target, name, fn)`` for each ``(name, fn)`` while the block runs,
    removed afterwards (also when the block fails), so later tests run the statements'
    production path again (``uow.execute_rows`` goes to the driver's cursor only while
    nothing listens)."""
    for name, fn in listeners:
        event.listen(target, name, fn)
    try:
        yield
    finally:
        for name, fn in listeners:
            event.remove(target, name, fn)
