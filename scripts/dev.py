#!/usr/bin/env python3
"""The project's two commands, needing only Python 3.11+:

    python3 scripts/dev.py run    # install into .venv (runtime dependencies only), then `whaleflux up`
    python3 scripts/dev.py test   # install into .venv (with the [test] and [dev] extras), validate
                                  # docker-compose.yml, run the test suite
    python3 scripts/dev.py lint [PATH...]   # ruff and mypy (the same extras), on the tree or on PATHs

Extra arguments go to `whaleflux up` or to pytest. `test` runs the lint step first and stops if it finds
anything when it runs the whole suite (no pytest arguments, as CI does); with pytest arguments only if asked
(`test --lint ...` or WHALEFLUX_LINT=1); `test --no-lint` (or WHALEFLUX_LINT=0) skips it.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("WHALEFLUX_VENV", ROOT / ".venv"))
BIN = VENV / "bin"
STAMP = VENV / ".whaleflux-installed"
TYPECHECK = ROOT / ".typecheck"
# What `lint` checks when given no paths: every Python file of the tree.
LINT_ROOTS = ("shared", "services", "whaleflux", "tests", "scripts", "bench")


# The extras each command installs beside the runtime dependencies (pyproject.toml [project.optional-dependencies]):
# `run` only what WhaleFlux needs to run; `test` the test tools and the lint step's (ruff, mypy, stubs); `lint` the
# same, as mypy reads the tests' imports (pytest, hypothesis, playwright...) to check them.
EXTRAS = {"run": (), "lint": ("test", "dev"), "test": ("test", "dev")}


def wanted_stamp() -> str:
    """What the install depends on: the dependency list and package layout (pyproject.toml's [project],
    [build-system] and [tool.setuptools], not the lint configuration), this Python, this checkout. The install is
    editable, so changes to the code itself need no reinstall."""
    import json

    config = pyproject()
    wanted = {key: config.get(key) for key in ("project", "build-system")}
    wanted["setuptools"] = config.get("tool", {}).get("setuptools")
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode())
    digest.update(f"{sys.version}|{ROOT}".encode())
    return digest.hexdigest()


def read_stamp() -> tuple[str, set[str]]:
    """The stamp of the last install: (its digest, the extras it installed); ("", set()) when there is none."""
    if not (BIN / "python").exists() or not STAMP.exists():
        return "", set()
    return parse_stamp(STAMP.read_text())


def parse_stamp(text: str) -> tuple[str, set[str]]:
    """A stamp's text: the digest, then on a second line the extras installed, comma-separated. A stamp of one line
    (written before the extras were split) installed [test] with the lint tools, now [test] and [dev]."""
    digest, newline, extras = text.partition("\n")
    return digest, (set(extras.split(",")) - {""}) if newline else {"test", "dev"}


def stamp_text(digest: str, extras: tuple[str, ...]) -> str:
    return f"{digest}\n{','.join(extras)}"


def install(extras: tuple[str, ...] = ()) -> None:
    """.venv with WhaleFlux (editable) and its pinned dependencies, plus `extras`; nothing to do when the stamp says
    the same pyproject.toml was installed with these extras (or more)."""
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py runs on whatever `python3` is, to say it is too old
        sys.exit(f"WhaleFlux needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    stamp = wanted_stamp()
    digest, installed = read_stamp()
    if digest == stamp and installed >= set(extras):
        print(f"{VENV} is up to date with pyproject.toml (delete {STAMP.name} in it to reinstall)", flush=True)
        return
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    # What was installed before stays installed (pip removes nothing), so the stamp keeps naming it.
    extras = tuple(sorted(installed | set(extras)))
    what = f" and its [{','.join(extras)}] extras" if extras else " (runtime dependencies only)"
    print(f"installing WhaleFlux and its pinned dependencies{what} (the first time takes a minute or two)", flush=True)
    # pip's own progress (what it collects, downloads and installs) is shown, not hidden with -q.
    subprocess.run([BIN / "python", "-m", "pip", "install", "--disable-pip-version-check", "--upgrade", "pip"],
                   check=True)
    target = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    subprocess.run([BIN / "python", "-m", "pip", "install", "--disable-pip-version-check", "-e", target], check=True)
    STAMP.write_text(stamp_text(stamp, extras))


def pyproject() -> dict:
    """pyproject.toml, parsed (tomllib is imported here: dev.py must start on an older Python to say it is too old)."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_dirs() -> dict[str, Path]:
    """[tool.setuptools] package-dir of pyproject.toml: import name -> folder (whaleflux.shared -> shared/)."""
    config = pyproject()
    return {name: ROOT / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def _link(link: Path, target: Path) -> None:
    """Point `link` at `target`, replacing whatever is there (atomic: engineers lint at the same time)."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    os.replace(temporary, link)


def build_typecheck_tree() -> dict[Path, Path]:
    """Lay out .typecheck/ as the installed package looks: whaleflux/ holding the CLI's files, and whaleflux/shared,
    whaleflux/scheduler, ... linking to shared/, services/scheduler/, ...; tests/ links to tests/.

    Why links and not setuptools' `editable_mode=strict`: a strict editable install links files, so each file added
    (several a day while services are split) needs a reinstall before mypy sees it; linked folders show every file
    as it is now. mypy cannot follow the default editable install, whose mapping lives in an import hook.
    Returns each linked folder as mypy will name it -> the real folder, to print errors with real paths."""
    dirs = package_dirs()
    top = TYPECHECK / "whaleflux"
    top.mkdir(parents=True, exist_ok=True)
    mapped = {name.split(".", 1)[1]: folder for name, folder in dirs.items() if name.startswith("whaleflux.")}
    wanted = {entry.name: entry for entry in dirs["whaleflux"].iterdir()
              if entry.name != "__pycache__" and (entry.is_dir() or entry.suffix in (".py", ".pyi"))}
    wanted.update(mapped)
    for entry in top.iterdir():
        if entry.name not in wanted and entry.is_symlink():
            entry.unlink()
    for name, target in wanted.items():
        _link(top / name, target)
    _link(TYPECHECK / "tests", ROOT / "tests")
    views = {top / name: folder for name, folder in mapped.items()}
    views[top] = dirs["whaleflux"]
    views[TYPECHECK / "tests"] = ROOT / "tests"
    return views


def module_name(path: Path) -> str | None:
    """The import name mypy knows a file by: whaleflux.scheduler.store for services/scheduler/store.py,
    tests.test_up for tests/test_up.py, the file's stem for bench/ and scripts/ (on mypy's path)."""
    path = path.resolve()
    folders = sorted(((folder, name) for name, folder in package_dirs().items()),
                     key=lambda item: len(item[0].parts), reverse=True)
    for folder, name in [*folders, (ROOT / "tests", "tests")]:
        if path.is_relative_to(folder):
            parts = [*name.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    if path.parent in (ROOT / "bench", ROOT / "scripts"):
        return path.stem
    return None


def python_files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for given in paths:
        path = (ROOT / given) if not Path(given).is_absolute() else Path(given)
        if path.is_dir():
            found.extend(p for p in sorted(path.rglob("*.py")) if "__pycache__" not in p.parts)
        elif path.suffix == ".py" and path.exists():
            found.append(path)
        else:
            print(f"lint: {given} is no Python file or folder", file=sys.stderr)
    return found


def strict_patterns() -> list[str]:
    """The module patterns mypy checks strictly (the override section that turns on --strict's flags)."""
    overrides = pyproject()["tool"]["mypy"].get("overrides", [])
    return [p for o in overrides if o.get("disallow_untyped_defs") for p in o["module"]]


def is_strict(module: str, patterns: list[str]) -> bool:
    return any(module == p or (p.endswith(".*") and (module + ".").startswith(p[:-1])) for p in patterns)


def strict_hints(files: list[Path]) -> list[str]:
    """Modules that call themselves pure (the docstring's first paragraph says "pure" or "No I/O") but are not in
    mypy's strict list."""
    patterns = strict_patterns()
    hints = []
    for file in files:
        module = module_name(file)
        if not module or not module.startswith("whaleflux.") or is_strict(module, patterns):
            continue
        try:
            docstring = (ast.get_docstring(ast.parse(file.read_text())) or "").split("\n\n")[0]
        except SyntaxError:
            continue  # ruff reports it
        if re.search(r"\b[Pp]ure\b|\b[Nn]o I/O\b", docstring):
            hints.append(f"{file.relative_to(ROOT)}: says it is pure; add {module} to the strict list")
    return hints


@dataclass
class Checked:
    """What one tool said: its output lines (real paths), the error lines among them, and whether it ran."""
    lines: list[str]
    errors: list[str]
    ran: bool
    stderr: str


def run_ruff(files: list[Path]) -> Checked:
    rel = [str(f.relative_to(ROOT)) for f in files]
    done = subprocess.run([BIN / "ruff", "check", "--output-format", "concise", "--quiet", *rel],
                          capture_output=True, text=True, cwd=ROOT)
    lines = done.stdout.splitlines()
    errors = [line for line in lines if re.match(r"^\S+:\d+:\d+: ", line)]
    return Checked(lines, errors, done.returncode in (0, 1), done.stderr)


def run_mypy(files: list[Path], whole: bool) -> Checked:
    """mypy on the modules of `files`, through .typecheck/; lines name the real files."""
    views = build_typecheck_tree()
    modules = sorted({m for m in map(module_name, files) if m})
    # Unused config sections are worth a note only when the whole tree is checked.
    flags = ["--warn-unused-configs"] if whole else []
    done = subprocess.run([BIN / "mypy", "--no-error-summary", "--show-error-codes", *flags,
                           *[arg for m in modules for arg in ("-m", m)]], capture_output=True, text=True, cwd=ROOT)
    # mypy names files by the links it went through: .typecheck/whaleflux/shared/bus.py is shared/bus.py.
    prefixes = sorted(((str(view.relative_to(ROOT)) + "/", str(real.relative_to(ROOT)) + "/")
                       for view, real in views.items()), key=lambda item: len(item[0]), reverse=True)
    lines = []
    for line in done.stdout.splitlines():
        for view, real in prefixes:
            if line.startswith(view):
                line = real + line[len(view):]
                break
        lines.append(line)
    errors = [line for line in lines if re.match(r"^\S+:\d+: error:", line)]
    return Checked(lines, errors, done.returncode in (0, 1), done.stderr)


def package_hints(committed_only: bool = False) -> list[str]:
    """Packages (folders with an __init__.py) missing from [tool.setuptools] packages: a wheel would lack them
    (the editable install finds them anyway, so tests pass while the Docker image breaks). `committed_only`: only
    those git tracks (a package listed before it is committed breaks the install of a clean checkout)."""
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    inits = [init for folder in package_dirs().values() for init in folder.rglob("__init__.py")
             if "__pycache__" not in init.parts]
    if committed_only:
        git = shutil.which("git") or sys.exit("package_hints: needs git on PATH")
        tracked = subprocess.run([git, "ls-files", "--", *[str(i.relative_to(ROOT)) for i in inits]], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.split()
        inits = [ROOT / path for path in tracked]
    found = {module_name(init) for init in inits}
    missing = [f"package {name} is missing from [tool.setuptools] packages in pyproject.toml"
               for name in sorted(n for n in found if n and n not in listed)]
    gone = [f"package {name} is listed in [tool.setuptools] packages but {folder.relative_to(ROOT)}/ is gone"
            for name in sorted(listed) if not (folder := package_folder(name)).is_dir()]
    return missing + gone


def package_folder(name: str) -> Path:
    """The folder an import name lives in, by package-dir (whaleflux.scheduler.queueing is in
    services/scheduler/queueing)."""
    dirs = package_dirs()
    base = max((n for n in dirs if name == n or name.startswith(n + ".")), key=len)
    return dirs[base].joinpath(*name[len(base):].lstrip(".").split(".")) if name != base else dirs[base]


def lint(paths: list[str]) -> int:
    """ruff and mypy on `paths` (default: the whole tree); prints each error with its real path, then the counts."""
    files = python_files(paths or list(LINT_ROOTS))
    if not files:
        return 2
    ruff, mypy = run_ruff(files), run_mypy(files, whole=not paths)
    for checked in (ruff, mypy):
        for line in checked.lines:
            print(line)
        print(checked.stderr, end="", file=sys.stderr)
    for hint in strict_hints(files) + ([] if paths else package_hints()):
        print(f"hint: {hint}")
    failed = not (ruff.ran and mypy.ran)
    print(f"lint: {len(ruff.errors)} ruff errors, {len(mypy.errors)} mypy errors in {len(files)} files"
          + (" (a tool failed to run: see above)" if failed else ""))
    return 1 if failed or ruff.errors or mypy.errors else 0


def lint_wanted(extra: list[str]) -> bool:
    """Lint before the tests: asked for, or by default when the whole suite runs (what CI runs)."""
    for flag, wanted in (("--lint", True), ("--no-lint", False)):
        if flag in extra:
            extra.remove(flag)
            return wanted
    env = os.environ.get("WHALEFLUX_LINT", "")
    return env not in ("", "0") if env else not extra


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test", "lint"):
        print(__doc__)
        return 2
    command, extra = sys.argv[1], sys.argv[2:]
    install(EXTRAS[command])
    os.chdir(ROOT)
    if command == "run":
        os.execv(BIN / "whaleflux", [str(BIN / "whaleflux"), "up", *extra])  # noqa: S606 - an argument list
    if command == "lint":
        return lint(extra)
    if lint_wanted(extra) and lint([]) != 0:
        return 1
    if bash := shutil.which("bash"):
        subprocess.run([bash, str(ROOT / "scripts" / "check_compose.sh")], check=True)
    return subprocess.run([BIN / "python", "-m", "pytest", "-q", *extra]).returncode


if __name__ == "__main__":
    sys.exit(main())
