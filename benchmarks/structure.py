"""Structure numbers of a weir checkout: ``python benchmarks/structure.py DIR``.

Prints lines per folder, the files over 600 lines and the functions over 60 lines
(of ``protocol``, ``engine``, ``aio``, ``common``), then the Trio ``Server``: its
mixins (its base classes defined in ``engine/``), and its methods and their lines
counted over ``Server`` and those bases.  Then each component the server is made
of: every ``engine/`` class that ``engine/_server.py`` constructs and whose
constructor takes the ``shared`` state (and ``Shared`` itself), with its file, its
lines and its methods.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DIRS = ("protocol", "engine", "aio", "examples/asyncio_server", "common", "app")
CHECKED = ("protocol", "engine", "aio", "common")


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [m for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]


def _span(node: ast.stmt) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def _takes_shared(cls: ast.ClassDef) -> bool:
    init = next((m for m in _methods(cls) if m.name == "__init__"), None)
    return init is not None and any(a.arg == "shared" for a in init.args.args)


def main(root: Path) -> None:
    """Print the numbers for the checkout at ``root``."""
    lines: dict[str, int] = {}
    big: list[tuple[int, str]] = []
    long: list[tuple[int, str]] = []
    classes: dict[str, tuple[str, ast.ClassDef]] = {}
    for folder in DIRS:
        total = 0
        for path in sorted((root / folder).glob("*.py")):
            src = path.read_text()
            n = src.count("\n")
            total += n
            rel = str(path.relative_to(root))
            if n > 600 and folder in CHECKED[:3]:
                big.append((n, rel))
            tree = ast.parse(src)
            if folder in CHECKED:
                long += [(_span(f), f"{rel}:{f.name}") for f in _functions(tree) if _span(f) > 60]
            if folder == "engine":
                for node in tree.body:
                    if isinstance(node, ast.ClassDef):
                        classes[node.name] = (rel, node)
        lines[folder] = total
    print("lines per folder:", lines)
    print("files over 600 lines (protocol, engine, aio):", len(big), sorted(big, reverse=True))
    print("functions over 60 lines:", len(long), sorted(long, reverse=True))
    server_src = ast.parse((root / "engine/_server.py").read_text())
    server = next(n for n in server_src.body if isinstance(n, ast.ClassDef) and n.name == "Server")
    bases = [b.id for b in server.bases if isinstance(b, ast.Name) and b.id in classes]
    parts = [server] + [classes[b][1] for b in bases]
    methods = [m for cls in parts for m in _methods(cls)]
    print(
        f"Server: {len(bases)} mixins, {len(methods)} methods, "
        f"{sum(_span(m) for m in methods)} lines of methods, {_span(server)} lines of class"
    )
    made = {
        n.func.id
        for n in ast.walk(server_src)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in classes
    }
    for name in sorted(made - {"Server"}):
        rel, cls = classes[name]
        if name != "Shared" and not _takes_shared(cls):
            continue
        print(f"  component {name} ({rel}): {_span(cls)} lines, {len(_methods(cls))} methods")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
