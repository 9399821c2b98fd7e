"""The creation form and the job pages in a real Chromium, with real jobs on the local cluster."""

import io
import re
import tarfile
import zipfile

from playwright.sync_api import expect

from jobs.launch.masking import MASK
from jobs.models import JobStatus, TrainingJob
from jobs.submission.forms import TrainingJobForm
from jobs.submission.jobs import submit_job
from tests.browser.helpers import add_rows, log_in, row_values
from tests.integration.helpers import code_dir_from_program, wait_for

SECRET = "hunter2-browser-secret"
JOB_RUN_TIMEOUT_MS = 120_000


def test_a_user_fills_the_form_watches_the_command_follow_the_node_count_and_sees_the_job_complete(
        page, owner, console, screenshots):
    code_dir = code_dir_from_program("probe-e2e", "probe.py")
    log_in(page, "owner")
    page.goto("/jobs/new")
    assert re.fullmatch(r"job-\d{4}-[0-9a-f]{4}", page.input_value("#id_name")), "a generated name is offered"

    page.fill("#id_name", "browser-e2e")
    page.fill("#id_description", "made in a real browser")
    page.select_option("#id_engine_family", label="MPI")
    page.select_option("#id_engine", label="local-mpi4py")
    page.select_option("#id_code_dir", value=str(code_dir.pk))
    expect(page.locator("#boot-files option[value='probe.py']")).to_have_count(1)
    page.fill("#id_boot_file", "probe.py")
    expect(page.locator("#id_working_dir")).to_have_value("/home/ma-user/user-job-dir/probe-e2e")
    page.fill("#id_data_url", "/cache/data")
    add_rows(page, "param", [("count", "3"), ("show_env", "MA_NUM_HOSTS")])
    add_rows(page, "env", [("CRED_TOKEN", SECRET)])
    page.select_option("#id_spec", label=console["spec"].display)
    page.fill("#id_node_count", "1")

    preview = page.locator("#command-preview")
    expect(preview.locator('[data-preview="np"]')).to_have_text("2")
    expect(page.locator("#preview-expanded")).to_contain_text("mpirun -np 2 -hostfile /home/ma-user/.mpi/hostfile ")
    page.fill("#id_node_count", "2")
    expect(preview.locator('[data-preview="np"]')).to_have_text("4")
    expect(page.locator("#preview-expanded")).to_contain_text("mpirun -np 4 ")
    expect(page.locator("#preview-expanded")).to_contain_text(
        "/home/ma-user/user-job-dir/probe-e2e/probe.py --data_url=/cache/data --count=3 --show_env=MA_NUM_HOSTS")
    expect(page.locator("#preview-template")).to_contain_text("mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH}")
    expect(page.locator("#preview-hostfile")).to_have_text(re.compile(r"^\S+-worker-0 slots=2\n\S+-worker-1 slots=2\n?$"))
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=screenshots / "job-form.png", full_page=True)

    page.click("#submit-job")

    page.wait_for_url(re.compile(r"/jobs/\d+$"))
    job = TrainingJob.objects.get(name="browser-e2e")
    result = page.locator("#job-result")
    expect(result.locator("[data-state-badge]")).to_have_text("Completed", timeout=JOB_RUN_TIMEOUT_MS)
    log_view = page.locator("[data-log-view]")
    expect(log_view).to_contain_text("SEQ 3 2")
    expect(page.locator("#job-log")).to_have_attribute("data-complete", "true")
    expect(result.locator("[data-exit-code]")).to_have_text("0")
    expect(page.locator("#job-timeline")).to_contain_text("Pending")
    expect(page.locator("#job-timeline")).to_contain_text("Running")
    expect(page.locator("#command-expanded")).to_contain_text("mpirun -np 4 ")
    expect(page.locator("#tune-file tr", has_text="-x CRED_TOKEN").locator("td").nth(1)).to_have_text(MASK)
    expect(page.locator("#job-workers tbody tr")).to_have_count(2)
    assert SECRET not in page.content()

    page.click("#tab-logs")
    system_lines = log_view.locator(".log-system")
    assert system_lines.count() > 0
    expect(system_lines.first).to_contain_text("[ModelArts Service Log]")
    page.uncheck("[data-log-system]")
    expect(system_lines).to_have_count(0)
    expect(log_view).to_contain_text("SEQ 0 0")
    page.select_option("[data-log-rank]", "3")
    expect(log_view.locator(".log-line")).to_have_count(4)  # its PROBE line and SEQ 3 0..2
    assert set(log_view.locator(".log-line").evaluate_all("rows => rows.map(row => row.dataset.rank)")) == {"3"}
    page.select_option("[data-log-rank]", "")
    page.select_option("[data-log-worker]", "1")
    expect(log_view).to_contain_text("SEQ 2 2")
    assert set(log_view.locator(".log-line").evaluate_all("rows => rows.map(row => row.dataset.worker)")) == {"1"}
    assert "SEQ 0 " not in log_view.inner_text(), "worker-0's ranks are not in worker-1's log"
    page.select_option("[data-log-worker]", "")
    page.check("[data-log-system]")
    expect(system_lines.first).to_be_visible()
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=screenshots / "job-completed.png", full_page=True)

    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and job.exit_code == 0
    assert job.parameters == [{"name": "data_url", "value": "/cache/data"}, {"name": "count", "value": "3"},
                              {"name": "show_env", "value": "MA_NUM_HOSTS"}]
    assert job.env == {"CRED_TOKEN": SECRET}


def test_an_invalid_name_and_a_boot_file_outside_the_code_directory_get_their_messages_and_keep_the_rest(
        page, owner, console, tmp_path, screenshots):
    code_dir = code_dir_from_program("probe-invalid", "probe.py")
    log_in(page, "owner")
    page.goto("/jobs/new")
    page.fill("#id_name", "bad name!")
    page.fill("#id_description", "keep me")
    page.select_option("#id_code_dir", value=str(code_dir.pk))
    page.fill("#id_boot_file", "../escape.py")
    add_rows(page, "param", [("lr", "0.01")])
    add_rows(page, "env", [("GREETING", "olá  mundo ")])
    page.fill("#id_node_count", "2")
    page.select_option("#id_auto_stop", "custom")
    page.fill("#id_auto_stop_custom", "10")

    page.click("#submit-job")

    expect(page.locator('[data-errors-for="name"]')).to_have_text("Use 1 to 64 letters, digits, '-' or '_'.")
    expect(page.locator('[data-errors-for="boot_file"]')).to_have_text(
        "Give a path inside the code directory, such as train.py.")
    expect(page.locator("#id_name")).to_have_value("bad name!")
    expect(page.locator("#id_description")).to_have_value("keep me")
    expect(page.locator("#id_boot_file")).to_have_value("../escape.py")
    expect(page.locator("#id_code_dir")).to_have_value(str(code_dir.pk))
    expect(page.locator("#id_node_count")).to_have_value("2")
    expect(page.locator("#id_auto_stop")).to_have_value("custom")
    expect(page.locator("#id_auto_stop_custom")).to_have_value("10")
    assert row_values(page, "param") == [("lr", "0.01")]
    assert row_values(page, "env") == [("GREETING", "olá  mundo ")]
    assert not TrainingJob.objects.exists()
    page.screenshot(path=screenshots / "job-form-refused.png", full_page=True)

    # An archive that would write outside its folder is refused; a sound one is added and picked.
    escaping, sound = tmp_path / "escaping.tar.gz", tmp_path / "sound-code.zip"
    with tarfile.open(escaping, "w:gz") as archive:
        member = tarfile.TarInfo("../evil.py")
        member.size = 0
        archive.addfile(member, io.BytesIO(b""))
    with zipfile.ZipFile(sound, "w") as archive:
        archive.writestr("sound-code/main.py", "print('hi')\n")
    page.click("[data-upload] summary")
    page.set_input_files("#id_upload_archive", str(escaping))
    page.click('button[form="code-dir-upload"]')
    expect(page.locator('[data-upload-errors="archive"]')).to_contain_text("outside the code directory")
    page.fill("#id_upload_name", "")
    page.set_input_files("#id_upload_archive", str(sound))
    expect(page.locator("#id_upload_name")).to_have_value("sound-code")
    page.click('button[form="code-dir-upload"]')
    expect(page.locator("#id_code_dir option:checked")).to_have_text("sound-code")
    expect(page.locator("#boot-files option[value='main.py']")).to_have_count(1)
    expect(page.locator("#id_working_dir")).to_have_value("/home/ma-user/user-job-dir/sound-code")


def test_stop_leaves_a_running_job_terminated_then_rebuild_fills_the_form_and_delete_asks_first(
        page, owner, console, screenshots):
    code_dir_from_program("probe-stop", "probe.py")
    form = TrainingJobForm({"name": "sleeper", "engine": "local-mpi4py", "code_dir": "probe-stop", "boot_file": "probe.py",
                            "spec": "local-cpu", "node_count": 2, "env": {"GREETING": "hi"},
                            "parameters": [{"name": "sleep", "value": "600"}]})
    assert form.is_valid(), form.errors
    job = submit_job(form, owner)
    log_in(page, "owner")

    row = page.locator(f'tr[data-job-id="{job.pk}"]')
    page.evaluate("window.notReloaded = true")
    expect(row.locator("[data-state-badge]")).to_have_text("Running", timeout=JOB_RUN_TIMEOUT_MS)
    assert page.evaluate("window.notReloaded"), "the list updated the state in place"
    expect(row.locator('[data-action="stop"]')).to_be_visible()
    page.screenshot(path=screenshots / "job-list.png", full_page=True)

    row.get_by_role("link", name="sleeper").click()
    page.click("#tab-logs")
    expect(page.locator("[data-log-view]")).to_contain_text("PROBE", timeout=JOB_RUN_TIMEOUT_MS)
    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    page.locator('#job-head [data-action="stop"] button').click()

    expect(page.locator(".messages")).to_contain_text("Stop requested for job sleeper.")
    assert questions and "Stop job sleeper?" in questions[0]
    expect(page.locator("#job-result [data-state-badge]")).to_have_text("Terminated", timeout=60_000)
    expect(page.locator("#job-timeline")).to_contain_text("Stop requested by owner")
    expect(page.locator('#job-head [data-action="stop"]')).to_be_hidden()
    assert wait_for(job, [JobStatus.TERMINATED], timeout=5).status == JobStatus.TERMINATED

    page.locator('#job-head [data-action="rebuild"]').click()
    expect(page.locator("#id_name")).to_have_value("sleeper-copy")
    expect(page.locator("#id_boot_file")).to_have_value("probe.py")
    expect(page.locator("#id_node_count")).to_have_value("2")
    assert row_values(page, "param") == [("sleep", "600")]
    assert row_values(page, "env") == [("GREETING", "hi")]
    expect(page.locator('#command-preview [data-preview="np"]')).to_have_text("4")

    page.go_back()
    dialogs = []
    page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.locator('#job-head [data-action="delete"] button').click()
    assert dialogs and "Delete job sleeper" in dialogs[0]
    assert TrainingJob.objects.filter(pk=job.pk).exists(), "dismissing the question keeps the job"
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('#job-head [data-action="delete"] button').click()
    expect(page.locator(".messages")).to_contain_text("Job sleeper deleted.")
    assert not TrainingJob.objects.filter(pk=job.pk).exists()
