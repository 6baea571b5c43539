"""``weir serve`` as a new user first runs it: from the app's folder, and failing well.

The command is run as the installed console script runs it: a script in a folder of
its own (``bin/weir``, so ``sys.path[0]`` is that folder, not the working directory),
with ``PYTHONPATH`` holding only this checkout (so ``weir`` imports), from a
temporary working directory.  Every start-up failure must be exactly one line on
stderr naming the cause, a non-zero exit status, and no traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.conftest import ValkeyProcess
from tests.integration.serverproc import REPO_ROOT

TIMEOUT = 60.0

#: An app whose lifespan fails: importing it is visible (the failure names it).
MYAPP = textwrap.dedent(
    """
    import contextlib
    from weir.app import App

    app = App("myapp")

    @app.lifespan
    @contextlib.asynccontextmanager
    async def opened(served):
        raise RuntimeError("myapp's database is unreachable")
        yield
    """
)


def weir(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``weir ARGS`` the way the console script does; its completed process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "weir"
    script.write_text("import sys\nfrom weir.engine.cli import main\nsys.exit(main())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd or tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed start (asserting that it is one)."""
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "weir: serving" not in done.stdout
    return lines[0]


def test_the_app_is_imported_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(MYAPP)
    line = one_line_failure(weir(tmp_path, "serve", "myapp:app", "--port", "0"))
    assert line == (
        "weir: the app's lifespan failed at start-up: RuntimeError: myapp's database is unreachable"
    )


def test_app_dir_names_where_the_app_is(tmp_path: Path) -> None:
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "myapp.py").write_text(MYAPP)
    done = weir(tmp_path, "serve", "myapp:app", "--app-dir", "apps", "--port", "0")
    assert "myapp's database is unreachable" in one_line_failure(done)


def test_an_app_dir_that_is_not_there_is_named(tmp_path: Path) -> None:
    done = weir(tmp_path, "serve", "myapp:app", "--app-dir", "no-such-dir", "--port", "0")
    assert one_line_failure(done) == "weir: --app-dir 'no-such-dir' is not a directory"


def test_an_app_that_cannot_be_imported(tmp_path: Path) -> None:
    line = one_line_failure(weir(tmp_path, "serve", "nosuchmodule:app", "--port", "0"))
    assert line.startswith("weir: cannot import 'nosuchmodule'")
    (tmp_path / "broken.py").write_text("app = 1 / 0\n")
    line = one_line_failure(weir(tmp_path, "serve", "broken:app", "--port", "0"))
    assert "ZeroDivisionError" in line


def test_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = one_line_failure(weir(tmp_path, "serve", "--port", str(port)))
    assert line.startswith(f"weir: cannot listen on 127.0.0.1:{port}: the port is in use")
    assert "--port" in line


def test_a_host_that_is_no_host_name(tmp_path: Path) -> None:
    # (an empty label fails before any lookup: no traffic leaves the machine)
    line = one_line_failure(weir(tmp_path, "serve", "--host", "no..such", "--port", "0"))
    assert line.startswith("weir: cannot listen on no..such: --host")


def test_an_unresolvable_host_is_explained() -> None:
    from weir.engine._startup import explain

    failed = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    group = ExceptionGroup("nursery", [RuntimeError("unrelated"), failed])
    line = explain(group, "nosuch.example", 8000)
    assert line is not None and "--host does not resolve" in line


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://127.0.0.1:99999/0", "the port must be a number from 1 to 65535"),
        ("redis://127.0.0.1:6379/abc", "the path must be a database index"),
        ("redis+cluster://127.0.0.1:7000/3", "a cluster has only database 0"),
    ],
)
def test_a_store_url_that_cannot_be_right(tmp_path: Path, url: str, words: str) -> None:
    line = one_line_failure(weir(tmp_path, "serve", "--store", url, "--port", "0"))
    assert words in line


def test_store_replicas_need_a_redis_store_and_a_sane_count(tmp_path: Path) -> None:
    line = one_line_failure(weir(tmp_path, "serve", "--store-replicas", "1", "--port", "0"))
    assert line == "weir: --store-replicas needs a Redis store (--store redis://...)"
    line = one_line_failure(
        weir(tmp_path, "serve", "--store", "redis://127.0.0.1:1", "--store-replicas", "99")
    )
    assert "--store-replicas must be 0 to 16" in line
    line = one_line_failure(
        weir(
            tmp_path,
            *("serve", "--store", "redis://127.0.0.1:1", "--store-replicas", "1"),
            *("--store-replica-timeout", "2"),
        )
    )
    assert "less than the store's 2 s deadline" in line


def test_a_database_the_store_does_not_have(tmp_path: Path, valkey_url: str) -> None:
    done = weir(tmp_path, "serve", "--store", f"{valkey_url}/99", "--port", "0")
    assert "has no such database" in one_line_failure(done)


def test_a_wrong_store_password(tmp_path: Path, private_valkey: ValkeyProcess) -> None:
    assert private_valkey.command("CONFIG", "SET", "requirepass", "right-one") == b"+OK"
    where = f"127.0.0.1:{private_valkey.port}/0"
    line = one_line_failure(
        weir(tmp_path, "serve", "--store", f"redis://:wrong@{where}", "--port", "0")
    )
    assert "authentication failed" in line and "pipelined" not in line
    assert "wrong" not in line  # the password itself is never shown
    line = one_line_failure(weir(tmp_path, "serve", "--store", f"redis://{where}", "--port", "0"))
    assert "requires a password" in line


def test_an_sdk_app_whose_security_cannot_be_kept_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    app = "tests.integration.sdk_auth_app:no_resource"
    line = one_line_failure(weir(tmp_path, "serve", app, "--app-dir", str(REPO_ROOT)))
    assert line.startswith("weir: refusing to serve the app open:")
    assert "resource_server_url" in line and "--auth-issuer" in line


def test_version(tmp_path: Path) -> None:
    import weir as package

    done = weir(tmp_path, "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"weir {package.__version__}"


@pytest.mark.parametrize(
    "url",
    [
        "memory",
        "redis://127.0.0.1",
        "redis://127.0.0.1:6379/3",
        "rediss://user:p%40ss@cache.example:6380/0?ssl_cert_reqs=none",
        "redis://:pa?ss/wd@127.0.0.1:6379/0",  # (a password is not parsed as a path)
        "redis+cluster://10.0.0.1:7000,10.0.0.2:7001",
        "redis://[::1]:6379/1",
    ],
)
def test_store_urls_that_can_be_right_pass(url: str) -> None:
    from weir.engine.cli import check_store_url

    check_store_url(url)


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ('{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}', "kty 'oct' cannot verify"),
        ('{"keys": []}', "it has none"),
        ("[]", "a JWKS without a list of keys"),
    ],
    ids=["only-a-symmetric-key", "no-keys", "not-a-key-set"],
)
@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
def test_a_jwks_file_without_a_usable_key_is_refused_at_start(
    tmp_path: Path, keys: str, why: str, runtime: str
) -> None:
    # Served, every token would be refused for the life of the process: say it now.
    (tmp_path / "jwks.json").write_text(keys)
    auth = ["--auth-issuer", "https://issuer.test", "--auth-resource", "http://127.0.0.1/mcp"]
    serve = ["serve", "--runtime", runtime, "--port", "0"]
    done = weir(tmp_path, *serve, *auth, "--auth-jwks-file", "jwks.json")
    line = one_line_failure(done)
    assert line.startswith("weir: --auth-jwks-file holds no key that can verify "), line
    assert why in line


def test_a_lifespan_that_never_finishes_starting_is_cut_and_named(tmp_path: Path) -> None:
    (tmp_path / "stuck.py").write_text(
        textwrap.dedent(
            """
            import contextlib
            import trio
            from weir.app import App

            app = App("stuck")

            @app.lifespan
            @contextlib.asynccontextmanager
            async def opened(served):
                await trio.sleep_forever()  # a database that never answers
                yield
            """
        )
    )
    done = weir(tmp_path, "serve", "stuck:app", "--port", "0", "--startup-timeout", "0.5")
    line = one_line_failure(done)
    assert line.startswith("weir: the app's lifespan did not finish starting within 0.5 s")
    assert "--startup-timeout" in line


def test_a_startup_timeout_must_be_a_positive_number(tmp_path: Path) -> None:
    done = weir(tmp_path, "serve", "demo", "--port", "0", "--startup-timeout", "0")
    assert done.returncode == 2 and "must be above 0 seconds" in done.stderr
