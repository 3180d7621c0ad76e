"""YAML configuration files whose errors name the file, the line and the key.

Every configuration file of WhaleFlux (declared assets, price book, alert
rules) is read the same way: parse with PyYAML keeping each node's line,
validate with a pydantic model, and report *all* problems at once as
`FILE:LINE: key: problem` lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

KeyPath = tuple[Any, ...]
M = TypeVar("M", bound=BaseModel)


class ConfigFileError(ValueError):
    """A configuration was rejected; `errors` are `FILE:LINE: key: problem` lines."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class LocatedDocument:
    """A parsed YAML document and the line of every key and item in it."""

    doc: Any
    filename: str
    lines: dict[KeyPath, int]

    def where(self, path: KeyPath) -> str:
        """`FILE:LINE: key` for a key path such as ("assets", 0, "model")."""
        return f"{self.filename}:{self.line_of(path)}: {key_name(path)}"

    def line_of(self, path: KeyPath) -> int:
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return 1

    def problems(self, found: list[tuple[KeyPath, str]]) -> list[str]:
        return [f"{self.where(path)}: {msg}" for path, msg in found]


def key_name(path: KeyPath) -> str:
    """("assets", 0, "model") -> "assets[0].model"."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


# Limits on a configuration document (an upload or a file): its size, nesting and what its aliases expand to.
MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 200_000  # scalars, mappings and sequences, every alias counted as what it stands for
_FOREIGN_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
                 b"\xfe\xff": "UTF-16"}


class _Limited(yaml.SafeLoader):
    """PyYAML's safe loader with a nesting limit while composing (its composer recurses per level)."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _TooBig(Exception):
    pass


def _record_lines(node: yaml.Node, path: KeyPath, out: dict[KeyPath, int], budget: list[int]) -> None:
    """Each key's and item's line; an alias is walked as what it stands for, within MAX_DEPTH and MAX_NODES
    (a self-referencing alias, or aliases that multiply, would otherwise never end)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooBig(f"expands to more than {MAX_NODES} values (aliases)")
    if len(path) > MAX_DEPTH:
        raise _TooBig(f"nested deeper than {MAX_DEPTH} levels (a recursive alias?)")
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _TooBig("a key is not a plain value")
            sub = (*path, key_node.value)
            out[sub] = key_node.start_mark.line + 1
            _record_lines(value_node, sub, out, budget)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _record_lines(item, (*path, i), out, budget)


def decode_text(body: bytes, filename: str, error: type[ConfigFileError] = ConfigFileError) -> str:
    """An uploaded document's text: UTF-8 (a UTF-8 BOM is dropped); anything else is refused, naming the file."""
    if len(body) > MAX_BYTES:
        raise error([f"{filename}:1: (file): larger than {MAX_BYTES} bytes"])
    for bom, encoding in _FOREIGN_BOMS.items():
        if body.startswith(bom):
            raise error([f"{filename}:1: (file): {encoding} text (byte order mark); send UTF-8"])
    try:
        return body.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise error([f"{filename}:1: (file): not UTF-8 text (byte {exc.start})"]) from None


def parse(text: str, filename: str, error: type[ConfigFileError] = ConfigFileError,
          expect: str = "a mapping") -> LocatedDocument:
    """Parse one YAML document that must be a mapping (an empty document is an empty mapping).

    Refused, with the reason: more than MAX_BYTES, nesting deeper than MAX_DEPTH, aliases expanding
    to more than MAX_NODES values, characters YAML does not allow (NUL, a text that was not UTF-8).
    """
    if len(text) > MAX_BYTES:
        raise error([f"{filename}:1: (file): larger than {MAX_BYTES} bytes"])
    if "\ufffd" in text:
        raise error([f"{filename}:1: (file): not UTF-8 text"])
    try:
        loader = _Limited(text.removeprefix("\ufeff"))
    except yaml.YAMLError as exc:  # the reader's: a character YAML does not allow
        raise error([f"{filename}:1: (yaml): {' '.join(str(exc).split())}"]) from None
    lines: dict[KeyPath, int] = {}
    try:
        node = loader.get_single_node()
        if node is not None:
            _record_lines(node, (), lines, [MAX_NODES])
        doc = loader.construct_document(node) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise error([f"{filename}:{mark.line + 1 if mark else 1}: (yaml): {exc.problem or exc}"]) from None
    except yaml.YAMLError as exc:  # the reader's, on a later chunk
        raise error([f"{filename}:1: (yaml): {' '.join(str(exc).split())}"]) from None
    except _TooBig as exc:
        raise error([f"{filename}:1: (yaml): {exc}"]) from None
    except (ValueError, OverflowError) as exc:  # a scalar PyYAML cannot build, e.g. 2026-13-45 as a date
        raise error([f"{filename}:1: (yaml): a value that cannot be read: {exc}"]) from None
    finally:
        loader.dispose()
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise error([f"{filename}:1: (document): expected {expect}"])
    return LocatedDocument(doc, filename, lines)


def validate(
    located: LocatedDocument,
    model: type[M],
    error: type[ConfigFileError] = ConfigFileError,
    prepare: Callable[[Any], Any] | None = None,
    locate: Callable[[dict[str, Any]], KeyPath] | None = None,
) -> M:
    """Validate the document with `model`; every field error becomes a `FILE:LINE: key: problem` line.

    `locate` maps one pydantic error (a dict with `loc`, `type`, `msg`) to the key path
    to report, e.g. to drop a discriminated union's tag from `loc`; default: `loc` as is.
    """
    try:
        return model.model_validate(prepare(located.doc) if prepare else located.doc)
    except ValidationError as exc:
        errors = []
        for err in exc.errors(include_url=False, include_input=False):
            path = locate(dict(err)) if locate else tuple(err["loc"])
            errors.append(f"{located.where(path)}: {err['msg'].removeprefix('Value error, ')}")
        raise error(errors) from None


def read(path: str | Path, error: type[ConfigFileError] = ConfigFileError) -> str:
    """The file's text, or an error naming the file."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error([f"{path}:1: (file): cannot read: {exc.strerror or exc}"]) from None
