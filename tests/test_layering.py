"""The dependency rule, enforced.

* ``protocol/`` is sans-io: it imports only the standard library (minus I/O,
  concurrency, clock and randomness modules), ``h11`` and ``msgspec``; it never
  imports ``engine``; it has no ``async def`` and no ``await``.
* Importing ``protocol`` does not import trio or engine.
* ``engine/`` imports from ``protocol`` only through the package's ``__all__``.
* ``tests/protocol`` never imports trio.
* ``protocol/`` keeps no module-level mutable state: no module-level dict, list,
  set, bytearray, deque or other container is bound at import time (caches are
  objects their owners pass in, such as :class:`protocol.HeadCache`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import protocol

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "protocol"
ENGINE = ROOT / "engine"

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


PROTOCOL_FILES = _py_files(PROTOCOL)
ENGINE_FILES = _py_files(ENGINE)


def test_there_is_something_to_scan() -> None:
    assert PROTOCOL / "__init__.py" in PROTOCOL_FILES
    assert len(PROTOCOL_FILES) >= 5
    assert ENGINE_FILES


@pytest.mark.parametrize("path", PROTOCOL_FILES, ids=_rel)
def test_protocol_imports_only_stdlib_h11_and_msgspec(path: Path) -> None:
    bad: list[str] = []
    for line, module, _ in _absolute_imports(_parse(path)):
        root = module.split(".", 1)[0]
        if root in FORBIDDEN_IN_PROTOCOL:
            bad.append(f"{_rel(path)}:{line}: forbidden import {module}")
        elif root not in THIRD_PARTY_IN_PROTOCOL and root not in sys.stdlib_module_names:
            bad.append(f"{_rel(path)}:{line}: third-party import {module}")
    assert not bad, "\n".join(bad)


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
        "import time\nfrom trio import lowlevel\nimport engine._x\nasync def f():\n    await g()\n"
    )
    roots = {m.split(".", 1)[0] for _, m, _ in _absolute_imports(tree)}
    assert roots <= FORBIDDEN_IN_PROTOCOL
    assert roots == {"time", "trio", "engine"}
    assert any(isinstance(n, ast.AsyncFunctionDef) for n in ast.walk(tree))
    assert any(isinstance(n, ast.Await) for n in ast.walk(tree))


def test_importing_protocol_imports_neither_trio_nor_engine() -> None:
    code = (
        "import protocol, sys\n"
        "assert 'trio' not in sys.modules, 'trio imported'\n"
        "assert 'engine' not in sys.modules, 'engine imported'\n"
        "bad = sorted(m for m in ('anyio', 'asyncio', 'threading') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", ENGINE_FILES, ids=_rel)
def test_engine_uses_protocol_only_through_its_public_surface(path: Path) -> None:
    public = set(protocol.__all__)
    bad: list[str] = []
    for line, module, names in _absolute_imports(_parse(path)):
        if module != "protocol" and not module.startswith("protocol."):
            continue
        if module != "protocol":
            bad.append(f"{_rel(path)}:{line}: imports private module {module}")
            continue
        for name in names:
            if name == "*" or name not in public:
                bad.append(f"{_rel(path)}:{line}: 'from protocol import {name}' is not in __all__")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", protocol.__all__)
def test_every_public_name_exists(name: str) -> None:
    assert hasattr(protocol, name), name


def test_all_has_no_duplicates_and_no_private_names() -> None:
    assert len(protocol.__all__) == len(set(protocol.__all__))
    assert not [n for n in protocol.__all__ if n.startswith("_")]


@pytest.mark.parametrize("path", _py_files(ROOT / "tests" / "protocol"), ids=_rel)
def test_pure_core_tests_never_import_trio(path: Path) -> None:
    bad = [
        f"{_rel(path)}:{line}: {module}"
        for line, module, _ in _absolute_imports(_parse(path))
        if module.split(".", 1)[0] in {"trio", "anyio", "asyncio", "engine"}
    ]
    assert not bad, "\n".join(bad)
