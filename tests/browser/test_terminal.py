"""The job page's terminal in a real Chromium: the owner opens a shell in a running job's worker, types `ls` and
`py-spy dump` into it and reads the answers drawn by xterm.js, with nothing refused by the page's
Content-Security-Policy; a viewer's page has no terminal."""

import re

from playwright.sync_api import expect
from rest_framework.test import APIClient

from jobs.models import JobStatus, TrainingJob
from tests.browser.helpers import log_in
from tests.integration.helpers import submit_program, wait_for


def running_hang_job(owner) -> TrainingJob:
    api = APIClient()
    api.force_authenticate(owner)
    job = submit_program(api, "hang.py", parameters=[{"name": "rank", "value": "-1"}])
    return wait_for(job, [JobStatus.RUNNING], timeout=240)


def test_the_owner_types_ls_into_a_running_jobs_terminal_and_reads_the_answer(page, owner, console, screenshots):
    job = running_hang_job(owner)
    refused: list[str] = []
    page.on("console", lambda message: refused.append(message.text)
            if "Content Security Policy" in message.text else None)
    page.on("pageerror", lambda error: refused.append(str(error)))
    log_in(page, "owner")
    page.goto(f"/jobs/{job.pk}#terminal")
    page.select_option("[data-terminal-worker]", "1")
    page.click("[data-terminal-open]")
    screen = page.locator("[data-terminal-screen] .xterm-rows")
    expect(screen).to_contain_text("$", timeout=60_000)
    page.locator("[data-terminal-screen]").click()
    page.keyboard.type("cd /home/ma-user && mkdir -p seen-by-ls && ls && echo sum-$((40+2))")
    page.keyboard.press("Enter")
    expect(screen).to_contain_text("seen-by-ls", timeout=30_000)
    expect(screen).to_contain_text("sum-42")
    # A live rank's Python stack, read by py-spy (shipped in the engine images) as the job's own user.
    page.keyboard.type("clear; py-spy dump --pid $(pgrep -n python)")
    page.keyboard.press("Enter")
    expect(screen).to_contain_text("(hang.py:", timeout=30_000)
    expect(screen).to_contain_text("Python v3")
    page.screenshot(path=screenshots / "job-terminal.png", full_page=True)
    page.click("[data-terminal-close]")
    expect(page.locator("[data-terminal-status]")).to_have_text(re.compile("owner closed it"), timeout=30_000)
    assert refused == [], "\n".join(refused)
    messages = list(job.events.filter(kind="shell").values_list("message", flat=True))
    assert messages[0] == "owner opened a shell in worker-1" and "closed after" in messages[-1]
    APIClient().post(f"/api/v1/training-jobs/{job.pk}/stop")


def test_a_job_page_shows_no_terminal_to_anyone_but_the_owner(page, owner, console):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from tests.browser.helpers import PASSWORD

    job = TrainingJob.objects.create(name="someone-elses", owner=owner, engine_version=console["engine"],
                                     code_dir=_any_code_dir(), boot_file="x.py", spec=console["spec"],
                                     status=JobStatus.RUNNING, bind_args="", x_args="", mca_args="", tune_prefixes="")
    watcher = get_user_model().objects.create_user("watcher", password=PASSWORD)
    watcher.user_permissions.add(Permission.objects.get(codename="view_trainingjob"))
    log_in(page, "watcher")
    page.goto(f"/jobs/{job.pk}")
    expect(page.locator("h1, .job-head").first).to_be_visible()
    expect(page.locator("#tab-terminal")).to_have_count(0)
    expect(page.locator("[data-terminal]")).to_have_count(0)


def _any_code_dir():
    from tests.integration.helpers import code_dir_from_program

    return code_dir_from_program("probe-terminal", "probe.py")
