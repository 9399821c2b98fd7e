"""Every string the pages show has its Brazilian Portuguese: the catalogue, made again from today's code and
templates, has no untranslated or fuzzy entry, and the job page rendered in pt-BR shows none of the
catalogue's English."""

import gettext
import re
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
from django.test import Client
from django.utils import translation

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "locale" / "pt_BR" / "LC_MESSAGES" / "django.po"
SOURCES = ("manage.py", "console", "jobs", "nccl", "templates", "static", "locale")
# Words the same in both languages, or names: never taken for English left behind.
SAME_IN_BOTH = re.compile(r"^[A-Z0-9_ .:/-]+$")


def msgfmt_statistics(po: Path, tmp_path: Path) -> str:
    done = subprocess.run(["msgfmt", "--check-format", "--statistics", "-o", str(tmp_path / "check.mo"), str(po)],
                          capture_output=True, text=True, check=True)
    return done.stderr.strip()


@lru_cache(maxsize=1)
def _catalogue() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        compiled = Path(folder) / "django.mo"
        subprocess.run(["msgfmt", "-o", str(compiled), str(CATALOGUE)], check=True)
        with open(compiled, "rb") as handle:
            return dict(gettext.GNUTranslations(handle)._catalog)  # type: ignore[attr-defined]


def untranslatable_free_msgids() -> list[str]:
    """The catalogue's English strings that a pt-BR page must not show: plain text (no placeholder), a
    word or more, translated to something else."""
    found = []
    for key, translated in _catalogue().items():
        if not isinstance(key, str) or not key or translated == key:
            continue
        if re.search(r"%\(|%s|\{\w*\}|<|\n", key) or SAME_IN_BOTH.match(key) or len(key) < 3:
            continue
        found.append(key)
    return found


def test_the_catalogue_made_from_todays_sources_has_every_entry_translated(tmp_path):
    copy = tmp_path / "console"
    copy.mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "vendor"))
        else:
            shutil.copy(source, copy / name)
    subprocess.run([sys.executable, "manage.py", "makemessages", "-l", "pt_BR", "--no-obsolete", "-v", "0"],
                   cwd=copy, check=True, capture_output=True)
    statistics = msgfmt_statistics(copy / "locale" / "pt_BR" / "LC_MESSAGES" / "django.po", tmp_path)
    assert "untranslated" not in statistics and "fuzzy" not in statistics, (
        f"{statistics}: run makemessages -l pt_BR and translate what it added")


@pytest.mark.django_db
def test_the_failed_job_page_in_portuguese_shows_no_english_of_the_catalogue(make_job, owner):
    from jobs.models import JobStatus

    job = make_job(owner=owner, name="quebrado", status=JobStatus.FAILED, exit_code=1, failure={"kind": "exit_code", "title": "t"},
                   status_message="Training end with return code: 1")
    client = Client()
    client.force_login(owner)
    try:
        html = client.get(f"/jobs/{job.pk}", HTTP_ACCEPT_LANGUAGE="pt-BR").content.decode()
    finally:
        translation.activate("en")  # the request left pt-BR active in this thread
    text = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    text = re.sub(r"\s+", " ", text)
    with translation.override("pt-br"):
        left = [msgid for msgid in untranslatable_free_msgids()
                if re.search(r"(?<![\w'-])" + re.escape(msgid) + r"(?![\w'-])", text)]
    assert not left, [(msgid, text[max(text.find(msgid) - 80, 0):text.find(msgid) + 80]) for msgid in left]


def test_a_failure_card_made_in_english_is_read_in_portuguese():
    from jobs.pages.card_words import card_words

    with translation.override("pt-br"):
        assert card_words("Rank 3 (worker-1, node-b) raised ValueError: bad") == (
            "Rank 3 (worker-1, node-b) lançou ValueError: bad")
        assert card_words("ended by mpirun (SIGTERM) after rank 3 failed") == (
            "encerrado pelo mpirun (SIGTERM) depois que o rank 3 falhou")
        assert card_words("exit code 137: killed, most often for running out of memory, after SIGTERM was sent to it") == (
            "código de saída 137: morto, quase sempre por falta de memória, depois que SIGTERM lhe foi enviado")
        assert card_words("something the console never says") == "something the console never says"
