"""The published error-code table (``x-error-codes``) is generated from the DomainError
subclasses: every class's code is published, every published code has a class, and each
code is declared by one class only (one meaning per code)."""
from __future__ import annotations

from collections import Counter

from app.errors import DomainError, error_classes, error_codes


def test_every_error_class_code_is_published_and_every_published_code_has_a_class(app, client):
    published = client.get("/openapi.json").get_json()["x-error-codes"]
    classes = [cls for cls in error_classes() if cls.__module__.startswith("app.")]
    assert {cls.code for cls in classes} | {DomainError.code} == set(published)
    for cls in classes:
        assert published[cls.code]["status"] == cls.status, cls
    assert app.extensions["error_codes"] == error_codes()


def test_each_code_is_declared_once_with_a_description():
    error_codes()  # imports every module under app/
    declaring = [cls for cls in error_classes() if "code" in vars(cls) and cls.__module__.startswith("app.")]
    twice = [code for code, n in Counter(cls.code for cls in declaring).items() if n > 1]
    assert twice == []
    assert all(cls.description for cls in declaring), [cls for cls in declaring if not cls.description]
    # a subclass that keeps its parent's code keeps its parent's status too (same meaning)
    for cls in error_classes():
        if "code" not in vars(cls) and cls.__bases__[0] is not DomainError:
            assert cls.status == cls.__bases__[0].status, cls
