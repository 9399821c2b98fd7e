// The job list: htmx swaps the rows while a job on the page is not over (see _job_rows.html); this keeps
// the ticked rows ticked across a swap, counts them for the bulk buttons, and counts running durations up.
(function () {
  "use strict";

  const table = document.querySelector("[data-job-table]");
  if (!table) return;
  const states = Console.jobStates();
  const bulk = document.getElementById("bulk-form");
  const all = table.querySelector("[data-select-all]");
  let ticked = new Set();

  function boxes() {
    return Array.from(table.querySelectorAll("[data-select-job]"));
  }

  function update() {
    ticked = new Set(boxes().filter((box) => box.checked).map((box) => box.value));
    bulk.querySelectorAll("[data-bulk]").forEach((button) => { button.disabled = ticked.size === 0; });
    // Comparing takes 2 to 10 jobs.
    bulk.querySelectorAll("[data-compare]").forEach((button) => { button.disabled = ticked.size < 2 || ticked.size > 10; });
    const count = bulk.querySelector("[data-selected-count]");
    count.textContent = ticked.size ? Console.fillTemplate(count.dataset.template, { count: ticked.size }) : "";
    all.checked = ticked.size > 0 && ticked.size === boxes().length;
  }

  table.addEventListener("change", (event) => {
    if (event.target === all) boxes().forEach((box) => { box.checked = all.checked; });
    update();
  });
  bulk.querySelectorAll("[data-compare]").forEach((button) => {
    button.addEventListener("click", () => {
      window.location.href = button.dataset.compare + "?ids=" + Array.from(ticked).join(",");
    });
  });
  document.addEventListener("htmx:afterSwap", () => {
    boxes().forEach((box) => { box.checked = ticked.has(box.value); });
    update();
  });

  setInterval(() => {
    table.querySelectorAll("tr[data-job-id]").forEach((row) => {
      if (!row.dataset.started || row.dataset.ended || (states[row.dataset.status] || {}).final) return;
      row.querySelector("[data-duration]").textContent = Console.formatDuration((Date.now() - Date.parse(row.dataset.started)) / 1000);
    });
  }, 1000);
  update();
})();
