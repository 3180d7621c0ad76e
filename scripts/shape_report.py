#!/usr/bin/env python3
"""The figures of issue #15 ("one shape for every service"), in one command:

    python3 scripts/shape_report.py [--top N]

- the largest modules and functions outside tests (lines; a function counts from its first decorator to its end,
  so a method's lines are inside its class's and an inner function's inside its outer's);
- raw Redis calls outside store modules (store modules: files named store.py or *_store.py, or inside a store/
  package);
- ruff's result, and mypy's errors on shared/ plus the strict pure cores and on the rest, with the configuration in
  pyproject.toml (the same run as `python3 scripts/dev.py lint`);
- blind excepts (ruff BLE001) and blocking file calls in async code (ASYNC2xx), per folder.

Scope: shared/, services/, whaleflux/ and scripts/ (bench/ and tests/ are test harnesses, left out).
Needs the .venv that `dev.py test` installs (set WHALEFLUX_VENV to use another).

Raw Redis calls, the heuristic (by AST, no imports run): a call `<receiver>.<command>(...)` where <command> is a
Redis command method of redis-py (get, hset, xadd, pipeline, eval, ...: REDIS_COMMANDS below) and <receiver> is
Redis-like: a name or attribute whose last identifier is `redis`, `_redis` or ends in `_redis` (`redis`,
`self.redis`, `runtime.redis`, `self._redis`, `self.cache_redis`); or a name bound in the same function from such
a receiver (`r = runtime.redis`), from its `.pipeline()` (`pipe = r.pipeline()`, `async with self.redis.pipeline()
as tx`) or from `Redis(...)` / `Redis.from_url(...)`; or a parameter annotated with a type named Redis or Pipeline.
Missed: a client that reaches a function as an unannotated parameter under another name, or through a container.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dev  # noqa: E402 - scripts/ is not a package; dev.py holds the lint step this report reuses

ROOT = dev.ROOT
SCOPE = ("shared", "services", "whaleflux", "scripts")

REDIS_COMMANDS = frozenset("""
    get set setex setnx psetex getset getdel getex mget mset msetnx incr incrby incrbyfloat decr decrby append strlen
    delete unlink exists expire expireat pexpire pexpireat persist ttl pttl type rename renamenx keys scan scan_iter
    hget hset hsetnx hmget hmset hgetall hdel hexists hincrby hincrbyfloat hkeys hvals hlen hscan hscan_iter
    lpush rpush lpop rpop lrange llen lindex lrem ltrim lset lmove blpop brpop blmove
    sadd srem smembers sismember smismember scard spop srandmember sscan sscan_iter sinter sunion sdiff
    zadd zrem zrange zrevrange zrangebyscore zrevrangebyscore zrank zrevrank zscore zmscore zcard zcount zincrby
    zpopmin zpopmax zremrangebyscore zremrangebyrank zscan zscan_iter zunionstore zinterstore
    xadd xread xreadgroup xrange xrevrange xlen xtrim xdel xack xgroup_create xclaim xautoclaim xpending xinfo_stream
    publish pubsub pipeline transaction watch unwatch multi execute eval evalsha script_load register_script
    execute_command flushdb flushall ping info dbsize object memory_usage copy lock
""".split())


@dataclass(frozen=True)
class Sized:
    where: str  # path, or path:qualified name
    lines: int


def source_files(scope: tuple[str, ...] = SCOPE) -> list[Path]:
    return [f for f in dev.python_files([d for d in scope if (ROOT / d).exists()]) if "tests" not in f.parts]


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, with its qualified name (Class.method, outer.inner)."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + child.name, child
                stack.append((f"{prefix}{child.name}.", child))
            elif isinstance(child, ast.ClassDef):
                stack.append((f"{prefix}{child.name}.", child))
            else:
                stack.append((prefix, child))


def function_sizes(text: str, where: str) -> list[Sized]:
    """Each function of a module's source, named `where:Class.method`, with its lines from its first decorator."""
    found = []
    for name, node in _functions(ast.parse(text)):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        found.append(Sized(f"{where}:{name}", (node.end_lineno or node.lineno) - first + 1))
    return found


def sizes(files: list[Path]) -> tuple[list[Sized], list[Sized]]:
    """Modules and functions, largest first."""
    modules, functions = [], []
    for file in files:
        text = file.read_text()
        rel = str(file.relative_to(ROOT))
        modules.append(Sized(rel, len(text.splitlines())))
        functions.extend(function_sizes(text, rel))
    key = lambda s: (-s.lines, s.where)  # noqa: E731
    return sorted(modules, key=key), sorted(functions, key=key)


def is_store_module(path: Path) -> bool:
    rel = path.relative_to(ROOT)
    return rel.name == "store.py" or rel.name.endswith("_store.py") or "store" in rel.parts[:-1]


def _last_identifier(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _redis_like(node: ast.expr, bound: set[str]) -> bool:
    if isinstance(node, ast.Name) and node.id in bound:
        return True
    name = (_last_identifier(node) or "").lower()
    return name.lstrip("_") == "redis" or name.endswith("_redis")


def _typed_redis(annotation: ast.expr) -> bool:
    return re.search(r"\b(Redis|Pipeline)\b", ast.unparse(annotation)) is not None


def _makes_redis(value: ast.expr | None, bound: set[str]) -> bool:
    """A Redis-like value (`r = runtime.redis`), `x.pipeline(...)` on one, or `Redis(...)` / `Redis.from_url(...)`."""
    if isinstance(value, ast.Name | ast.Attribute):
        return _redis_like(value, bound)
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr in ("pipeline", "transaction") and _redis_like(func.value, bound):
        return True
    if isinstance(func, ast.Name) and func.id == "Redis":
        return True
    return isinstance(func, ast.Attribute) and func.attr == "from_url" and _last_identifier(func.value) == "Redis"


def raw_redis_calls(file: Path) -> list[int]:
    """Line numbers of raw Redis calls in `file` (the heuristic in this module's docstring)."""
    tree = ast.parse(file.read_text())
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    found: set[int] = set()
    for scope in scopes:
        bound: set[str] = set()
        if not isinstance(scope, ast.Module):  # parameters typed as a client or pipeline: `pipe: Pipeline`
            params = [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]
            bound.update(a.arg for a in params if a.annotation and _typed_redis(a.annotation))
        nodes = list(ast.walk(scope)) if scope is not tree else list(ast.iter_child_nodes(tree))
        for node in nodes:  # bindings first: `pipe = self.redis.pipeline()`, `async with r.pipeline() as tx`
            if isinstance(node, ast.Assign) and _makes_redis(node.value, bound):
                bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.With | ast.AsyncWith):
                for item in node.items:
                    if isinstance(item.optional_vars, ast.Name) and _makes_redis(item.context_expr, bound):
                        bound.add(item.optional_vars.id)
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in REDIS_COMMANDS and _redis_like(node.func.value, bound):
                found.add(node.lineno)
    return sorted(found)


def owner_folder(path: str) -> str:
    """The folder (or for tests/ and bench/, the file) an owner answers for: services/<name>, tests/test_x.py,
    or the top folder."""
    parts = Path(path).parts
    if parts[0] in ("services", "tests", "bench") and len(parts) > 1:
        return "/".join(parts[:2])
    return parts[0]


@dataclass
class LintFigures:
    ruff: dev.Checked
    mypy: dev.Checked
    strict: Counter[str]  # mypy error codes on shared/ and the strict pure cores
    rest: Counter[str]  # mypy error codes elsewhere


def lint_figures() -> LintFigures:
    """ruff's and mypy's results on the whole tree, mypy split into strict (shared/ and the pure cores) and rest."""
    everything = dev.python_files(list(dev.LINT_ROOTS))
    ruff, mypy = dev.run_ruff(everything), dev.run_mypy(everything, whole=True)
    if not (ruff.ran and mypy.ran):
        sys.exit(f"shape_report: ruff or mypy failed to run:\n{ruff.stderr}{mypy.stderr}")
    patterns = dev.strict_patterns()
    figures = LintFigures(ruff, mypy, Counter(), Counter())
    for line in mypy.errors:
        module = dev.module_name(ROOT / line.split(":", 1)[0])
        code = (re.findall(r"\[([\w-]+)\]$", line) or ["?"])[0]
        (figures.strict if module and dev.is_strict(module, patterns) else figures.rest)[code] += 1
    return figures


def _codes(counter: Counter[str], n: int = 6) -> str:
    return ", ".join(f"{code} {count}" for code, count in counter.most_common(n)) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=10, help="how many of the largest modules and functions")
    args = parser.parse_args()
    files = source_files()
    modules, functions = sizes(files)
    print(f"# Shape report ({len(files)} modules in {', '.join(SCOPE)}; tests and bench left out)\n")
    print(f"largest module: {modules[0].where} ({modules[0].lines} lines); "
          f"{sum(m.lines > 400 for m in modules)} modules over 400 lines")
    print(f"largest function: {functions[0].where} ({functions[0].lines} lines); "
          f"{sum(f.lines > 60 for f in functions)} functions over 60 lines\n")
    for title, items in (("modules", modules), ("functions", functions)):
        print(f"top {args.top} {title}:")
        for item in items[:args.top]:
            print(f"  {item.lines:5d}  {item.where}")
        print()
    raw = {str(f.relative_to(ROOT)): lines for f in files if not is_store_module(f) and (lines := raw_redis_calls(f))}
    print(f"raw Redis calls outside store modules: {sum(map(len, raw.values()))} in {len(raw)} files")
    for path, lines in sorted(raw.items(), key=lambda item: (-len(item[1]), item[0])):
        print(f"  {len(lines):4d}  {path}  (lines {', '.join(map(str, lines[:8]))}{' ...' if len(lines) > 8 else ''})")
    print()
    lint = lint_figures()
    ruff = lint.ruff
    print(f"ruff: {len(ruff.errors)} errors ({_codes(Counter(line.split(' ')[1] for line in ruff.errors), 10)})")
    print(f"mypy, shared/ and the strict pure cores: {lint.strict.total()} errors ({_codes(lint.strict)})")
    print(f"mypy, the rest: {lint.rest.total()} errors ({_codes(lint.rest)})\n")
    per_folder = Counter(owner_folder(line.split(":")[0]) for line in [*ruff.errors, *lint.mypy.errors])
    print(f"lint errors per folder (ruff + mypy, whole tree): {sum(per_folder.values())}")
    for folder, count in sorted(per_folder.items()):
        print(f"  {count:4d}  {folder}")
    for rule, title in (("BLE001", "blind excepts (BLE001)"), ("ASYNC2", "blocking calls in async code (ASYNC2xx)")):
        hits = [line for line in ruff.errors if line.split(" ")[1].startswith(rule)]
        print(f"{title}: {len(hits)}")
        for folder, count in sorted(Counter(owner_folder(h.split(":")[0]) for h in hits).items()):
            print(f"  {count:4d}  {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
