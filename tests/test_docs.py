"""The docs users copy from stay true to the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_settings_page_is_generated_from_config_and_current() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "settings_doc.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    page = (ROOT / "docs" / "settings.md").read_text()
    for setting in ("LINGUAFUSION_MODELS__LLM", "LINGUAFUSION_SERVER__PORT", "LINGUAFUSION_STATE__REDIS_URL",
                    "LINGUAFUSION_MODELS__WORKER_LOOP_CRASHES"):
        assert f"`{setting}`" in page
    assert "|  |" not in page  # every setting says what it does


def test_the_readme_names_what_users_type() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "PORT=" in readme and "docs/settings.md" in readme and ".venv/bin/linguafusion" in readme
    assert '"g_..."' not in readme  # glossary ids are gl_...
