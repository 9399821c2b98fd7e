"""The console's state on disk, made by its entry points before the settings are read (the settings only
read: importing them creates nothing).

`prepare()` makes the var/ directory (0700), the secret key when the environment gives none
(var/secret_key, 0600, made once; another process that made it first wins) and the SQLite files with the
console's account alone able to read them. `manage.py`, the ASGI and WSGI applications call it first;
a Celery worker is started after them (`make run`), or with SECRET_KEY in its environment.
It reads the environment as the settings do, and imports nothing of Django.
"""

import os
import secrets
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    return Path(os.environ.get("CONSOLE_VAR_DIR") or BASE_DIR / "var")


def secret_key_file(directory: Path) -> Path:
    return directory / "secret_key"


def _private_file(path: Path, text: str) -> None:
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: theirs is the one
        return
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text + "\n")


def _private_database(path: Path) -> None:
    # The file (and the WAL files SQLite makes beside it with its mode) for the console's account only.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)


def prepare() -> Path:
    """Make what the settings read; safe to call from every process, any number of times."""
    directory = var_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    if not os.environ.get("SECRET_KEY"):
        _private_file(secret_key_file(directory), secrets.token_urlsafe(50))
    if not os.environ.get("DATABASE_URL"):
        run_id = os.environ.get("TEST_RUN_ID") or "0"
        for database in (Path(os.environ.get("CONSOLE_SQLITE_PATH") or directory / "console.sqlite3"),
                         directory / f"test-console-{run_id}.sqlite3"):
            _private_database(database)
    return directory
