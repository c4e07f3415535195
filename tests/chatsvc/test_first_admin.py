"""The first start's admin credentials: generated ones go to the terminal once, or to a file only the server's
user can read, never to a log; chosen ones come from files or the environment, not the command line that
`ps` shows; the data folder and the database are private to the server's user."""

import logging
import re
import stat
import sys
from pathlib import Path

import pytest

from chatsvc import crud
from chatsvc.api.main import create_api
from chatsvc.settings import Settings, settings_from_cli
from tests.chatsvc.conftest import free_port


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def first_start(data_dir: Path, model_dir: Path, **settings):
    app = create_api(Settings(data_dir=data_dir, model=str(model_dir), port=free_port(), **settings))
    return app.state.service


def test_generated_credentials_go_to_a_private_file_and_never_to_the_log(
    tmp_path, smollm2_dir, capfd, caplog
):
    data_dir = tmp_path / "data"
    with caplog.at_level(logging.INFO):
        service = first_start(data_dir, smollm2_dir)  # stderr is captured here, not a terminal
    handed_over = (data_dir / "first-admin.txt").read_text()
    key = re.search(r"API key: (\S+)", handed_over).group(1)
    password = re.search(r"password: (\S+)", handed_over).group(1)
    printed = capfd.readouterr()
    for secret in (key, password):
        assert secret not in printed.out + printed.err and secret not in caplog.text
    assert "first-admin.txt" in caplog.text
    assert mode(data_dir / "first-admin.txt") == 0o600
    assert mode(data_dir) == 0o700 and mode(data_dir / "kvchat.db") == 0o600
    with service.db.begin() as db:
        assert crud.user_by_password(db, "admin", password).username == "admin"
        assert crud.user_by_api_key(db, key).username == "admin"


def test_at_a_terminal_they_are_shown_once_and_not_written(tmp_path, smollm2_dir, capfd, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    first_start(tmp_path / "data", smollm2_dir)
    assert "password:" in capfd.readouterr().err
    assert not (tmp_path / "data" / "first-admin.txt").exists()


def test_chosen_credentials_come_from_files_or_the_environment(tmp_path, smollm2_dir, monkeypatch):
    (tmp_path / "password").write_text("from-a-file-1\n")
    (tmp_path / "key").write_text("kvc-from-a-file\n")
    settings = settings_from_cli(
        ["--admin-password-file", str(tmp_path / "password"), "--api-key-file", str(tmp_path / "key")]
    )
    assert settings.first_admin_secrets() == ("kvc-from-a-file", "from-a-file-1")
    with pytest.raises(ValueError, match=r"cannot read .*missing"):
        settings_from_cli(["--api-key-file", str(tmp_path / "missing")]).first_admin_secrets()
    service = first_start(tmp_path / "data", smollm2_dir, admin_password_file=tmp_path / "password")
    assert "password" not in (tmp_path / "data" / "first-admin.txt").read_text()  # only the key was made
    with service.db.begin() as db:
        assert crud.user_by_password(db, "admin", "from-a-file-1").username == "admin"
    monkeypatch.setenv("KVCHAT_ADMIN_PASSWORD", "from-the-environment-1")
    assert settings_from_cli([]).first_admin_secrets() == (None, "from-the-environment-1")
