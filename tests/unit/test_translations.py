"""Every string the pages show has its Brazilian Portuguese: the catalogue, made again from today's code and
templates, has no untranslated or fuzzy entry, and the job page rendered in pt-BR shows none of the
catalogue's English."""

import gettext
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from html import unescape
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


# The catalogue's English with its placeholders: what a pt-BR page must not show, whatever values fill it in.
PLACEHOLDER = re.compile(r"%\\\(\w+\\\)[sdr]|%[sd]")


@lru_cache(maxsize=1)
def english_shapes() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Each msgid translated to something else and holding three words or more of its own, as a pattern that
    matches it with any value in its placeholders."""
    found = []
    for key, translated in _catalogue().items():
        if not isinstance(key, str) or not key or translated == key or re.search(r"<|\n|\{\w*\}", key):
            continue
        if len(re.findall(r"[A-Za-z]{3,}", re.sub(r"%\(\w+\)[sdr]", " ", key))) < 3:
            continue
        pattern = PLACEHOLDER.sub(lambda _match: "[^\n]{1,300}?", re.escape(key.replace("%%", "%")))
        found.append((key, re.compile(r"(?<![\w'-])" + pattern + r"(?![\w'-])")))
    return tuple(found)


def english_left(text: str) -> list[str]:
    return [key for key, pattern in english_shapes() if pattern.search(text)]


def shown_text(html: str) -> str:
    text = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    return re.sub(r"[ \t\r\f\v]+", " ", text)


def page_in(client: Client, language: str, path: str, **post) -> tuple[str, object]:
    """The page's HTML and its form (None where it has none), asked for in `language`."""
    try:
        answer = client.post(path, post, HTTP_ACCEPT_LANGUAGE=language) if post else client.get(
            path, HTTP_ACCEPT_LANGUAGE=language)
    finally:
        translation.activate("en")
    assert answer.status_code == 200, answer.status_code
    return answer.content.decode(), answer.context.get("form") if answer.context else None


BAD_EXTRA_ARGS = ("--report-bindings --foo", "--mca plm_rsh_agent x", "--mca btl_foo 1", "--bind-to bogus", "-x MA_X=1",
                  "-x OMPI_FOO=1", "--mca btl 'tcp;self'", "--map-by ppr:2:node", "--np 4", "'unclosed", "--mca", "-- x")
BAD_METRIC_REGEXES = ("loss=(\\d+", "loss=\\d+", "(?<=loss=)(\\d+)", "(a)\\1")


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value"), [("extra_args", value) for value in BAD_EXTRA_ARGS]
                         + [("metrics", value) for value in BAD_METRIC_REGEXES])
def test_a_form_refused_in_portuguese_says_why_in_portuguese(catalogue, owner, field, value):
    client = Client()
    client.force_login(owner)
    post = {"name": "recusado", "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py", "spec": "cpu",
            "node_count": "1"}
    post.update({"extra_args": value} if field == "extra_args" else {"metric_name": "loss", "metric_value": value})

    _english_page, english_form = page_in(client, "en", "/jobs/new", **post)
    html, form = page_in(client, "pt-BR", "/jobs/new", **post)

    english, said = english_form.errors[field], form.errors[field]  # type: ignore[attr-defined]
    assert said and len(said) == len(english), (english, said)
    assert all(portuguese != words for portuguese, words in zip(said, english, strict=True)), said
    assert not english_left("\n".join(said)), said
    assert not english_left(shown_text(html)), english_left(shown_text(html))


def bad_archives() -> dict[str, io.BytesIO]:
    def tar_gz(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for info, data in members:
                archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
        buffer.seek(0)
        buffer.name = "code.tar.gz"
        return buffer

    def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
        return info, data

    not_an_archive = io.BytesIO(b"plain text, no archive" * 10)
    not_an_archive.name = "code.zip"
    return {
        "not an archive": not_an_archive,
        "a link": tar_gz(entry("code/train.py", b"1"), entry("code/out", kind=tarfile.SYMTYPE, link="/etc")),
        "a fifo": tar_gz(entry("code/train.py", b"1"), entry("code/pipe", kind=tarfile.FIFOTYPE)),
        "no Python file": tar_gz(entry("code/README", b"hi")),
        "a path outside": tar_gz(entry("../train.py", b"1")),
        "too deep": tar_gz(entry("a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u/v/w/x/y/z/train.py", b"1")),
    }


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["not an archive", "a link", "a fifo", "no Python file", "a path outside", "too deep",
                                  "a bad name", "no archive"])
def test_an_upload_refused_in_portuguese_says_why_in_portuguese(catalogue, owner, settings, kind):
    from tests.fixtures import api_client

    settings.CODE_DIR_MAX_DEPTH = 8

    def refused(language: str) -> dict:
        fields: dict[str, object] = {"name": "../x" if kind == "a bad name" else f"code-{language}"}
        if kind != "no archive":
            fields["archive"] = bad_archives()["not an archive" if kind == "a bad name" else kind]
        try:
            answer = api_client(owner).post("/api/v1/code-dirs", fields, format="multipart", HTTP_ACCEPT_LANGUAGE=language)
        finally:
            translation.activate("en")
        assert answer.status_code == 400, answer.content
        return answer.json()

    english, said = refused("en"), refused("pt-BR")
    assert list(said) == list(english), (english, said)
    for field, messages in said.items():
        assert messages != english[field], messages
        assert not english_left("\n".join(messages)), messages


@pytest.mark.django_db
def test_the_capacity_page_in_portuguese_holds_no_english(catalogue, owner):
    from jobs.models import ResourceSpec
    from tests.fixtures import add_nodes

    add_nodes(ResourceSpec.objects.create(name="gpu-8", cpu_cores=32, memory_gb=256, gpu_count=8, gpu_model="A100"), 2)
    client = Client()
    client.force_login(owner)

    english, _form = page_in(client, "en", "/capacity")
    html, _form = page_in(client, "pt-BR", "/capacity")

    assert "CPU: 32 cores" in english, "the spec's words, as the English page says them"
    text = shown_text(html)
    assert "cpu: " in text and "gpu-8: " in text, "the spec names, as the administrator gave them"
    assert not re.search(r"\bcores\b|\bMemory\b", text), text
    assert not english_left(text), english_left(text)


# Each shape of message the runtime keeps on a worker's row, as it writes them.
WORKER_MESSAGES = (
    "preparing worker-0 on node-a (10.9.0.1)",
    "uploading code to worker-0",
    "input: fetching 12 files, 3.0 MB, onto node-a",
    "input: 3/12 files, 1.0 MB of 3.0 MB, 2.0 MB/s",
    "input ready: 12 files, 3.0 MB in 1.5 s; 1.0 MB fetched from the store, 2.0 MB from the node's cache",
    "checkpoint: fetching 1 file, 1.0 GB, onto node-a",
    "input ready: 1 file, 3.0 MB in 1.5 s; 3.0 MB fetched from the store, 0 bytes from the node's cache",
    "node-a has no registry.example/mpi:1: pulling it",
    "node-a has no tc/mpi:1: copying it from the console (1,024 MiB)",
    "node-a: 512 of 1,024 MiB of tc/mpi:1 copied (90 MiB/s)",
    "node-a: loading tc/mpi:1 (copied in 12 s)",
    "worker-0 container tc-job-1-w0 (job-1-worker-0) is up, sshd on port 2222",
    "node-a: starting the container failed: exit status 125: Error: no such image",
    "node-a: laying out the job's files failed: exit status 1: no space left on device",
    "node-a: SSH to 10.9.0.1:22 failed: connection refused",
    "node-a: fetching the input failed: exit status 1: 404",
    "console: choosing the image failed: the job's engine version names no image",
    "worker-0: container removed, no process left",
    "worker-0: 2 process(es) could not be ended",
)


@pytest.mark.django_db
def test_a_jobs_workers_table_in_portuguese_holds_no_english(make_job, owner):
    from jobs.models import Worker

    job = make_job(owner=owner, name="trabalhadores", node_count=len(WORKER_MESSAGES))
    for index, message in enumerate(WORKER_MESSAGES):
        Worker.objects.create(job=job, index=index, node_name="node-a", address="10.9.0.1", hostname=f"host-{index}",
                              message=message)
    client = Client()
    client.force_login(owner)

    def workers_cells(language: str) -> list[str]:
        html, _form = page_in(client, language, f"/jobs/{job.pk}")
        table = re.search(r'<section class="card" id="job-workers">.*?</section>', html, re.S)
        assert table, "the workers table"
        return [unescape(shown_text(cell)).strip() for cell in re.findall(r'<td class="sub">(.*?)</td>', table.group(0), re.S)]

    english, said = workers_cells("en"), workers_cells("pt-BR")
    assert english == list(WORKER_MESSAGES)
    assert len(said) == len(english)
    assert [message for message, portuguese in zip(english, said, strict=True) if message == portuguese] == []
    assert not english_left("\n".join(said)), english_left("\n".join(said))


# The timeline's messages of checkpoints, notices, holds and terminals, as the console writes them.
TIMELINE_MESSAGES = (
    "Checkpoint at step 1,200 (step-1200.pt, 4.0 MB) saved 3 s after the notice",
    "Checkpoint at step 10 (ck.pt, 1.0 KB) saved in the store",
    "Notice: SIGUSR1 sent to 4 rank(s); up to 8 s to save a checkpoint",
    "Notice: SIGUSR1 sent to 4 rank(s); up to 5 s to save a checkpoint (cut short: the nodes are taken back)",
    "Containers and nodes held for debugging until 12:24:00 UTC",
    "Released by alice",
    "The hold ended; the nodes were freed",
    "alice opened a shell in worker-0",
)


def test_the_timelines_checkpoint_notice_hold_and_terminal_messages_are_read_in_portuguese():
    from django.utils import translation

    from jobs.pages.display import translated_message

    with translation.override("pt-br"):
        said = [translated_message(message) for message in TIMELINE_MESSAGES]
    assert [message for message, portuguese in zip(TIMELINE_MESSAGES, said, strict=True) if message == portuguese] == []
    assert said[2] == "Aviso: SIGUSR1 enviado a 4 rank(s); até 8 s para salvar um checkpoint"
    assert said[3].endswith("(encurtado: os nós são retomados)")
