"""Listening to SQLAlchemy's statement events in a test without changing what the code
under test does afterwards."""
from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import event


_UNSET = object()


@contextmanager
def listening(target, *listeners):
    """``event.listen(target, name, fn)`` for each ``(name, fn)`` while the block runs.

    Afterwards ``target._has_events`` is put back as it was: SQLAlchemy sets it on the
    first listener and never resets it, and ``uow.execute_rows`` sends a statement
    straight to the driver's cursor only while nothing listens — so without this, every
    later test would run the hot path's statements through ``exec_driver_sql`` instead of
    the path production runs. (Not for overlapping listeners on one target.)"""
    own = vars(target)  # an engine's own flag, or the class's (class-level listeners)
    had = own.get("_has_events", _UNSET)
    for name, fn in listeners:
        event.listen(target, name, fn)
    try:
        yield
    finally:
        for name, fn in listeners:
            event.remove(target, name, fn)
        if had is _UNSET:  # the instance had none: the class's flag shows through again
            del target._has_events
        else:
            target._has_events = had
