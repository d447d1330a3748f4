"""The docs: the MkDocs site builds with --strict, so no page, nav entry or link between pages is
broken, and the README stays a page a newcomer reads (its length and line widths bounded)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_site_builds_strictly_with_every_page_in_its_nav(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"),
                           "--config-file", str(ROOT / "mkdocs.yml")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]  # (mkdocs.yml's validation: pages out of the nav too)
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "openapi.json").is_file()


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    """About 200-300 lines, prose lines within ~120 characters, table cells a few words."""
    lines = (ROOT / "README.md").read_text().splitlines()
    prose, rows, code = [], [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            code = not code
        elif not code:
            (rows if line.lstrip().startswith("|") else prose).append(line)
    assert 150 <= len(lines) <= 320, len(lines)
    assert max(map(len, prose)) <= 120, max(prose, key=len)
    cells = [cell.strip() for row in rows for cell in row.strip().strip("|").split("|")]
    assert max(map(len, cells)) <= 80, max(cells, key=len)


def test_module_docstrings_say_what_and_why_and_link_the_designs() -> None:
    """A module's docstring is a few lines (designs live in docs/design.md) and names no issue of a tracker
    that is not in the repository (an upstream project's, "Triton issue N", is a reference)."""
    import ast
    import re

    long, numbered = [], []
    for path in sorted((ROOT / "src" / "pooltriton").rglob("*.py")):
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if len(docstring) > 1200:
            long.append(f"{path.name}: {len(docstring)} characters")
        numbered += [f"{path.name}: {m.group(0)}" for m in re.finditer(r"(?<!Triton )\bissues? \d+", text, re.I)]
    assert not long and not numbered, (long, numbered)
    design = (ROOT / "docs" / "design.md").read_text()
    for heading in ("## Admission by work", "## Self-healing", "## int8", "## Coalescing", "## The served tokenizer"):
        assert heading in design
