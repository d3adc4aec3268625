"""The package is type-checked: ``mypy --strict`` over its sources finds nothing (issue 20)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gateway_client"


def test_mypy_strict_is_clean():
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          "--cache-dir", "/dev/null", str(SRC)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
