"""Fixtures for the chat service: a real Postgres beside SQLite, and live servers on free ports."""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import openai
import psycopg
import pytest
import uvicorn

from chatsvc.api.main import create_api
from chatsvc.db import create_db_engine, migrate, session_factory
from chatsvc.settings import Settings

ADMIN_KEY = "kvc-test-admin-key"
MODEL = "SmolLM2-135M-Instruct"  # the bundled model's folder: the name it is served by


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def _run(command: list[str], as_postgres: bool) -> None:
    prefix = ["runuser", "-u", "postgres", "--"] if as_postgres else []
    result = subprocess.run(prefix + command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])}: {(result.stderr or result.stdout).strip()}")


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway cluster of Debian's postgresql (`make test` installs it); skips if it cannot start."""
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip(
            "Postgres tests skipped: Debian's postgresql is not installed (apt-get install -y postgresql)"
        )
    as_postgres = os.geteuid() == 0  # the server refuses to run as root
    root = Path(
        tempfile.mkdtemp(prefix="kvchat-pg-")
    )  # not under pytest's private tmp: postgres must enter it
    data, port = root / "data", free_port()
    try:
        if as_postgres:
            shutil.chown(root, "postgres")
        _run(
            [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "kvchat", "--no-sync"], as_postgres
        )
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        pg_ctl = [
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-o",
            options,
            "-w",
            "start",
        ]
        _run(pg_ctl, as_postgres)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"Postgres tests skipped: the test cluster did not start ({error})")
    yield f"postgresql+psycopg://kvchat@127.0.0.1:{port}"
    _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], as_postgres)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kvchat.db'}"
    server = request.getfixturevalue("postgres_url")
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.replace("+psycopg", "") + "/postgres", autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return f"{server}/{name}"


@pytest.fixture
def database(db_url):
    """A migrated database of each kind, as a sessionmaker."""
    engine = create_db_engine(db_url)
    migrate(engine)
    yield session_factory(engine)
    engine.dispose()


def server_settings(data_dir: Path, model_dir: Path, **overrides) -> Settings:
    """float32 unless a test says otherwise: tests expect particular replies ("Paris"), and `auto` would
    pick bf16 on a CPU with bf16 units, whose kernels round differently from one change to the next."""
    overrides.setdefault("dtype", "float32")
    return Settings(data_dir=data_dir, model=str(model_dir), api_key=ADMIN_KEY, port=free_port(), **overrides)


def wait_healthy(url: str, timeout_s: float = 180, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not become healthy within {timeout_s} s")


class LiveServer:
    """The API app under uvicorn on 127.0.0.1 in a thread of the test process (the UI has its own tests)."""

    def __init__(self, settings: Settings):
        self.app = create_api(settings)
        self.data_dir = settings.data_path()
        self.url = f"http://127.0.0.1:{settings.port}"
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=settings.port, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def service(self):
        return self.app.state.service

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        wait_healthy(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def wait_idle(self, timeout_s: float = 60) -> None:
        """Until no reply is generating (earlier tests' aborts included) and every finished turn is indexed
        and its KV recorded."""
        deadline = time.monotonic() + timeout_s
        while self.service.turns.busy_sessions or self.service.turns.after_turns:
            assert time.monotonic() < deadline, "replies still generating"
            time.sleep(0.05)

    def rest(self, method: str, path: str, key: str = ADMIN_KEY, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=120, **kwargs)


@pytest.fixture(scope="session")
def server(tmp_path_factory, smollm2_dir):
    """One live server for the API, knowledge-base and session-KV tests (starting one takes a while).
    Two generations at most (the 429 test), and small upload limits (the upload tests)."""
    settings = server_settings(
        tmp_path_factory.mktemp("api"),
        smollm2_dir,
        max_active_generations=2,
        max_file_bytes=4000,
        max_upload_bytes=64_000,
    )
    with LiveServer(settings) as live:
        yield live


@pytest.fixture
def client(server) -> openai.OpenAI:
    server.wait_idle()
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY, max_retries=0)
