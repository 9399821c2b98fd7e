// The job page's live log: follows new lines by cursor, per worker and rank, with the platform's own
// lines ("system logs") marked and switchable. Other sources (a server push) can feed appendLines().
(function () {
  "use strict";

  const POLL_INTERVAL_MS = 1000;
  const PAGE_LINES = 1000;
  const MAX_LINES_SHOWN = 5000;

  class LogPane {
    constructor(root) {
      this.root = root;
      this.view = root.querySelector("[data-log-view]");
      this.worker = root.querySelector("[data-log-worker]");
      this.rank = root.querySelector("[data-log-rank]");
      this.system = root.querySelector("[data-log-system]");
      this.follow = root.querySelector("[data-log-follow]");
      this.search = root.querySelector("[data-log-search]");
      this.counter = root.querySelector("[data-log-count]");
      this.view.dataset.empty = root.dataset.emptyLabel || "";
      this.download = root.querySelector("[data-log-download]");
      this.downloadBase = this.download ? this.download.getAttribute("href") : "";
      this.status = root.dataset.status;
      this.states = Console.jobStates();
      this.cursor = null;
      this.total = 0;
      this.generation = 0;
      this.timer = null;
      this.searchTimer = null;
      [this.worker, this.rank, this.system].forEach((control) => control.addEventListener("change", () => this.reset()));
      this.search.addEventListener("input", () => {
        clearTimeout(this.searchTimer);
        this.searchTimer = setTimeout(() => this.reset(), 300);
      });
      this.follow.addEventListener("change", () => { if (this.follow.checked) this.scrollToEnd(); });
    }

    get isFinal() {
      return Boolean((this.states[this.status] || {}).final);
    }

    // The filters as the log API reads them; the first read takes the log's tail, later ones follow it.
    query() {
      const params = new URLSearchParams({ limit: String(PAGE_LINES) });
      if (this.cursor === null) params.set("tail", "1");
      else params.set("after", String(this.cursor));
      params.set("system", this.system.checked ? "1" : "0");
      if (this.worker.value !== "") params.set("worker", this.worker.value);
      if (this.rank.value !== "") params.set("rank", this.rank.value);
      if (this.search.value.trim()) params.set("q", this.search.value.trim());
      return params;
    }

    start() {
      this.updateDownload();
      this.schedule(0);
    }

    // The download follows the worker picked, as the reference platform's per-worker log files do.
    updateDownload() {
      if (!this.download) return;
      this.download.href = this.downloadBase + (this.worker.value !== "" ? "?worker=" + this.worker.value : "");
    }

    // Start over from the first line, e.g. after a filter changed.
    reset() {
      this.generation += 1;
      this.cursor = null;
      this.view.replaceChildren();
      this.root.dataset.complete = "false";
      this.updateDownload();
      this.schedule(0);
    }

    schedule(delay) {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.poll(), delay);
    }

    async poll() {
      const generation = this.generation;
      let result;
      try {
        result = await Console.fetchJSON(this.root.dataset.linesUrl + "?" + this.query().toString());
      } catch (error) {
        this.schedule(POLL_INTERVAL_MS * 3);
        return;
      }
      if (generation !== this.generation) return;
      if (!result.ok || !result.body) {
        this.schedule(POLL_INTERVAL_MS * 3);
        return;
      }
      const answer = result.body;
      if (this.cursor === null) this.root.dataset.truncated = answer.previous ? "true" : "false";
      this.appendLines(answer.lines);
      this.cursor = answer.next;
      this.total = answer.total;
      this.setStatus(answer.status);
      this.updateCounter();
      const caughtUp = "more" in answer ? !answer.more : answer.next >= answer.total;
      if (!caughtUp) {
        this.schedule(0);
      } else if (this.isFinal) {
        this.root.dataset.complete = "true";
      } else {
        this.schedule(POLL_INTERVAL_MS);
      }
    }

    setStatus(status) {
      if (!status || status === this.status) return;
      const previous = this.status;
      this.status = status;
      this.root.dataset.status = status;
      document.dispatchEvent(new CustomEvent("job:status", { detail: { status: status, previous: previous } }));
    }

    renderLine(line) {
      const row = document.createElement("div");
      row.className = "log-line log-" + line.stream;
      row.dataset.seq = line.seq;
      if (line.worker !== null) row.dataset.worker = line.worker;
      if (line.rank !== null) row.dataset.rank = line.rank;
      const tags = [];
      if (line.stream === "system") tags.push(this.root.dataset.systemLabel);
      if (line.worker !== null) tags.push("[worker-" + line.worker + "]");
      if (line.rank !== null) tags.push("[rank " + line.rank + "]");
      if (tags.length) {
        const meta = document.createElement("span");
        meta.className = "log-meta";
        meta.textContent = tags.join("");
        row.appendChild(meta);
      }
      const text = document.createElement("span");
      text.className = "log-text";
      text.textContent = line.text;
      row.appendChild(text);
      return row;
    }

    appendLines(lines) {
      if (!lines.length) return;
      const fragment = document.createDocumentFragment();
      lines.forEach((line) => fragment.appendChild(this.renderLine(line)));
      this.view.appendChild(fragment);
      // A huge log keeps only its latest part on the page; the whole one is a link away.
      while (this.view.childElementCount > MAX_LINES_SHOWN) this.view.firstElementChild.remove();
      if (this.follow.checked) this.scrollToEnd();
    }

    scrollToEnd() {
      this.view.scrollTop = this.view.scrollHeight;
    }

    updateCounter() {
      if (!this.counter) return;
      this.counter.textContent = Console.fillTemplate(this.counter.dataset.template, { shown: this.view.childElementCount, total: this.total });
    }
  }

  window.LogPane = LogPane;
  window.logPanes = [];
  document.querySelectorAll("[data-log-pane]").forEach((root) => {
    const pane = new LogPane(root);
    window.logPanes.push(pane);
    pane.start();
  });
})();
