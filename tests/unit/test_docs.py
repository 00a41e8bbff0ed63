"""The docs users copy from stay true to the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]


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
    for page in PAGES:  # the examples moved to docs/ (the OpenAI client's glossary_id among them)
        assert '"g_..."' not in page.read_text(), page.name  # glossary ids are gl_...


def test_the_readme_is_a_front_page_that_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 360  # issue 27: one page from nothing to a first room; the rest in docs/
    for heading in ("## Two commands", "## Use it", "## Documentation", "## Architecture", "## Licences"):
        assert f"\n{heading}\n" in readme, heading
    for page in [*DOCS, ROOT / "docs" / "asyncapi.yaml"]:
        assert f"](docs/{page.name})" in readme, f"README does not link docs/{page.name}"


def test_every_relative_link_and_docs_reference_resolves() -> None:
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):  # [text](target)
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.name}: {target}")
        for ref in set(re.findall(r"(?<![\w/.])docs/[\w.-]+\.(?:md|yaml)", text)):  # `docs/x.md` in prose
            if not (ROOT / ref).exists():
                broken.append(f"{page.name}: {ref}")
    assert not broken, broken
