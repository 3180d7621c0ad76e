"""The project's own tools: how `dev.py lint` names and lays out the tree for mypy, that every package reaches the
wheel, and how scripts/shape_report.py measures the issue-15 figures (sizes, raw Redis calls)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _scripts() -> tuple[ModuleType, ModuleType]:
    """scripts/dev.py and scripts/shape_report.py as modules (scripts/ is not a package; shape_report imports dev
    from beside it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module("dev"), importlib.import_module("shape_report")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


dev, shape = _scripts()


def test_files_are_named_by_the_package_dir_mapping():
    assert dev.module_name(ROOT / "services/scheduler/store.py") == "whaleflux.scheduler.store"
    assert dev.module_name(ROOT / "services/scheduler/queueing/__init__.py") == "whaleflux.scheduler.queueing"
    assert dev.module_name(ROOT / "shared/sizing/memory.py") == "whaleflux.shared.sizing.memory"
    assert dev.module_name(ROOT / "whaleflux/commands/jobs.py") == "whaleflux.commands.jobs"
    assert dev.module_name(ROOT / "tests/test_up.py") == "tests.test_up"
    assert dev.module_name(ROOT / "bench/cli_startup.py") == "cli_startup"
    assert dev.module_name(ROOT / "docs/index.md") is None


def test_the_typecheck_tree_shows_the_installed_layout_through_links():
    views = dev.build_typecheck_tree()
    top = ROOT / ".typecheck" / "whaleflux"
    assert Path(os.readlink(top / "scheduler")) == ROOT / "services" / "scheduler"
    assert Path(os.readlink(top / "shared")) == ROOT / "shared"
    assert Path(os.readlink(top / "cli.py")) == ROOT / "whaleflux" / "cli.py"
    assert (top / "scheduler" / "store.py").read_text() == (ROOT / "services/scheduler/store.py").read_text()
    assert views[top / "scheduler"] == ROOT / "services" / "scheduler"  # mypy's paths map back to the real ones


def test_only_packages_that_call_themselves_pure_are_hinted_for_the_strict_list():
    patterns = dev.strict_patterns()
    assert dev.is_strict("whaleflux.shared.bus", patterns)
    assert dev.is_strict("whaleflux.scheduler.queueing.schedule", patterns)
    assert not dev.is_strict("whaleflux.scheduler.app", patterns)
    assert not dev.is_strict("whaleflux.sharedx", patterns)


def test_package_names_map_to_their_folders():
    assert dev.package_folder("whaleflux.scheduler.queueing") == ROOT / "services" / "scheduler" / "queueing"
    assert dev.package_folder("whaleflux.shared") == ROOT / "shared"
    assert dev.package_folder("whaleflux.commands") == ROOT / "whaleflux" / "commands"


def test_every_package_folder_is_listed_for_the_wheel():
    # The editable install finds an unlisted package, so only the Docker image (pip install .) would miss it.
    assert dev.package_hints(committed_only=True) == []


def test_raw_redis_calls_are_found_on_redis_receivers_pipelines_and_typed_parameters(tmp_path):
    code = tmp_path / "sample.py"
    code.write_text("""
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline


async def handler(self, runtime, cache: dict, redis_keys: list):
    await self.redis.hset("k", "f", "v")  # raw: a client attribute
    await runtime.redis.get("k")  # raw
    cache.get("k")
    async with self.redis.pipeline(transaction=True) as tx:  # raw: the pipeline call itself
        tx.xadd("s", {"a": 1})  # raw: bound from the pipeline
    pipe = self._redis.pipeline()  # raw
    pipe.delete("k")  # raw
    r = runtime.redis
    await r.incr("n")  # raw: bound from a client
    await self.http.get("/v1/jobs")
    redis_keys.append("k")


def stage(pipe: Pipeline, r: Redis) -> None:
    pipe.zadd("z", {"m": 1})  # raw: a parameter typed as a pipeline
    r.smembers("s")  # raw: typed as a client
""")
    marked = [n for n, line in enumerate(code.read_text().splitlines(), 1) if "# raw" in line]
    assert shape.raw_redis_calls(code) == marked


def test_store_modules_are_store_files_or_a_store_package():
    assert shape.is_store_module(ROOT / "services/scheduler/store.py")
    assert shape.is_store_module(ROOT / "shared/state_store.py")
    assert shape.is_store_module(ROOT / "services/billing/store/ledger.py")
    assert not shape.is_store_module(ROOT / "services/billing/app.py")
    assert not shape.is_store_module(ROOT / "shared/storefront.py")


def test_function_sizes_count_from_the_first_decorator_and_name_methods_and_inner_functions():
    text = """import functools


class Service:
    @functools.cache
    @staticmethod
    def method():
        def inner():
            return 1
        return inner()
"""
    sizes = {s.where: s.lines for s in shape.function_sizes(text, "m.py")}
    assert sizes == {"m.py:Service.method": 6, "m.py:Service.method.inner": 2}


def test_the_install_stamp_names_the_extras_so_test_adds_them_to_a_venv_made_by_run():
    assert dev.EXTRAS["run"] == ()
    assert set(dev.EXTRAS["test"]) == set(dev.EXTRAS["lint"]) == {"test", "dev"}  # mypy reads the tests' imports
    extras = dev.pyproject()["project"]["optional-dependencies"]
    assert all(name in extras for names in dev.EXTRAS.values() for name in names)
    # The demo's install has none of the test or lint tools.
    runtime = " ".join(dev.pyproject()["project"]["dependencies"])
    tools = ("pytest", "playwright", "mypy", "ruff", "testcontainers", "kubectl")
    assert not [tool for tool in tools if tool in runtime]
    made_by_run = dev.stamp_text("abc", dev.EXTRAS["run"])
    digest, installed = dev.parse_stamp(made_by_run)
    assert digest == "abc" and not installed >= set(dev.EXTRAS["test"])  # `test` installs its extras
    assert dev.parse_stamp(dev.stamp_text("abc", ("dev", "test")))[1] >= set(dev.EXTRAS["lint"])  # `lint` needs none
    assert dev.parse_stamp("abc") == ("abc", {"test", "dev"})  # a stamp from before the split


def test_every_data_folder_is_a_listed_package_so_setuptools_warns_of_none():
    # A folder of data files inside a package, unlisted, makes setuptools print a 20-line warning per folder.
    config = dev.pyproject()["tool"]["setuptools"]
    for name in config["package-data"]:
        assert name in config["packages"], name
    listed = set(config["packages"])
    for name, folder in dev.package_dirs().items():
        for sub in folder.rglob("*"):
            if not sub.is_dir() or "__pycache__" in sub.parts or not sub.relative_to(folder).parts:
                continue
            dotted = ".".join((name, *sub.relative_to(folder).parts))
            if all(part.isidentifier() for part in sub.relative_to(folder).parts) and any(
                    f.is_file() and f.suffix != ".py" and not f.name.startswith(".") for f in sub.iterdir()) \
                    and not any(p for p in dev.package_dirs() if p == dotted):
                assert dotted in listed, f"{sub.relative_to(dev.ROOT)} holds data files: list {dotted} in packages"
