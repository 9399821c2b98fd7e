// The results panel: while the job runs, a change in the watchdog's suspicion (or the job's end)
// brings a fresh copy of the panel from the page, so "suspected hung" shows without a reload.
(function () {
  "use strict";

  const POLL_MS = 3000;

  function signature(outcome) {
    const hung = outcome.suspected_hung;
    return [outcome.status, hung ? hung.since : "", hung ? hung.ranks.map((item) => item.rank).join(",") : "",
            outcome.failure ? outcome.failure.kind : "", outcome.cleanup ? outcome.cleanup.checked_at : ""].join("|");
  }

  async function refreshPanel() {
    const response = await fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html").getElementById("job-results");
    const current = document.getElementById("job-results");
    if (fresh && current) current.replaceWith(document.importNode(fresh, true));
  }

  function watch() {
    const panel = document.getElementById("job-results");
    if (!panel || panel.dataset.final === "1") return;
    let seen = null;
    async function poll() {
      const now = document.getElementById("job-results");
      if (!now) return;
      try {
        const response = await fetch(now.dataset.outcomeUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (response.ok) {
          const outcome = await response.json();
          const current = signature(outcome);
          if (seen !== null && current !== seen) await refreshPanel();
          seen = current;
          if (document.getElementById("job-results").dataset.final === "1") return;
        }
      } catch (error) {
        // A missed poll is retried on the next one.
      }
      setTimeout(poll, POLL_MS);
    }
    poll();
  }

  document.addEventListener("DOMContentLoaded", watch);
})();
