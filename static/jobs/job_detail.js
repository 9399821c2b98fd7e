// The job page stays current without a reload: when the log pane sees the state change, the page's
// live sections (header, result, timeline, command, workers) are fetched again and swapped in place.
(function () {
  "use strict";

  const page = document.querySelector("[data-job-page]");
  if (!page) return;
  const states = Console.jobStates();
  let refreshing = null;

  async function refreshSections() {
    const response = await fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    document.querySelectorAll("[data-live][id]").forEach((section) => {
      const replacement = fresh.getElementById(section.id);
      if (replacement) section.replaceWith(document.importNode(replacement, true));
    });
    const freshPage = fresh.querySelector("[data-job-page]");
    if (freshPage) page.dataset.status = freshPage.dataset.status;
  }

  function refreshSoon() {
    // One refresh at a time; a state change during one is picked up by another right after.
    refreshing = (refreshing || Promise.resolve()).then(refreshSections).catch(() => {});
  }

  document.addEventListener("job:status", refreshSoon);

  // A running job's duration counts up between refreshes.
  setInterval(() => {
    const cell = document.querySelector("#job-result [data-duration]");
    if (!cell || !cell.dataset.started || cell.dataset.ended) return;
    if ((states[page.dataset.status] || {}).final) return;
    cell.textContent = Console.formatDuration((Date.now() - Date.parse(cell.dataset.started)) / 1000);
  }, 1000);
})();
