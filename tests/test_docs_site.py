"""The documentation: the site builds with `mkdocs build --strict` (a broken link or anchor in docs/, or a link
from docs/ to a file of the repository that does not exist, fails it: scripts/mkdocs_hooks.py), every relative
link of the README reaches a file, and docs/cli.md is what scripts/cli_reference.py writes from the CLI's code."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_up_to_date():
    reference = _cli_reference()
    assert (ROOT / "docs" / "cli.md").read_text() == reference.render(), \
        "docs/cli.md is out of date: run `python scripts/cli_reference.py`"


def test_the_cli_reference_names_every_command_and_option():
    import typer

    from whaleflux.cli import app

    text = (ROOT / "docs" / "cli.md").read_text()
    root: Any = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="whaleflux")
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        assert f"## `whaleflux {name}`" in text
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert f"`{opt}" in text, f"{name} {opt}"
    assert "## `whaleflux test-gpu`" in text and "`--duration" in text


def test_every_relative_link_of_the_readme_reaches_a_file():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    broken = [t for t in targets if not re.match(r"^[a-z]+:", t) and not (ROOT / t.split("#")[0]).exists()]
    assert targets and not broken, f"README.md links to what does not exist: {broken}"
    assert len(text.splitlines()) <= 150, "the README is read in five minutes: at most about 150 lines"


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: it is in the [dev] extra "
                                         "(`python3 scripts/dev.py test` installs it)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "getting-started" / "index.html").exists()
    assert (tmp_path / "site" / "cli" / "index.html").exists()
