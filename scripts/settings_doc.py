"""Write docs/settings.md from src/lingua_fusion/config.py: every setting, its environment variable, type,
default and the comment beside it. `python scripts/settings_doc.py` rewrites it; `--check` exits 1 when it is out
of date (tests/unit/test_docs.py runs that)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "src" / "lingua_fusion" / "config.py"
OUT = ROOT / "docs" / "settings.md"


def _comment(lines: list[str], node: ast.AnnAssign) -> str:
    """The field's trailing comment, else the comment block above it (which speaks for the fields under it up
    to a blank line)."""
    line = lines[node.lineno - 1]
    if "  # " in line:
        return line.split("  # ", 1)[1].strip()
    i = node.lineno - 2
    while i >= 0 and lines[i].strip() and not lines[i].strip().startswith("#"):
        i -= 1  # fields of the same group, above this one
    above: list[str] = []
    while i >= 0 and lines[i].strip().startswith("#"):
        above.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(above)


def render() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from lingua_fusion.config import Settings

    source = CONFIG.read_text()
    lines = source.splitlines()
    classes = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}
    defaults = Settings.model_construct()
    out = ["# Settings", "",
           "Generated from `src/lingua_fusion/config.py` by `python scripts/settings_doc.py`; do not edit by hand.",
           "Every setting comes from the environment: `LINGUAFUSION_<SECTION>__<NAME>` (nested with `__`), e.g.",
           "`LINGUAFUSION_MODELS__LLM=false` leaves the tiny LLM out. Lists and objects are JSON.", ""]
    top = classes["Settings"]
    for node in top.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        name = node.target.id
        section = getattr(defaults, name, None)
        fields = getattr(type(section), "model_fields", None) if section is not None else None
        if fields and type(section).__name__ in classes:
            out += [f"## `{name}`", "", "| environment variable | type | default | what it does |", "|---|---|---|---|"]
            for f in classes[type(section).__name__].body:
                if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name):
                    fname = f.target.id
                    default = getattr(section, fname, None)
                    out.append(f"| `LINGUAFUSION_{name.upper()}__{fname.upper()}` | `{ast.unparse(f.annotation)}` "
                               f"| `{_shown(default)}` | {_comment(lines, f)} |")
            out.append("")
        else:
            out += [f"- `LINGUAFUSION_{name.upper()}` (`{ast.unparse(node.annotation)}`, default "
                    f"`{_shown(section)}`): {_comment(lines, node)}", ""]
    return "\n".join(out).rstrip() + "\n"


def _shown(value: object) -> str:
    """A default as a reader's machine has it: the XDG directories by name, not this machine's paths."""
    from lingua_fusion.config import default_cache_dir, default_state_dir

    text = str(value).replace("|", "\\|")
    text = text.replace(str(default_cache_dir()), "$XDG_CACHE_HOME/linguafusion (~/.cache/linguafusion)")
    return text.replace(str(default_state_dir()), "$XDG_DATA_HOME/linguafusion (~/.local/share/linguafusion)")


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/settings_doc.py", file=sys.stderr)
            sys.exit(1)
    else:
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}")
