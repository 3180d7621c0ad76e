"""MkDocs hook (mkdocs.yml `hooks:`): links from a docs page to a file of the repository outside docs/ (a bench
script, deploy/README.md, the README), or to a folder (docs/events/), are checked here, since MkDocs knows only the
pages and files of docs/: a target that does not exist is a warning, so `mkdocs build --strict` fails on it as it
does on a broken link inside docs/. The link is then rewritten to the file on `extra.source_url` (the repository's
browsable tree) when mkdocs.yml sets it, else to the path in the repository, shown as code."""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.whaleflux")

LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    source_url = (config.get("extra") or {}).get("source_url")
    page_dir = posixpath.dirname(page.file.src_uri)

    def outside(match: re.Match[str]) -> str:
        target = match.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join("docs", page_dir, path))
        inside = resolved.startswith("docs/")
        if not resolved.startswith("../") and resolved != ".." and (not inside or (root / resolved).is_dir()):
            if not (root / resolved).exists():
                log.warning("Doc file '%s' contains a link to '%s': %s does not exist in the repository",
                            page.file.src_uri, target, resolved)
                return match.group(0)
            if source_url:
                return f"[{match.group('text')}]({source_url.rstrip('/')}/{resolved}{'#' + anchor if anchor else ''})"
            return f"{match.group('text')} (`{resolved}`)" if match.group("text").strip("`") != resolved \
                else f"`{resolved}`"
        return match.group(0)

    return LINK.sub(outside, markdown)
