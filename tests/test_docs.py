"""Every code block in README.md and docs/*.md runs, and every relative link resolves.

How a fenced block is treated depends on its language (its info string):

* ````` ```text `````, ````` ```nginx `````, and any other language not below: output,
  a synopsis or configuration, not run (proxy configurations are the proxy tests').
  A block with no language at all fails the test: say what it is.
* ````` ```python ````` whose first line is ``# NAME.py``: the module ``NAME``. Every
  such block of every page is written to ``NAME.py`` in one work folder before any
  block runs, so a page may import another page's module (``from tour import app``).
  A module that defines ``app`` or ``mcp`` at top level is an app: the test serves it
  with ``weir serve NAME:app`` (or ``NAME:mcp``) and lists its tools.
* any other ````` ```python `````: a program, run with ``python`` in the work folder,
  which must exit 0.  ``127.0.0.1:8000`` (or ``localhost:8000``) in it becomes the
  address of the page's server: the one the page's last ``weir serve`` started, or
  ``weir serve demo`` when the page started none.  A block with a top-level ``await``
  is run as the body of a coroutine under Trio.
* ````` ```sh `````: run with ``bash -euo pipefail`` in the work folder, which must
  exit 0.  A ``weir serve …`` command (``\\`` continuations joined) is not given to
  bash: the test starts it as ``python -m weir serve …`` on ``127.0.0.1`` and a free
  port (its ``--host`` and ``--port`` are replaced), waits for its ``weir: serving``
  line, and keeps it as the page's server until the page ends.  In the other
  commands ``weir`` becomes ``python -m weir`` and the example address the server's.
* :data:`SKIP` lists the few blocks that are not run, each with its reason; a listed
  block that no longer exists fails the test, so the list cannot go stale.
  :data:`EXPECT` names what some blocks must print.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import trio

from tests.docblocks import PAGES, Block, PageRun, blocks, checkout_env
from tests.integration.serverproc import REPO_ROOT
from weir.engine.client import open_client

#: (page, the block's first line) -> why the test does not run it.
SKIP: Final[dict[tuple[str, str], str]] = {
    ("README.md", "python3 -m pip install '.[sdk]'"): (
        "installs into the running environment; tests/test_quickstart.py runs it in a "
        "fresh virtualenv"
    ),
    ("README.md", "python3 -m pip install -e '.[test,sdk,fastmcp]' && python3 -m pytest"): (
        "the whole test suite, this test included; .ci/run runs it"
    ),
    ("docs/layout.md", "python3 -m pip install -e '.[test,sdk,fastmcp]' && python3 -m pytest"): (
        "the whole test suite, this test included; .ci/run runs it"
    ),
}
#: (page, text that picks out exactly one block) -> what that block must print.
EXPECT: Final[dict[tuple[str, str], str]] = {
    ("README.md", "curl -s http://127.0.0.1:8000/mcp"): "Hello, Ada!",
    ("README.md", "from mcp import Client"): "Hello, Ada!",
    ("README.md", "from weir.engine.client import open_client"): "Hello, Ada!",
    ("docs/app.md", "engine.ServerConfig(port=0)"): "http://127.0.0.1:",
}
RUN_LANGS: Final = ("python", "sh")

ALL_BLOCKS: Final[list[Block]] = [b for page in PAGES for b in blocks(page)]


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def test_every_block_says_what_it_is() -> None:
    unnamed = [str(b) for b in ALL_BLOCKS if not b.lang]
    assert not unnamed, f"code blocks without a language: {unnamed}"


def test_the_skip_and_expect_lists_name_blocks_that_exist() -> None:
    firsts = {(b.page, b.first_line) for b in ALL_BLOCKS}
    assert set(SKIP) <= firsts, f"listed in SKIP but gone: {set(SKIP) - firsts}"
    for (page, text), _ in EXPECT.items():
        hits = [b for b in ALL_BLOCKS if b.page == page and text in b.text]
        assert len(hits) == 1, f"EXPECT {(page, text)!r} picks {len(hits)} blocks"


def test_module_names_are_unique() -> None:
    names = [b.module for b in ALL_BLOCKS if b.module]
    assert len(names) == len(set(names)), f"two pages define the same module: {names}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder holding every page's ``# NAME.py`` module."""
    folder = tmp_path_factory.mktemp("docs")
    for block in ALL_BLOCKS:
        if block.module:
            (folder / f"{block.module}.py").write_text(block.text)
    return folder


@pytest.fixture
def page_run(workdir: Path, tmp_path: Path) -> Iterator[PageRun]:
    run = PageRun(
        workdir,
        python=sys.executable,
        weir=[sys.executable, "-m", "weir"],
        env=checkout_env(),
        logs=tmp_path,
    )
    try:
        yield run
    finally:
        run.close()


async def _tool_names(url: str) -> set[str]:
    with trio.fail_after(30):
        async with open_client(url) as client:
            return {tool.name for tool in await client.list_tools()}


def _expected(block: Block) -> str | None:
    for (page, text), out in EXPECT.items():
        if page == block.page and text in block.text:
            return out
    return None


@pytest.mark.parametrize("page", [_rel(p) for p in PAGES])
def test_every_block_of_the_page_runs(page: str, page_run: PageRun) -> None:
    for block in (b for b in ALL_BLOCKS if b.page == page):
        if block.lang not in RUN_LANGS or (block.page, block.first_line) in SKIP:
            continue
        out: str | None = None
        if block.module:
            if block.app_attr:
                server = page_run.serve(["serve", f"{block.module}:{block.app_attr}"])
                assert trio.run(_tool_names, server.url), f"{block} serves no tool"
        elif block.lang == "python":
            out = page_run.run_python(block)
        else:
            out = page_run.run_sh(block, weir_in_bash=f"{sys.executable} -m weir")
        expected = _expected(block)
        if expected is not None:
            assert out is not None and expected in out, f"{block} printed {out!r}"


# ------------------------------------------------------------------------------- links
_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings (duplicates get ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    inside = False
    for line in page.read_text().split("\n"):
        if re.match(r"^\s*```", line):
            inside = not inside
        if inside or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen[f"{slug}-{n}"] = 1
    return set(seen)


@pytest.mark.parametrize("page", [_rel(p) for p in PAGES])
def test_every_relative_link_resolves(page: str) -> None:
    source = REPO_ROOT / page
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", source.read_text())  # not in code
    broken = []
    for match in _LINK.finditer(text):
        target = match.group("target")
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (source.parent / path).resolve() if path else source
        if not dest.exists():
            broken.append(f"{target} (no {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page}: broken links: {broken}"


def test_the_readme_gives_the_command_ci_runs() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "python3 -m pip install -e '.[test,sdk,fastmcp]' && python3 -m pytest\n" in readme
    for command in ("python3 -m pytest ||", "python3 -m pytest -m bench", "-m quickstart"):
        assert command in ci, f".ci/run no longer runs {command!r}"
    assert "python3 -m pytest -m quickstart" in readme
