#!/usr/bin/env python3
"""The project's two commands, needing only Python 3.11+:

    python3 scripts/dev.py run    # install into .venv, then `whaleflux up`
    python3 scripts/dev.py test   # install into .venv, validate docker-compose.yml, run the test suite

Extra arguments go to `whaleflux up` or to pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
BIN = VENV / "bin"


def install() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"WhaleFlux needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    subprocess.run([BIN / "python", "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([BIN / "python", "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], check=True)


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
