"""The dependency rule, enforced.

* ``protocol/`` (installed as ``weir.protocol``) is sans-io: it imports only the
  standard library (minus I/O, concurrency, clock, randomness, identifier and
  logging modules), ``h11`` and ``msgspec``; it never imports the engine; it has no
  ``async def`` and no ``await``.
* Importing ``weir.protocol`` does not import trio or the engine.
* ``engine/`` and ``app/`` import from the core only public names: ``weir.protocol``'s
  ``__all__`` (what most drivers need) or a public topic module's (``weir.protocol.gate``
  and the like); never a ``_`` module.
* The core's public surface stays small and plain: the top level exports at most 40
  names; every public name has exactly one home; each topic module ``weir.protocol.T``
  exports only names defined in itself or in its one private module ``_T``, and no
  private module backs two public modules; every public name is used by a driver
  (``engine/``, ``app/``, ``examples/``, ``benchmarks/``), not only by tests.
* Nothing in the repository imports the source folders by their bare names
  (``protocol``, ``engine``, ``aio``): one module, one name, never two copies of a class.
* ``app/`` (``weir.app``, the application API) runs on any event loop: it imports the
  standard library (no event loop, socket, thread or clock modules), ``msgspec``, and
  the core's public names; never trio, asyncio or the engine.
  The SDK bridge (``app/sdk.py``, ``app/_sdk_bridge.py``) may also import the SDK
  and what it runs on (``mcp``, ``mcp_types``, ``pydantic``, ``anyio``: anyio runs on
  the serving loop, Trio or asyncio); ``import weir.app`` never loads them.
* ``aio/`` (installed as ``weir.asyncio``, the asyncio runtime) uses the core only
  through its public surface, as the engine does, and imports neither trio nor anyio;
  of the engine it imports only the session store modules (``_session_store``,
  ``_store_records``, ``_store_errors``, ``_memory_store``, ``_redis_store`` and the
  modules it is built from, ``_redis_connection``, ``_redis_url``, ``_resp``,
  ``_slots`` (the cluster pipe's routing, written for either loop): one
  store, one wire format, shared by both runtimes; and ``_unheard``, the claims a
  store granted without its answer arriving, given back the same way on both).
  Importing it loads neither the CLI, anyio nor the Redis client.
* ``common/`` (installed as ``weir.common``, what both runtimes share) imports
  neither trio, anyio, asyncio nor either runtime; importing it loads none of them.
* ``examples/`` use only public names (no ``weir.engine._*`` or ``weir.protocol._*``).
* ``tests/protocol`` never imports trio.
* ``protocol/`` keeps no module-level mutable state: no module-level dict, list,
  set, bytearray, deque or other container is bound at import time (caches are
  objects their owners pass in, such as :class:`weir.protocol.HeadCache`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import weir.protocol

#: The core's public topic modules (every ``protocol/*.py`` not starting with ``_``).
TOPIC_MODULES = sorted(
    p.stem for p in (Path(__file__).resolve().parent.parent / "protocol").glob("[!_]*.py")
)


def _public_names(module: str) -> set[str]:
    import importlib

    return set(importlib.import_module(module).__all__)


PUBLIC = {"weir.protocol": _public_names("weir.protocol")} | {
    f"weir.protocol.{t}": _public_names(f"weir.protocol.{t}") for t in TOPIC_MODULES
}

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "protocol"
ENGINE = ROOT / "engine"
APP = ROOT / "app"
AIO = ROOT / "aio"
COMMON = ROOT / "common"

FORBIDDEN_IN_PROTOCOL = frozenset(
    {
        "trio",
        "anyio",
        "asyncio",
        "socket",
        "ssl",
        "select",
        "selectors",
        "threading",
        "time",
        "random",
        "secrets",
        "os",
        "subprocess",
        "datetime",  # a clock: time comes in as an argument
        "uuid",  # randomness: ids come in as arguments
        "logging",  # what to report is the driver's to decide
        "urllib.request",
        "http.client",
        "weir.engine",
        "engine",
    }
)
THIRD_PARTY_IN_PROTOCOL = frozenset({"h11", "msgspec"})


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _absolute_imports(tree: ast.AST) -> Iterator[tuple[int, str, list[str]]]:
    """``(line, module, imported names)`` for every absolute import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, [a.name for a in node.names]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _forbidden(module: str) -> bool:
    """Is ``module`` (or a package it is in) on the core's forbidden list?"""
    parts = module.split(".")
    return any(".".join(parts[:i]) in FORBIDDEN_IN_PROTOCOL for i in range(1, len(parts) + 1))


PROTOCOL_FILES = _py_files(PROTOCOL)
ENGINE_FILES = _py_files(ENGINE)
APP_FILES = _py_files(APP)
AIO_FILES = _py_files(AIO)
COMMON_FILES = _py_files(COMMON)

#: What the application layer may not import: the core's list, minus ``logging``
#: (a tool's failure is logged, not sent) and with the core added back.
FORBIDDEN_IN_APP = (FORBIDDEN_IN_PROTOCOL - {"logging"}) | {"weir.engine", "asyncio"}


#: The SDK bridge's files, and what they alone may import besides the app layer's own.
SDK_BRIDGE = frozenset({"sdk.py", "_sdk_bridge.py"})
SDK_RUNTIME = frozenset({"mcp", "mcp_types", "pydantic", "anyio"})


def test_there_is_something_to_scan() -> None:
    assert PROTOCOL / "__init__.py" in PROTOCOL_FILES
    assert len(PROTOCOL_FILES) >= 5
    assert ENGINE_FILES


@pytest.mark.parametrize("path", PROTOCOL_FILES, ids=_rel)
def test_protocol_imports_only_stdlib_h11_and_msgspec(path: Path) -> None:
    bad: list[str] = []
    for line, module, _ in _absolute_imports(_parse(path)):
        root = module.split(".", 1)[0]
        if _forbidden(module):
            bad.append(f"{_rel(path)}:{line}: forbidden import {module}")
        elif root not in THIRD_PARTY_IN_PROTOCOL and root not in sys.stdlib_module_names:
            bad.append(f"{_rel(path)}:{line}: third-party import {module}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", APP_FILES, ids=_rel)
def test_app_layer_imports_no_runtime(path: Path) -> None:
    # (Which core names it may use: see the public-surface test below.)
    bad: list[str] = []
    for line, module, _ in _absolute_imports(_parse(path)):
        parts = module.split(".")
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if parts[0] in SDK_RUNTIME and path.name in SDK_BRIDGE:
            continue
        if prefixes & FORBIDDEN_IN_APP:
            bad.append(f"{_rel(path)}:{line}: forbidden import {module}")
        elif parts[0] not in {"msgspec", "weir"} and parts[0] not in sys.stdlib_module_names:
            bad.append(f"{_rel(path)}:{line}: third-party import {module}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "module", ["weir.app", "weir.app.samples.demo", "weir.app.samples.conformance"]
)
def test_importing_the_app_layer_imports_no_runtime(module: str) -> None:
    code = (
        f"import {module}, sys\n"
        "bad = sorted(m for m in ('trio', 'asyncio', 'anyio', 'mcp', 'weir.engine')"
        " if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_app_names_from_weir_itself_load_no_trio() -> None:
    code = (
        "import sys\nfrom weir import App, Context, McpError, ToolError\n"
        "assert 'trio' not in sys.modules and 'weir.engine' not in sys.modules\n"
        "from weir import Server\nassert 'weir.engine' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_asyncio_runtime_is_there_to_scan() -> None:
    assert AIO / "__init__.py" in AIO_FILES and len(AIO_FILES) >= 5
    assert (ROOT / "weir" / "asyncio").resolve() == AIO


@pytest.mark.parametrize("path", AIO_FILES, ids=_rel)
def test_the_asyncio_runtime_imports_neither_trio_nor_the_engine(path: Path) -> None:
    bad = [
        f"{_rel(path)}:{line}: {module}"
        for line, module, _ in _absolute_imports(_parse(path))
        if module.split(".", 1)[0] in {"trio", "anyio"}
        or (module.startswith("weir.engine") and module not in AIO_MAY_IMPORT)
    ]
    assert not bad, "\n".join(bad)


#: The engine's modules the asyncio runtime uses: the session stores, and the tasks'
#: decisions (runtime-neutral: each runtime subclasses them), nothing else.
AIO_MAY_IMPORT = frozenset(
    {
        "weir.engine._tasks",
        "weir.engine._session_store",
        "weir.engine._store_records",
        "weir.engine._store_errors",
        "weir.engine._memory_store",
        "weir.engine._redis_store",
        "weir.engine._redis_connection",
        "weir.engine._redis_url",
        "weir.engine._resp",
        "weir.engine._slots",
        "weir.engine._unheard",
    }
)


def test_the_tasks_decisions_need_no_event_loop() -> None:
    """``engine/_tasks.py`` (which both runtimes subclass) imports no event loop, and
    from the engine only what the asyncio runtime may import too."""
    path = ENGINE / "_tasks.py"
    tree = _parse(path)
    bad = [
        f"{_rel(path)}:{line}: {name}"
        for line, name, _ in _absolute_imports(tree)
        if name.split(".", 1)[0] in {"trio", "anyio", "asyncio"}
        or (name.startswith("weir.engine") and name not in AIO_MAY_IMPORT)
    ]
    bad += [
        f"{_rel(path)}:{node.lineno}: .{node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.level == 1
        and f"weir.engine.{node.module}" not in AIO_MAY_IMPORT
    ]
    assert not bad, "\n".join(bad)


def test_importing_the_asyncio_runtime_loads_no_cli_and_no_redis_client() -> None:
    code = (
        "import weir.asyncio, sys, asyncio\n"
        "assert weir.asyncio.run and asyncio.run  # the package, and the stdlib unshadowed\n"
        "bad = sorted(m for m in ('anyio', 'coredis', 'weir.engine.cli', "
        "'weir.engine._redis_store')"
        " if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_shared_package_is_there_to_scan() -> None:
    assert COMMON / "__init__.py" in COMMON_FILES
    assert (ROOT / "weir" / "common").resolve() == COMMON


@pytest.mark.parametrize("path", COMMON_FILES, ids=_rel)
def test_the_shared_package_imports_no_event_loop_and_no_runtime(path: Path) -> None:
    bad = [
        f"{_rel(path)}:{line}: {module}"
        for line, module, _ in _absolute_imports(_parse(path))
        if module.split(".", 1)[0] in {"trio", "anyio", "asyncio"}
        or module.startswith(("weir.engine", "weir.asyncio"))
    ]
    assert not bad, "\n".join(bad)


def test_importing_the_shared_package_loads_no_event_loop_and_no_runtime() -> None:
    code = (
        "import weir.common, sys\n"
        "bad = sorted(m for m in ('trio', 'anyio', 'asyncio', 'weir.engine', 'weir.asyncio')"
        " if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", PROTOCOL_FILES, ids=_rel)
def test_protocol_has_no_async_code(path: Path) -> None:
    bad = [
        f"{_rel(path)}:{node.lineno}: {type(node).__name__}"
        for node in ast.walk(_parse(path))
        if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith)
    ]
    assert not bad, "\n".join(bad)


_MUTABLE_CALLS = frozenset(
    {"dict", "list", "set", "bytearray", "deque", "OrderedDict", "defaultdict", "Counter"}
)


def _module_level_mutables(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """``(line, name)`` of module-level names bound to a mutable container."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        mutable = isinstance(
            value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp
        ) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name | ast.Attribute)
            and (value.func.id if isinstance(value.func, ast.Name) else value.func.attr)
            in _MUTABLE_CALLS
        )
        if mutable:
            for t in targets:
                if ast.unparse(t) != "__all__":  # the export list, by convention a list
                    yield node.lineno, ast.unparse(t)


@pytest.mark.parametrize("path", PROTOCOL_FILES, ids=_rel)
def test_protocol_keeps_no_module_level_mutable_state(path: Path) -> None:
    bad = [f"{_rel(path)}:{line}: {name}" for line, name in _module_level_mutables(_parse(path))]
    assert not bad, "\n".join(bad)


def test_mutable_state_scanner_catches_what_it_should() -> None:
    tree = ast.parse("A = {}\nB: list[int] = []\nC = OrderedDict()\nD = frozenset()\nE = (1,)\n")
    assert [name for _, name in _module_level_mutables(tree)] == ["A", "B", "C"]


def test_scanner_catches_what_it_should() -> None:
    # The scan itself must be able to fail.
    tree = ast.parse(
        "import time\nfrom trio import lowlevel\nimport weir.engine._x\n"
        "async def f():\n    await g()\n"
    )
    modules = [m for _, m, _ in _absolute_imports(tree)]
    assert modules == ["time", "trio", "weir.engine._x"]
    assert all(_forbidden(m) for m in modules)
    assert _forbidden("urllib.request") and not _forbidden("urllib.parse")
    assert not _forbidden("weir.protocol") and not _forbidden("enginex")
    assert any(isinstance(n, ast.AsyncFunctionDef) for n in ast.walk(tree))
    assert any(isinstance(n, ast.Await) for n in ast.walk(tree))


def test_importing_protocol_imports_neither_trio_nor_engine() -> None:
    code = (
        "import weir.protocol, sys\n"
        "assert 'trio' not in sys.modules, 'trio imported'\n"
        "assert 'weir.engine' not in sys.modules, 'weir.engine imported'\n"
        "bad = sorted(m for m in ('anyio', 'asyncio', 'threading') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def _private_core_imports(path: Path) -> list[str]:
    bad: list[str] = []
    for line, module, names in _absolute_imports(_parse(path)):
        if module != "weir.protocol" and not module.startswith("weir.protocol."):
            continue
        public = PUBLIC.get(module)
        if public is None:
            bad.append(f"{_rel(path)}:{line}: imports private module {module}")
            continue
        bad += [
            f"{_rel(path)}:{line}: 'from {module} import {name}' is not in its __all__"
            for name in names
            if name == "*" or name not in public
        ]
    return bad


@pytest.mark.parametrize("path", [*ENGINE_FILES, *APP_FILES, *AIO_FILES, *COMMON_FILES], ids=_rel)
def test_engine_and_app_use_the_core_only_through_its_public_surface(path: Path) -> None:
    bad = _private_core_imports(path)
    assert not bad, "\n".join(bad)


def test_there_are_topic_modules_and_they_hold_what_they_say() -> None:
    assert {"gate", "binding", "resume", "lifecycle", "legacy", "sse"} <= set(TOPIC_MODULES)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_exists_and_is_not_private(module: str) -> None:
    import importlib

    mod = importlib.import_module(module)
    names = mod.__all__
    assert len(names) == len(set(names))
    assert not [n for n in names if n.startswith("_")]
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, missing


def test_every_public_name_has_one_home() -> None:
    homes: dict[str, list[str]] = {}
    for module, names in PUBLIC.items():
        for name in names:
            homes.setdefault(name, []).append(module)
    twice = {n: m for n, m in homes.items() if len(m) > 1}
    assert not twice, twice


def test_the_top_level_surface_stays_small() -> None:
    # What a driver needs on every request, no more (h11 exports about 25 names).
    assert len(weir.protocol.__all__) <= 40, len(weir.protocol.__all__)


def _defined_names(path: Path) -> set[str]:
    """The names a module binds at its top level by definition (not by import)."""
    names: set[str] = set()
    for node in _parse(path).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _private_home(module: str, name: str) -> str:
    """The private core module that defines ``module``'s public ``name``."""
    import importlib

    obj = getattr(importlib.import_module(module), name)
    homes = [
        f"weir.protocol.{p.stem}"
        for p in sorted(PROTOCOL.glob("_*.py"))
        if p.stem != "__init__" and name in _defined_names(p)
    ]
    assert len(homes) == 1, f"{module}.{name} is defined in {homes or 'no private module'}"
    if isinstance(obj, type) or callable(obj):
        assert obj.__module__ == homes[0], f"{module}.{name} comes from {obj.__module__}"
    return homes[0]


@pytest.mark.parametrize("topic", TOPIC_MODULES)
def test_a_topic_module_draws_from_its_one_private_module(topic: str) -> None:
    # Following a public name leads to one place: weir.protocol.T's names are
    # defined in T itself or in _T, the private module of the same topic.
    module = f"weir.protocol.{topic}"
    own = _defined_names(PROTOCOL / f"{topic}.py")
    bad = {
        name: home
        for name in sorted(PUBLIC[module])
        if name not in own and (home := _private_home(module, name)) != f"weir.protocol._{topic}"
    }
    assert not bad, f"{module} re-exports from outside _{topic}: {bad}"


def test_no_private_module_backs_two_public_modules() -> None:
    backs: dict[str, set[str]] = {}
    for module, names in PUBLIC.items():
        for name in names:
            backs.setdefault(_private_home(module, name), set()).add(module)
    shared = {home: sorted(mods) for home, mods in backs.items() if len(mods) > 1}
    assert not shared, shared


#: Where the core's drivers live: every public name must be used by one of them.
DRIVER_FOLDERS = [
    ROOT / f
    for f in ("engine", "app", "examples", "benchmarks", "aio", "common")
    if (ROOT / f).is_dir()
]


def _names_drivers_import() -> set[tuple[str, str]]:
    used: set[tuple[str, str]] = set()
    for path in (p for folder in DRIVER_FOLDERS for p in _py_files(folder)):
        for _, module, names in _absolute_imports(_parse(path)):
            if module in PUBLIC:
                used.update((module, name) for name in names)
    return used


def test_every_public_name_is_used_by_a_driver() -> None:
    # A name only tests import is an internal: tests import it from its private module.
    used = _names_drivers_import()
    unused = sorted(f"{m}.{n}" for m, names in PUBLIC.items() for n in names if (m, n) not in used)
    assert not unused, unused


@pytest.mark.parametrize("path", _py_files(ROOT / "tests" / "protocol"), ids=_rel)
def test_pure_core_tests_never_import_trio(path: Path) -> None:
    bad = [
        f"{_rel(path)}:{line}: {module}"
        for line, module, _ in _absolute_imports(_parse(path))
        if module.split(".", 1)[0] in {"trio", "anyio", "asyncio", "engine"}
        or module.startswith("weir.engine")
    ]
    assert not bad, "\n".join(bad)


# weir/protocol, weir/app, weir/engine and weir/asyncio are symlinks to the source
# folders: scan once.
REPO_FILES = [
    *(
        p
        for f in ("protocol", "app", "engine", "aio", "tests", "benchmarks", "examples")
        for p in _py_files(ROOT / f)
    ),
    *sorted((ROOT / "weir").glob("*.py")),
]


@pytest.mark.parametrize("path", REPO_FILES, ids=_rel)
def test_nothing_imports_the_source_folders_by_their_bare_names(path: Path) -> None:
    bad = [
        f"{_rel(path)}:{line}: import {module} (use weir.{module.replace('aio', 'asyncio', 1)})"
        for line, module, _ in _absolute_imports(_parse(path))
        if module.split(".", 1)[0] in {"protocol", "app", "engine", "aio"}
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _py_files(ROOT / "examples"), ids=_rel)
def test_examples_use_only_public_names(path: Path) -> None:
    bad = [
        f"{_rel(path)}:{line}: {module}"
        for line, module, _ in _absolute_imports(_parse(path))
        if module.startswith(("weir.engine", "weir.protocol"))
        and any(part.startswith("_") for part in module.split("."))
    ]
    assert not bad, "\n".join(bad)


STORE_IMPLEMENTER_NAMES = (
    "SessionStore",
    "SessionRecord",
    "StoredEvent",
    "StreamInfo",
    "Retention",
    "SessionGone",
    "StoreUnavailable",
    "ChannelRejected",
    "MemoryStore",
    "RedisStore",
)


@pytest.mark.parametrize("name", STORE_IMPLEMENTER_NAMES)
def test_a_store_implementer_needs_no_private_module(name: str) -> None:
    import weir.engine

    assert name in weir.engine.__all__ and getattr(weir.engine, name).__name__ == name
    for module, core_name in (
        ("gate", "CallStart"),
        ("gate", "CallOutcome"),
        ("binding", "ChannelVerdict"),
    ):
        assert core_name in PUBLIC[f"weir.protocol.{module}"]


def test_importing_the_engine_does_not_import_the_redis_client() -> None:
    code = (
        "import weir.engine, sys\n"
        "assert not {'coredis', 'hiredis'} & set(sys.modules), 'a redis client was imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
