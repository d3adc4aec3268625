"""Listening to SQLAlchemy's statement events for the length of a block."""
from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import event


@contextmanager
def listening(target, *listeners):
    """``event.listen(target, name, fn)`` for each ``(name, fn)`` while the block runs,
    removed afterwards (also when the block fails), so later tests run the statements'
    production path again; meanwhile ``uow.run_one``'s statements go through SQLAlchemy's
    execution (``uow.statement_events``), so the listeners see them too."""
    from app.services.platform.uow import statement_events

    for name, fn in listeners:
        event.listen(target, name, fn)
    try:
        with statement_events():
            yield
    finally:
        for name, fn in listeners:
            event.remove(target, name, fn)
