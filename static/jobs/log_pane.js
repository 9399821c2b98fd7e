// The job page's live log. The latest lines come first (the lines API's tail); older ones load when the
// reader scrolls to the top; new ones arrive over the log's Server-Sent Events stream, which resumes where
// it stopped after a lost connection or a restarted server. Scrolling up pauses following; scrolling back
// to the end (or ticking Follow) goes on. Each line shows when the console received it.
(function () {
  "use strict";

  const PAGE_LINES = 500;
  const MAX_LINES_FOLLOWING = 5000;
  const MAX_LINES_READING = 50000;
  const OLDER_PAGES_FOR_FIRST_ERROR = 10;
  const RECONNECT_MS = 2000;
  const NEAR_EDGE_PX = 24;
  const FLUSH_MS = 100;

  class LogPane {
    constructor(root) {
      this.root = root;
      const find = (name) => root.querySelector("[data-log-" + name + "]");
      this.view = find("view");
      this.worker = find("worker");
      this.rank = find("rank");
      this.system = find("system");
      this.follow = find("follow");
      this.search = find("search");
      this.counter = find("count");
      this.note = find("note");
      this.live = find("live");
      this.firstErrorButton = find("first-error");
      this.download = find("download");
      this.downloadBase = this.download ? this.download.getAttribute("href") : "";
      this.label = (name) => root.dataset[name + "Label"] || "";
      this.status = root.dataset.status;
      this.states = Console.jobStates();
      this.generation = 0;
      this.source = null;
      this.reconnectTimer = null;
      this.searchTimer = null;
      this.loadingOlder = false;
      this.pending = [];
      this.flushTimer = null;
      this.worker.addEventListener("change", () => this.offerWorkerRanks());
      [this.worker, this.rank, this.system].forEach((control) => control.addEventListener("change", () => this.reset()));
      this.search.addEventListener("input", () => {
        clearTimeout(this.searchTimer);
        this.searchTimer = setTimeout(() => this.reset(), 300);
      });
      this.follow.addEventListener("change", () => {
        this.showNote("");
        if (this.follow.checked) this.scrollToEnd();
      });
      this.view.addEventListener("scroll", () => this.onScroll(), { passive: true });
      if (this.firstErrorButton) this.firstErrorButton.addEventListener("click", () => this.firstError());
      document.addEventListener("tab:shown", (event) => { if (event.detail.name === "logs" && this.follow.checked) this.scrollToEnd(); });
    }

    get isFinal() {
      return Boolean((this.states[this.status] || {}).final);
    }

    filters() {
      const params = new URLSearchParams();
      params.set("system", this.system.checked ? "1" : "0");
      if (this.worker.value !== "") params.set("worker", this.worker.value);
      if (this.rank.value !== "") params.set("rank", this.rank.value);
      if (this.query()) params.set("q", this.query());
      return params;
    }

    query() {
      return this.search.value.trim();
    }

    filtered() {
      return Boolean(this.query() || this.worker.value !== "" || this.rank.value !== "" || !this.system.checked);
    }

    start() {
      this.offerWorkerRanks();  // a worker the browser kept chosen over a reload
      this.reset();
    }

    // The Rank list offers the chosen worker's ranks only (each option names its worker); a rank chosen on
    // another worker goes back to All.
    offerWorkerRanks() {
      const worker = this.worker.value;
      Array.from(this.rank.options).forEach((option) => {
        const elsewhere = worker !== "" && option.value !== "" && option.dataset.worker !== worker;
        option.hidden = elsewhere;
        option.disabled = elsewhere;
      });
      if (this.rank.selectedOptions.length && this.rank.selectedOptions[0].disabled) this.rank.value = "";
    }

    // Start over from the latest lines, e.g. after a filter changed.
    async reset() {
      this.generation += 1;
      const generation = this.generation;
      this.closeStream();
      this.cursor = null;
      this.previous = null;
      this.pending = [];
      this.total = 0;
      this.view.replaceChildren();
      this.view.dataset.empty = this.label("empty");
      this.root.dataset.complete = "false";
      this.updateDownload();
      const params = this.filters();
      params.set("tail", "1");
      params.set("limit", String(PAGE_LINES));
      let answer;
      try {
        answer = await this.read(params);
      } catch (error) {
        if (generation === this.generation) setTimeout(() => { if (generation === this.generation) this.reset(); }, RECONNECT_MS);
        return;
      }
      if (generation !== this.generation) return;
      this.previous = answer.previous;
      this.cursor = answer.next;
      this.total = answer.total;
      this.root.dataset.truncated = answer.previous ? "true" : "false";
      this.append(answer.lines);
      this.setStatus(answer.status);
      this.settle();
      this.openStream();
    }

    async read(params) {
      const result = await Console.fetchJSON(this.root.dataset.linesUrl + "?" + params.toString());
      if (!result.ok || !result.body) throw new Error("HTTP " + result.status);
      return result.body;
    }

    // The stream resumes from the cursor: the browser sends the last event's id (Last-Event-ID) when it
    // reconnects by itself; a stream the browser gave up on is opened again from the cursor.
    openStream() {
      if (this.isFinal && this.root.dataset.complete === "true") return;
      const generation = this.generation;
      const params = this.filters();
      params.set("after", String(this.cursor || 0));
      const source = new EventSource(this.root.dataset.eventsUrl + "?" + params.toString());
      this.source = source;
      source.onopen = () => {
        this.live.hidden = false;
        if (this.note.dataset.kind === "reconnecting") this.showNote("");
      };
      source.onmessage = (event) => {
        if (generation !== this.generation) return;
        const line = JSON.parse(event.data);
        this.cursor = Math.max(this.cursor || 0, line.seq);
        this.total = Math.max(this.total, line.seq);
        this.queue(line);
      };
      source.addEventListener("cursor", (event) => {
        this.cursor = Math.max(this.cursor || 0, JSON.parse(event.data).next);
      });
      source.addEventListener("status", (event) => {
        const data = JSON.parse(event.data);
        this.total = Math.max(this.total, data.total || 0);
        this.setStatus(data.status);
        this.settle();
      });
      source.addEventListener("end", (event) => {
        const data = JSON.parse(event.data);
        this.append(this.pending.splice(0));
        this.setStatus(data.status);
        this.closeStream();
        this.root.dataset.complete = "true";
        this.settle();
      });
      source.onerror = () => {
        if (generation !== this.generation) return;
        this.live.hidden = true;
        this.showNote(this.label("reconnecting"), "reconnecting");
        if (source.readyState === EventSource.CLOSED) {
          clearTimeout(this.reconnectTimer);
          this.reconnectTimer = setTimeout(() => { if (generation === this.generation) this.openStream(); }, RECONNECT_MS);
        }
      };
    }

    // A busy log sends thousands of lines a second: they are put on the page together, a few times a second.
    queue(line) {
      this.pending.push(line);
      if (this.flushTimer) return;
      const generation = this.generation;
      this.flushTimer = setTimeout(() => {
        this.flushTimer = null;
        const lines = this.pending;
        this.pending = [];
        if (generation !== this.generation) return;
        this.append(lines);
        this.settle();
      }, FLUSH_MS);
    }

    closeStream() {
      clearTimeout(this.reconnectTimer);
      if (this.source) this.source.close();
      this.source = null;
      if (this.live) this.live.hidden = true;
    }

    setStatus(status) {
      if (!status || status === this.status) return;
      const previous = this.status;
      this.status = status;
      this.root.dataset.status = status;
      document.dispatchEvent(new CustomEvent("job:status", { detail: { status: status, previous: previous, from: "log" } }));
    }

    updateDownload() {
      if (!this.download) return;
      this.download.href = this.downloadBase + (this.worker.value !== "" ? "?worker=" + this.worker.value : "");
    }

    renderLine(line) {
      const row = document.createElement("div");
      row.className = "log-line log-" + line.stream;
      row.dataset.seq = line.seq;
      if (line.worker !== null) row.dataset.worker = line.worker;
      if (line.rank !== null) row.dataset.rank = line.rank;
      if (line.at) {
        const at = document.createElement("time");
        at.className = "log-at";
        at.dateTime = line.at;
        at.textContent = Console.formatTime(line.at) || "";
        row.appendChild(at);
      }
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
      this.highlight(text, line.text);
      row.appendChild(text);
      return row;
    }

    // The filter's matches marked, found as the database finds them (case-blind, the text as typed).
    highlight(element, text) {
      const query = this.query();
      if (!query) {
        element.textContent = text;
        return;
      }
      const lower = text.toLowerCase(), needle = query.toLowerCase();
      let from = 0, at = lower.indexOf(needle);
      while (at !== -1) {
        if (at > from) element.append(text.slice(from, at));
        const mark = document.createElement("mark");
        mark.textContent = text.slice(at, at + needle.length);
        element.append(mark);
        from = at + needle.length;
        at = lower.indexOf(needle, from);
      }
      if (from < text.length) element.append(text.slice(from));
    }

    append(lines) {
      if (!lines.length) return;
      const fragment = document.createDocumentFragment();
      lines.forEach((line) => fragment.appendChild(this.renderLine(line)));
      this.view.appendChild(fragment);
      // A long log keeps only its latest part while followed; older lines come back on scroll-up.
      const cap = this.follow.checked ? MAX_LINES_FOLLOWING : MAX_LINES_READING;
      let trimmed = false;
      while (this.view.childElementCount > cap) {
        this.view.firstElementChild.remove();
        trimmed = true;
      }
      if (trimmed) this.previous = Number(this.view.firstElementChild.dataset.seq);
      if (this.follow.checked) this.scrollToEnd();
    }

    prepend(lines) {
      if (!lines.length) return;
      const before = this.view.scrollHeight;
      const fragment = document.createDocumentFragment();
      lines.forEach((line) => fragment.appendChild(this.renderLine(line)));
      this.view.insertBefore(fragment, this.view.firstChild);
      this.view.scrollTop += this.view.scrollHeight - before;
    }

    async loadOlder() {
      if (this.loadingOlder || !this.previous) return false;
      this.loadingOlder = true;
      const generation = this.generation;
      this.showNote(this.label("older"), "older");
      try {
        const params = this.filters();
        params.set("before", String(this.previous));
        params.set("limit", String(PAGE_LINES));
        const answer = await this.read(params);
        if (generation !== this.generation) return false;
        this.prepend(answer.lines);
        this.previous = answer.previous;
        this.showNote(this.previous ? "" : this.label("start"), this.previous ? "" : "start");
        this.updateCounter();
        return true;
      } catch (error) {
        this.showNote("");
        return false;
      } finally {
        this.loadingOlder = false;
      }
    }

    onScroll() {
      const view = this.view;
      const atEnd = view.scrollHeight - view.scrollTop - view.clientHeight <= NEAR_EDGE_PX;
      if (!atEnd && this.follow.checked && !this.scrollingToEnd) {
        this.follow.checked = false;
        this.showNote(this.label("paused"), "paused");
      } else if (atEnd && !this.follow.checked && this.note.dataset.kind === "paused") {
        this.follow.checked = true;
        this.showNote("");
      }
      if (view.scrollTop <= NEAR_EDGE_PX && this.previous) this.loadOlder();
    }

    scrollToEnd() {
      this.scrollingToEnd = true;
      this.view.scrollTop = this.view.scrollHeight;
      requestAnimationFrame(() => { this.scrollingToEnd = false; });
    }

    showNote(text, kind) {
      if (!this.note) return;
      this.note.textContent = text;
      this.note.dataset.kind = text ? (kind || "") : "";
    }

    settle() {
      this.view.dataset.empty = this.filtered() ? this.label("noMatch") : this.label("empty");
      this.updateCounter();
    }

    updateCounter() {
      if (!this.counter) return;
      this.counter.textContent = Console.fillTemplate(this.counter.dataset.template, { shown: this.view.childElementCount, total: this.total });
    }

    rowOf(seq) {
      return this.view.querySelector('[data-seq="' + seq + '"]');
    }

    // The first line that looks like an error, within the filters: loaded (older pages first) and shown.
    async firstError() {
      const result = await Console.fetchJSON(this.root.dataset.firstErrorUrl + "?" + this.filters().toString());
      if (!result.ok || !result.body) return;
      const seq = result.body.seq;
      if (seq === null || seq === undefined) {
        this.showNote(this.label("noError"), "no-error");
        return;
      }
      this.follow.checked = false;
      this.showNote("");
      for (let page = 0; !this.rowOf(seq) && this.previous && this.previous > seq && page < OLDER_PAGES_FOR_FIRST_ERROR; page++) {
        if (!(await this.loadOlder())) break;
      }
      let row = this.rowOf(seq);
      if (!row && result.body.line) {
        // Too far back to load everything between: the line itself, marked as out of its place.
        row = this.renderLine(result.body.line);
        row.classList.add("log-detached");
        this.view.insertBefore(row, this.view.firstChild);
      }
      this.view.querySelectorAll(".log-first-error").forEach((element) => element.classList.remove("log-first-error"));
      row.classList.add("log-first-error");
      this.scrollingToEnd = true;
      row.scrollIntoView({ block: "center" });
      requestAnimationFrame(() => { this.scrollingToEnd = false; });
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
