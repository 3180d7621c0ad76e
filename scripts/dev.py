#!/usr/bin/env python3
"""The project's two commands, needing only Python 3.11+:

    python3 scripts/dev.py run    # install into .venv, then `whaleflux up`
    python3 scripts/dev.py test   # install into .venv, validate docker-compose.yml, run the test suite

Extra arguments go to `whaleflux up` or to pytest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("WHALEFLUX_VENV", ROOT / ".venv"))
BIN = VENV / "bin"
STAMP = VENV / ".whaleflux-installed"


def wanted_stamp() -> str:
    """What the install depends on: the dependency list and package layout (pyproject.toml), this Python, this
    checkout. The install is editable, so changes to the code itself need no reinstall."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update(f"{sys.version}|{ROOT}".encode())
    return digest.hexdigest()


def install() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"WhaleFlux needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    stamp = wanted_stamp()
    if (BIN / "python").exists() and STAMP.exists() and STAMP.read_text() == stamp:
        print(f"{VENV} is up to date with pyproject.toml (delete {STAMP.name} in it to reinstall)", flush=True)
        return
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("installing WhaleFlux and its pinned dependencies (the first time takes a minute or two)", flush=True)
    # pip's own progress (what it collects, downloads and installs) is shown, not hidden with -q.
    subprocess.run([BIN / "python", "-m", "pip", "install", "--disable-pip-version-check", "--upgrade", "pip"],
                   check=True)
    subprocess.run([BIN / "python", "-m", "pip", "install", "--disable-pip-version-check", "-e", f"{ROOT}[test]"],
                   check=True)
    STAMP.write_text(stamp)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        print(__doc__)
        return 2
    command, extra = sys.argv[1], sys.argv[2:]
    install()
    os.chdir(ROOT)
    if command == "run":
        os.execv(BIN / "whaleflux", [str(BIN / "whaleflux"), "up", *extra])
    if shutil.which("bash"):
        subprocess.run(["bash", str(ROOT / "scripts" / "check_compose.sh")], check=True)
    return subprocess.run([BIN / "python", "-m", "pytest", "-q", *extra]).returncode


if __name__ == "__main__":
    sys.exit(main())
