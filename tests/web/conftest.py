"""Fixtures of the web page's tests: the extras they need (skipped where missing, failed where
MESHPLAN_REQUIRE_EXTRAS=1, as CI sets it), a live server on loopback, the system's Chromium."""

import contextlib
import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REQUIRED = os.environ.get("MESHPLAN_REQUIRE_EXTRAS") == "1"
CHROMIUM = os.environ.get("MESHPLAN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def cli_json(*argv: str) -> dict:
    """``meshplan ARGV``'s JSON output, run in this process (exit status 0 required): what the page must agree
    with."""
    from meshplan.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(list(argv)) == 0
    return json.loads(buf.getvalue())


def need(*modules: str, what: str) -> None:
    """Skip (fail under MESHPLAN_REQUIRE_EXTRAS=1) where a module of ``modules`` is not installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"needs {', '.join(missing)} ({what})"
        if REQUIRED:
            pytest.fail(f"{reason}; MESHPLAN_REQUIRE_EXTRAS=1 requires it")
        pytest.skip(reason)


def need_chromium() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        reason = f"needs the system's Chromium at {CHROMIUM} (apt-get install chromium)"
        if REQUIRED:
            pytest.fail(f"{reason}; MESHPLAN_REQUIRE_EXTRAS=1 requires it")
        pytest.skip(reason)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(*args: str, workers: int = 2, startup_s: float = 60.0):
    """``meshplan serve`` in a child process on a free loopback port; yields its base URL."""
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"meshplan-serve-{port}.log"
    parent = os.getpid()

    def die_with_parent() -> None:  # the server goes when the tests go, however they end
        from meshplan.parallel import _die_with_parent

        _die_with_parent(parent)

    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "meshplan.cli", "serve", "--port", str(port),
                                 "--workers", str(workers), *args], stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent if sys.platform == "linux" else None)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            try:
                with urllib.request.urlopen(url + "/api/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"meshplan serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where the browser tests save their screenshots: $MESHPLAN_ARTIFACTS, else a temporary folder."""
    import tempfile

    root = Path(os.environ.get("MESHPLAN_ARTIFACTS") or tempfile.mkdtemp(prefix="meshplan-web-"))
    root.mkdir(parents=True, exist_ok=True)
    return root
