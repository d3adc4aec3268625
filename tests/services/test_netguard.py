"""SSRF guard for user-supplied URLs."""
from __future__ import annotations

import pytest

from app.services.platform.netguard import UnsafeURL, validate_url


@pytest.mark.parametrize("url", [
    "https://127.0.0.1/x", "https://localhost/x", "https://10.0.0.5/", "https://192.168.1.1/",
    "https://172.16.0.1/", "https://169.254.169.254/latest/meta-data", "https://[::1]/",
    "https://[::ffff:127.0.0.1]/", "https://2130706433/", "https://0x7f.1/", "https://0.0.0.0/",
    "https://100.64.0.1/", "https://[fe80::1]/", "https://[fc00::1]/",
    "http://93.184.216.34/", "ftp://example.com/", "https://user:pw@93.184.216.34/", "not a url", "https:///x",
])
def test_refused(app, url):
    with app.app_context():
        app.config["ALLOW_PRIVATE_URLS"] = False
        try:
            with pytest.raises(UnsafeURL):
                validate_url(url, field="target")
        finally:
            app.config["ALLOW_PRIVATE_URLS"] = True


def test_public_ip_accepted(app):
    with app.app_context():
        app.config["ALLOW_PRIVATE_URLS"] = False
        try:
            assert validate_url("https://93.184.216.34/hook") == "https://93.184.216.34/hook"
        finally:
            app.config["ALLOW_PRIVATE_URLS"] = True


def test_private_allowed_by_setting(app):
    with app.app_context():
        assert validate_url("http://127.0.0.1:9/x")
