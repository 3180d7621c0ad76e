"""Where the bundled data files are. Paths only (no YAML, no pydantic): the CLI imports it for its defaults."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_FLEET = DATA_DIR / "fleets" / "small-demo.yaml"
DEFAULT_ASSETS = DATA_DIR / "small-demo-assets.yaml"
