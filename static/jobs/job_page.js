// The job page between polls: a running job's duration counts up, a change of state seen by the poller
// (or by the log's stream) is told to the panels that read the API themselves (metrics, NCCL), and what
// the reader unfolded stays unfolded across a swap.
(function () {
  "use strict";

  const page = document.querySelector("[data-job-page]");
  if (!page) return;
  const states = Console.jobStates();

  function statusShown() {
    const badge = document.querySelector("#job-head [data-state-badge]");
    return badge ? badge.dataset.status : page.dataset.status;
  }

  // A swapped part comes folded as the server renders it: what the reader had opened stays open.
  let opened = [];
  document.addEventListener("htmx:beforeSwap", () => {
    opened = Array.from(document.querySelectorAll("details[id][open]")).map((element) => element.id);
  });

  document.addEventListener("htmx:afterSettle", () => {
    opened.forEach((id) => { const element = document.getElementById(id); if (element) element.open = true; });
    const status = statusShown();
    document.dispatchEvent(new CustomEvent("job:tick", { detail: { status: status } }));
    if (status !== page.dataset.status) {
      const previous = page.dataset.status;
      page.dataset.status = status;
      document.dispatchEvent(new CustomEvent("job:status", { detail: { status: status, previous: previous, from: "page" } }));
    }
  });

  // The log's stream hears of a new state first: the page's parts are asked for at once.
  document.addEventListener("job:status", (event) => {
    if (event.detail && event.detail.from === "page") return;
    if (event.detail && event.detail.status !== page.dataset.status) document.body.dispatchEvent(new Event("job:refresh"));
  });

  setInterval(() => {
    const cell = document.querySelector("#job-result [data-duration]");
    if (!cell || !cell.dataset.started || cell.dataset.ended) return;
    if ((states[page.dataset.status] || {}).final) return;
    cell.textContent = Console.formatDuration((Date.now() - Date.parse(cell.dataset.started)) / 1000);
  }, 1000);
})();
