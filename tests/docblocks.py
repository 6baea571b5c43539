"""The fenced code blocks of README.md and docs/*.md, and how a test runs them.

The conventions (a block's info string is its language) are the ones
``tests/test_docs.py`` documents; this module carries them out, for that test and for
``tests/test_quickstart.py``, which runs the README's quick start in a fresh virtualenv.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.serverproc import REPO_ROOT, WeirProcess

#: The pages whose blocks are run and whose links are checked.
PAGES: tuple[Path, ...] = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
#: The address every example uses; a test puts the server it started in its place.
EXAMPLE_ADDRESS = re.compile(r"(?:127\.0\.0\.1|localhost):8000")
#: ``# NAME.py`` on a Python block's first line: the block is the module NAME.
_MODULE = re.compile(r"^# (?P<name>[A-Za-z_]\w*)\.py\b")
#: A module-level ``app = …`` or ``mcp = …``: the module is an app to serve.
_APP = re.compile(r"^(?P<attr>app|mcp)(?::[^=]*)? = ", re.M)
_FENCE = re.compile(
    r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)(?:[ \t]+[\w-]+)*\s*$"
)  # then words ("tested")
RUN_TIMEOUT = 120.0


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and its text (dedented)."""

    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0].strip()

    @property
    def module(self) -> str | None:
        """The module name a ``# NAME.py`` Python block declares, if any."""
        match = _MODULE.match(self.text) if self.lang == "python" else None
        return match.group("name") if match else None

    @property
    def app_attr(self) -> str | None:
        """``app`` or ``mcp`` when this module block defines an app at top level."""
        match = _APP.search(self.text) if self.module else None
        return match.group("attr") if match else None

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang}: {self.first_line!r})"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order; an unclosed fence is an error."""
    lines = page.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = len(opening.group("indent"))
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page}:{i + 1}: a code fence is never closed")
        rel = str(page.relative_to(REPO_ROOT))
        found.append(Block(rel, i + 1, opening.group("lang"), "\n".join(body) + "\n"))
        i = j + 1
    return found


def commands(sh: str) -> list[str]:
    """A shell block's commands: ``\\`` continuations joined, blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", sh)
    return [line for line in joined.split("\n") if line.strip()]


class PageRun:
    """Runs one page's blocks in order, in ``workdir``, keeping the server the last
    ``weir serve`` started until :meth:`close`.

    ``weir`` is the command that stands for ``weir`` (``python -m weir`` from the
    checkout, or a virtualenv's console script); ``python`` runs Python blocks.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        python: str,
        weir: Sequence[str],
        env: Mapping[str, str],
        logs: Path,
    ) -> None:
        self.workdir = workdir
        self.python = python
        self.weir = list(weir)
        self.env = dict(env)
        self.logs = logs
        self.server: WeirProcess | None = None
        self._files = ExitStack()  # the servers' output files

    # ------------------------------------------------------------------ servers
    def serve(self, args: Sequence[str]) -> WeirProcess:
        """``weir serve ARGS`` on a free loopback port, the page's server from now on."""
        self.stop()
        kept: list[str] = []
        rest = list(args)
        while rest:
            arg = rest.pop(0)
            if arg in ("--host", "--port"):
                rest.pop(0)  # the test's own loopback address and free port instead
            elif not arg.startswith(("--host=", "--port=")):
                kept.append(arg)
        # The files outlive this call: the server writes them until close().
        out = self._files.enter_context(tempfile.TemporaryFile(dir=self.logs))  # noqa: SIM115
        err = self._files.enter_context(tempfile.TemporaryFile(dir=self.logs))  # noqa: SIM115
        argv = [*self.weir, *kept, "--host", "127.0.0.1", "--port", "0"]
        self.server = WeirProcess("", out, err, argv=argv, cwd=self.workdir, env=self.env)
        return self.server

    def address(self) -> str:
        """``127.0.0.1:PORT`` of the page's server (``weir serve demo`` if none yet)."""
        if self.server is None:
            self.serve(["serve", "demo"])
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def close(self) -> None:
        self.stop()
        self._files.close()

    # ------------------------------------------------------------------ blocks
    def run_sh(self, block: Block, *, weir_in_bash: str) -> str:
        """Run a shell block: ``weir serve`` lines start the page's server, the rest
        goes to bash with the example address replaced. Returns bash's stdout."""
        script: list[str] = []
        for command in commands(block.text):
            words = shlex.split(command, comments=True)
            if words[:2] == ["weir", "serve"]:
                self.serve(words[1:])
                continue
            if EXAMPLE_ADDRESS.search(command):
                command = EXAMPLE_ADDRESS.sub(self.address(), command)
            script.append(re.sub(r"^(\s*)weir ", rf"\g<1>{weir_in_bash} ", command))
        if not script:
            return ""
        return self._run(["bash", "-euo", "pipefail", "-c", "\n".join(script)], block)

    def run_python(self, block: Block) -> str:
        """Run a Python program block against the page's server; returns its stdout.
        A block with a top-level ``await`` runs as the body of a coroutine under Trio."""
        code = block.text
        if EXAMPLE_ADDRESS.search(code):
            code = EXAMPLE_ADDRESS.sub(self.address(), code)
        try:
            compile(code, str(block), "exec")
        except SyntaxError:
            body = "".join(f"    {line}\n" if line else "\n" for line in code.splitlines())
            code = f"import trio\n\n\nasync def _block() -> None:\n{body}\n\ntrio.run(_block)\n"
        path = self.workdir / f"_block_{Path(block.page).stem}_{block.line}.py"
        path.write_text(code)
        return self._run([self.python, path.name], block)

    def _run(self, argv: list[str], block: Block) -> str:
        try:
            done = subprocess.run(
                argv,
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{block} did not finish in {RUN_TIMEOUT:.0f} s: {exc}", pytrace=False)
        if done.returncode != 0:
            server = self.server.output() if self.server else ""
            pytest.fail(
                f"{block} exited with {done.returncode}\n--- stdout ---\n{done.stdout}\n"
                f"--- stderr ---\n{done.stderr}\n{server}",
                pytrace=False,
            )
        return done.stdout


def checkout_env(extra_path: Sequence[Path] = ()) -> dict[str, str]:
    """This environment, with the checkout (and ``extra_path``) importable."""
    paths = [str(REPO_ROOT), *map(str, extra_path)]
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])])}
