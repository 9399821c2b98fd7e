"""What the console keeps at rest: a secret key of its own, files only its account reads, sealed keys that
survive a key rotation, and API tokens only as digests."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from jobs.models import ApiToken
from jobs.secret_box import open_secret, reseal, seal_secret
from tests.fixtures import api_client

BASE_DIR = Path(__file__).resolve().parents[2]


def start_settings(var_dir: Path, **env: str) -> str:
    """SECRET_KEY as a fresh process with this var/ directory reads its settings."""
    environment = {key: value for key, value in os.environ.items() if key != "SECRET_KEY"}
    # SQLite, as `make run` has it (the PostgreSQL pass of the tests sets DATABASE_URL).
    environment.update(CONSOLE_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="console.settings", DATABASE_URL="", **env)
    # As every entry point does (manage.py, the ASGI and WSGI applications): the state first, then the settings.
    started = "from console.state import prepare; prepare(); from django.conf import settings; print(settings.SECRET_KEY)"
    return subprocess.run([sys.executable, "-c", started],
                          cwd=BASE_DIR, env=environment, capture_output=True, text=True, check=True).stdout.strip()


def test_the_settings_only_read_and_say_what_is_missing_when_there_is_no_key(tmp_path):
    var_dir = tmp_path / "fresh"
    environment = {key: value for key, value in os.environ.items() if key != "SECRET_KEY"}
    environment.update(CONSOLE_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="console.settings", DATABASE_URL="")

    done = subprocess.run([sys.executable, "-c", "from django.conf import settings; settings.SECRET_KEY"],
                          cwd=BASE_DIR, env=environment, capture_output=True, text=True)

    assert done.returncode != 0 and "SECRET_KEY is not set" in done.stderr
    assert not var_dir.exists(), "reading the settings made nothing"


def test_without_a_secret_key_the_console_makes_one_keeps_it_private_and_uses_it_again(tmp_path):
    first = start_settings(tmp_path)
    again = start_settings(tmp_path)
    kept = tmp_path / "secret_key"
    assert len(first) >= 50 and first == again == kept.read_text().strip()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert start_settings(tmp_path / "elsewhere") != first, "each installation has its own key"


def test_the_var_directory_and_the_database_are_for_the_consoles_account_alone(tmp_path):
    start_settings(tmp_path)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "console.sqlite3").stat().st_mode) == 0o600


def test_a_key_given_in_the_environment_wins(tmp_path):
    assert start_settings(tmp_path, SECRET_KEY="k" * 60) == "k" * 60


def test_a_secret_sealed_with_the_old_key_opens_after_rotation_and_can_be_resealed(settings):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "old-key-" * 8, []
    sealed = seal_secret("-----BEGIN OPENSSH PRIVATE KEY-----")
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-key-" * 8, ["old-key-" * 8]
    assert open_secret(sealed) == "-----BEGIN OPENSSH PRIVATE KEY-----"
    moved = reseal(sealed)
    settings.SECRET_KEY_FALLBACKS = []
    assert open_secret(moved) == "-----BEGIN OPENSSH PRIVATE KEY-----"
    with pytest.raises(ValueError, match="SECRET_KEY_FALLBACKS"):
        open_secret(sealed)


@pytest.mark.django_db
def test_an_api_token_is_kept_only_as_a_digest_and_works_until_it_is_deleted(owner):
    record, token = ApiToken.issue(owner, "laptop")
    stored = ApiToken.objects.values_list("digest", "start").get(pk=record.pk)
    assert token not in stored[0] and token.startswith(stored[1]) and len(token) > 40
    client = api_client(owner)
    client.force_authenticate(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/training-jobs").status_code == 200
    record.delete()
    assert client.get("/api/v1/training-jobs").status_code == 401


def test_settings_use_a_key_that_is_not_the_old_public_default():
    assert "insecure-local-console-key" not in settings.SECRET_KEY


def test_resealsecrets_lets_a_rotated_key_be_retired(settings, make_job, owner):
    from io import StringIO

    from django.core.management import call_command

    from jobs.models import Node, ResourceSpec, Webhook
    from jobs.secret_box import open_secret, seal_secret

    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "the-old-key-" + "o" * 40, []
    node = Node(name="n1", address="10.9.0.1", spec=ResourceSpec.objects.create(name="s", cpu_cores=1, memory_gb=1))
    node.private_key = "node key"
    node.save()
    job = make_job()
    job.sealed_ssh_key = seal_secret("job key")
    job.save()
    Webhook.objects.create(user=owner, url="https://hooks.example.org/in", sealed_secret=seal_secret("hook secret"))

    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "the-new-key-" + "n" * 40, [settings.SECRET_KEY]
    out = StringIO()
    call_command("resealsecrets", stdout=out)
    settings.SECRET_KEY_FALLBACKS = []  # the old key retired

    assert "3 secret(s)" in out.getvalue()
    assert Node.objects.get(pk=node.pk).private_key == "node key"
    assert open_secret(type(job).objects.get(pk=job.pk).sealed_ssh_key) == "job key"
    assert open_secret(Webhook.objects.get(user=owner).sealed_secret) == "hook secret"


def test_resealsecrets_says_which_secret_no_key_opens(settings, make_job):
    from django.core.management import CommandError, call_command

    from jobs.secret_box import seal_secret

    settings.SECRET_KEY = "a-key-nobody-keeps-" + "x" * 40
    job = make_job()
    job.sealed_ssh_key = seal_secret("job key")
    job.save()
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "another-key-" + "y" * 40, []

    with pytest.raises(CommandError, match=f"TrainingJob {job.pk}"):
        call_command("resealsecrets")
