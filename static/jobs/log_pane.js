// The job page's live log. The latest lines come first (the lines API's tail); older ones load when the
// reader scrolls to the top; new ones arrive over the log's Server-Sent Events stream, which resumes where
// it stopped after a lost connection or a restarted server. Scrolling up pauses following; scrolling back
// to the end (or ticking Follow) goes on. Each line shows when the console received it.
// A search (a text, a pattern, a level) reads back through the whole log until it has a page of matches
// or reached the start, and never says "no match" for lines it has not looked at; the matches are
// counted, stepped through one by one, and each can be seen among the lines around it
// (static/jobs/log_search.js).
(function () {
  "use strict";

  const PAGE_LINES = 500;
  const MAX_LINES_FOLLOWING = 5000;
  const MAX_LINES_READING = 50000;
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
      this.level = find("level");
      this.regex = find("regex");
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
      [this.worker, this.rank, this.system, this.level, this.regex].forEach((control) => control.addEventListener("change", () => this.reset()));
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
      if (this.query() && this.regex.checked) params.set("regex", "1");
      if (this.level.value) params.set("level", this.level.value);
      return params;
    }

    query() {
      // As typed ("step=17 " must not find step=170); blanks alone are no search.
      return this.search.value.trim() ? this.search.value : "";
    }

    filtered() {
      return Boolean(this.searching() || this.worker.value !== "" || this.rank.value !== "" || !this.system.checked);
    }

    // The filters pick lines by what they say, not only by where they come from: matches to count and step through.
    searching() {
      return Boolean(this.query() || this.level.value);
    }

    start() {
      this.offerWorkerRanks();  // a worker the browser kept chosen over a reload
      this.matches = new LogSearch(this);
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
      this.showNote("");
      this.root.dataset.searching = this.searching() ? "true" : "false";
      this.matches.reset();
      const params = this.filters();
      params.set("tail", "1");
      params.set("limit", String(PAGE_LINES));
      let answer;
      try {
        answer = await this.read(params);
      } catch (error) {
        if (generation !== this.generation) return;
        if (error.refused) this.refuse(error.refused);
        else setTimeout(() => { if (generation === this.generation) this.reset(); }, RECONNECT_MS);
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
      this.matches.count(generation);
      if (this.searching()) this.searchBack(generation);
    }

    async read(params) {
      const result = await Console.fetchJSON(this.root.dataset.linesUrl + "?" + params.toString());
      if (result.status === 400 && result.body) {
        const error = new Error("refused");
        error.refused = result.body;
        throw error;
      }
      if (!result.ok || !result.body) throw new Error("HTTP " + result.status);
      return result.body;
    }

    // The filters were refused (a pattern RE2 cannot run): said under the toolbar, nothing read or followed.
    refuse(errors) {
      const messages = Object.values(errors).flat().join(" ");
      this.search.setAttribute("aria-invalid", "true");
      this.view.dataset.empty = "";
      this.showNote(messages, "refused");
      this.matches.clear();
    }

    // A search goes on reading back until the pane holds a page of matches or the start was reached,
    // saying how far back it has looked; the page is never told "no match" before the start.
    async searchBack(generation) {
      while (generation === this.generation && this.previous && this.view.childElementCount < PAGE_LINES) {
        this.showNote(Console.fillTemplate(this.label("searching"), { from: this.previous.toLocaleString(), to: this.total.toLocaleString() }), "searching");
        if (this.loadingOlder) {
          // A scroll to the top is reading the page before; the search goes on after it.
          await new Promise((resolve) => setTimeout(resolve, FLUSH_MS));
          continue;
        }
        if (!(await this.loadOlder({ quiet: true })) && this.previous) {
          // The read failed (a lost connection): said, and tried again, rather than an empty pane.
          this.showNote(this.label("reconnecting"), "reconnecting");
          await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
        }
      }
      if (generation === this.generation && this.note.dataset.kind === "searching") this.showNote("");
      if (generation === this.generation) this.settle();
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
        this.matches.arrived(line.seq);
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

    // The filter's matches marked, found as the database finds them (case-blind, the text as typed), or
    // as the browser reads the pattern (RE2 and JavaScript agree on the common part; where they do not,
    // the line is shown unmarked).
    highlight(element, text) {
      const spans = this.query() ? this.matches.spans(text) : [];
      let from = 0;
      spans.forEach(([at, end]) => {
        if (at > from) element.append(text.slice(from, at));
        const mark = document.createElement("mark");
        mark.textContent = text.slice(at, end);
        element.append(mark);
        from = end;
      });
      if (from < text.length || !spans.length) element.append(text.slice(from));
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

    async loadOlder(options) {
      if (this.loadingOlder || !this.previous) return false;
      this.loadingOlder = true;
      const quiet = Boolean(options && options.quiet);
      const generation = this.generation;
      if (!quiet) this.showNote(this.label("older"), "older");
      try {
        const params = this.filters();
        params.set("before", String(this.previous));
        params.set("limit", String(PAGE_LINES));
        const answer = await this.read(params);
        if (generation !== this.generation) return false;
        this.prepend(answer.lines);
        this.previous = answer.previous;
        if (!quiet) this.showNote(this.previous ? "" : this.label("start"), this.previous ? "" : "start");
        this.updateCounter();
        return true;
      } catch (error) {
        if (!quiet) this.showNote("");
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

    // "No line matches" only once every line was looked at: reading back reached the start.
    settle() {
      if (this.note.dataset.kind === "refused") return;
      this.search.removeAttribute("aria-invalid");
      if (!this.filtered()) this.view.dataset.empty = this.label("empty");
      else this.view.dataset.empty = this.previous ? "" : this.label("noMatch");
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
      const row = this.rowOf(seq);
      this.view.querySelectorAll(".log-first-error").forEach((element) => element.classList.remove("log-first-error"));
      if (!row) {
        // Not among the lines on the page: shown among the lines around it, in a box of its own, while the
        // pane goes on as it was (following or not).
        this.matches.showContext(seq, "log-first-error");
        return;
      }
      row.classList.add("log-first-error");
      this.follow.checked = false;
      this.showNote(this.label("paused"), "paused");
      this.reveal(row);
    }

    // A row brought into the middle of the view, without the scroll pausing or resuming Follow by itself.
    reveal(row) {
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
