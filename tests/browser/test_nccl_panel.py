"""The NCCL panel of the job page in a real Chromium: facts, the picture of ranks on nodes, the diagnosis."""

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from jobs.logs.store import LogRecord
from jobs.models import JobStatus, TrainingJob
from tests.browser.helpers import PASSWORD, log_in
from tests.fixtures import new_job
from tests.unit.log_helpers import quiet_redis, store  # noqa: F401

# Horovod on two AWS hosts of 4 GPUs each, whose NCCL went over TCP sockets.
SOCKET_LOG = Path(__file__).resolve().parents[1] / "data" / "nccl-logs" / "23-nccl-horovod-aws-2x4gpu-socket-threads-channels.log"


@pytest.mark.usefixtures("transactional_db", "quiet_redis")
def test_the_owner_sees_which_rank_ran_where_and_that_the_promised_infiniband_was_not_used(page, screenshots):
    owner = get_user_model().objects.create_user("nccl-owner", password=PASSWORD)
    job = new_job(owner=owner, name="allreduce", network="ib")
    lines = SOCKET_LOG.read_text(errors="replace").splitlines()
    store(job, [LogRecord(text=line, worker_index=0) for line in lines])
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)

    log_in(page, "nccl-owner")
    page.goto(f"/jobs/{job.pk}#nccl")
    panel = page.locator("#nccl-panel")
    expect(panel.locator('[data-nccl-fact="net"]')).to_contain_text("TCP sockets")
    expect(panel.locator('[data-code="socket-fallback"]')).to_contain_text("InfiniBand")
    # The log names the host of 4 of the 8 ranks; the others are drawn apart, not left out.
    expect(panel.locator("svg .nccl-host")).to_have_count(2)
    expect(panel.locator("svg .nccl-host-unknown .nccl-rank")).to_have_count(4)
    expect(panel.locator("svg .nccl-rank")).to_have_count(8)
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=screenshots / "nccl-panel.png")
