// The job list keeps the state and duration of unfinished jobs current by polling the jobs API.
(function () {
  "use strict";

  const table = document.querySelector("[data-job-table]");
  if (!table) return;
  const POLL_INTERVAL_MS = 2000;
  const states = Console.jobStates();

  function unfinishedRows() {
    return Array.from(table.querySelectorAll("tr[data-job-id]")).filter((row) => !(states[row.dataset.status] || {}).final);
  }

  function showJob(row, job) {
    row.dataset.status = job.status;
    Console.setBadge(row.querySelector("[data-state-badge]"), job.status, states);
    row.querySelector("[data-duration]").textContent = Console.formatDuration(job.duration_seconds);
    Console.showActionsFor(row, job.status, states);
  }

  async function poll() {
    const rows = unfinishedRows();
    await Promise.all(rows.map(async (row) => {
      try {
        const result = await Console.fetchJSON(table.dataset.apiUrl + "/" + row.dataset.jobId);
        if (result.ok && result.body) showJob(row, result.body);
      } catch (error) {
        // The next round tries again.
      }
    }));
    if (unfinishedRows().length) setTimeout(poll, POLL_INTERVAL_MS);
  }

  if (unfinishedRows().length) setTimeout(poll, POLL_INTERVAL_MS);
})();
