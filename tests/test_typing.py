"""kbroker and protocol type-check: mypy, configured by [tool.mypy] in pyproject.toml, reports no errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_mypy_reports_no_errors() -> None:
    # No arguments: the files and settings come from pyproject.toml, as for `mypy` run by hand.
    result = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, f"mypy failed:\n{result.stdout}{result.stderr}"
    assert "Success: no issues found" in result.stdout, result.stdout
