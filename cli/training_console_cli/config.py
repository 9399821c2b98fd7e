"""Where tc finds the console and its token: TC_URL / TC_TOKEN, else the file `tc login` writes (0600)."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput, CliError


def config_path() -> Path:
    if os.environ.get("TC_CONFIG"):
        return Path(os.environ["TC_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "training-console" / "config.json"


@dataclass
class Settings:
    url: str
    token: str


def _stored() -> dict:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read {path}: {error}") from None
    return data if isinstance(data, dict) else {}


def load(url: str | None = None, token: str | None = None) -> Settings:
    """The options given, then the environment, then the config file."""
    stored = _stored()
    url = url or os.environ.get("TC_URL") or stored.get("url")
    token = token or os.environ.get("TC_TOKEN") or stored.get("token")
    if not url:
        raise BadInput("no console URL: run `tc login --url URL`, or set TC_URL")
    if not token:
        raise BadInput("no API token: run `tc login`, or set TC_TOKEN")
    return Settings(normalised_url(url), token)


def normalised_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise BadInput(f"the console URL must start with http:// or https://: {url!r}")
    return url


def save(settings: Settings) -> Path:
    """Written 0600 from the start: the token is a password."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        json.dump({"url": settings.url, "token": settings.token}, file)
        file.write("\n")
    return path
