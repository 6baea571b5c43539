"""The README's install and quick start, as written, in a fresh virtualenv.

A copy of the checkout (its tracked files as they are now) is installed with the
README's own install command into a new virtualenv, whose ``bin`` then leads ``PATH``,
so ``python3``, ``weir`` and ``pip`` are the virtualenv's.  The quick start's other
blocks then run, under the conventions of ``tests/test_docs.py``, in an empty folder
(not the checkout, whose ``weir/`` would shadow the installed package), with ``weir``
the installed console script; the only change to them is the port.  Each call must
print ``Hello, Ada!``.

It installs packages (from the package index pip is configured with), so it takes
minutes: it is marked ``quickstart``, left out of the default run, and run explicitly
by ``.ci/run`` (``python3 -m pytest -m quickstart``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docblocks import Block, PageRun, blocks, commands
from tests.integration.serverproc import REPO_ROOT

pytestmark = pytest.mark.quickstart

INSTALL_TIMEOUT = 900


def _section(title: str) -> list[Block]:
    """The README's blocks under the ``## title`` heading, in order."""
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    first, last = text.count("\n", 0, start) + 1, text.count("\n", 0, end) + 1
    return [b for b in blocks(REPO_ROOT / "README.md") if first < b.line < last]


def _copy_checkout(dest: Path) -> None:
    """The tracked files of the working tree (symlinks kept), as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = REPO_ROOT / name, dest / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def test_the_readme_quick_start_works_from_a_fresh_virtualenv(tmp_path: Path) -> None:
    (install,) = [b for b in _section("Install") if b.lang == "sh"]
    checkout, venv, work, logs = (tmp_path / d for d in ("checkout", "venv", "work", "logs"))
    for folder in (checkout, work, logs):
        folder.mkdir()
    _copy_checkout(checkout)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    for command in commands(install.text):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, f"{command!r} failed:\n{done.stdout}\n{done.stderr}"

    quick = _section("Quick start")
    assert [b.lang for b in quick] == ["python", "sh", "sh", "python", "python"]
    assert quick[0].module == "hello"
    (work / "hello.py").write_text(quick[0].text)
    run = PageRun(
        work, python=str(venv / "bin" / "python3"), weir=[str(venv / "bin" / "weir")],
        env=env, logs=logs,
    )  # fmt: skip
    try:
        run.run_sh(quick[1], weir_in_bash="weir")
        assert run.server is not None, "the quick start's `weir serve` did not start a server"
        for block in quick[2:]:
            out = (
                run.run_sh(block, weir_in_bash="weir")
                if block.lang == "sh"
                else run.run_python(block)
            )
            assert "Hello, Ada!" in out, f"{block} printed {out!r}"
    finally:
        run.close()
    # The server was the installed package, not the checkout.
    where = subprocess.run(
        [str(venv / "bin" / "python3"), "-c", "import weir; print(weir.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert str(venv) in where, where
