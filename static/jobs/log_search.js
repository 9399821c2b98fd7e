// The log pane's search (static/jobs/log_pane.js holds the pane): how many lines of the whole log match,
// counted by the server a second at a time; stepping from match to match, older pages loaded as needed;
// and one line (a match clicked, or the first error) seen among the lines around it, in a box of its own,
// with the way back to the end of the log.
(function () {
  "use strict";

  const CONTEXT_LINES = 20;

  class LogSearch {
    constructor(pane) {
      this.pane = pane;
      const find = (name) => pane.root.querySelector("[data-log-" + name + "]");
      this.counter = find("match-count");
      this.previousButton = find("match-previous");
      this.nextButton = find("match-next");
      this.context = find("context");
      this.contextTitle = find("context-title");
      this.contextLines = find("context-lines");
      this.clear();
      this.previousButton.addEventListener("click", () => this.step(-1));
      this.nextButton.addEventListener("click", () => this.step(1));
      pane.search.addEventListener("keydown", (event) => {
        if (event.key !== "Enter" || !pane.searching()) return;
        event.preventDefault();
        this.step(event.shiftKey ? 1 : -1);
      });
      find("context-close").addEventListener("click", () => this.closeContext());
      // A match clicked (not a text selected) is shown among the lines around it.
      pane.view.addEventListener("click", (event) => {
        if (!pane.searching() || String(window.getSelection() || "")) return;
        const row = event.target.closest(".log-line");
        if (row) this.showContext(Number(row.dataset.seq), "log-current");
      });
    }

    label(name) {
      return this.pane.label(name);
    }

    clear() {
      this.total = null;  // the matches counted; null until the count is complete
      this.counted = 0;
      this.through = null;
      this.arrivals = [];  // lines that arrived live while the count ran
      this.counting = false;
      this.current = null;
      this.counter.textContent = "";
      this.previousButton.hidden = true;
      this.nextButton.hidden = true;
    }

    // New filters: nothing counted or chosen yet.
    reset() {
      this.clear();
      const searching = this.pane.searching();
      this.previousButton.hidden = !searching;
      this.nextButton.hidden = !searching;
    }

    // Counted in steps: each answer says up to where it counted, and the next step goes on from there.
    async count(generation) {
      if (!this.pane.searching()) return;
      let after = 0;
      this.counting = true;
      for (;;) {
        const params = this.pane.filters();
        params.set("after", String(after));
        if (this.through !== null) params.set("through", String(this.through));
        let result = null;
        try {
          result = await Console.fetchJSON(this.pane.root.dataset.matchesUrl + "?" + params.toString());
        } catch (error) {
          result = null;  // the connection was lost: no count is shown rather than a wrong one
        }
        if (generation !== this.pane.generation) return;
        if (!result || !result.ok || !result.body) {
          this.counter.textContent = "";
          this.counting = false;
          this.arrivals = [];
          return;
        }
        this.counted += result.body.count;
        this.through = result.body.through;
        if (result.body.next === null) break;
        after = result.body.next;
        this.counter.textContent = Console.fillTemplate(this.label("counting"), { count: this.counted.toLocaleString() });
      }
      const through = this.through;
      this.total = this.counted + this.arrivals.filter((seq) => seq > through).length;
      this.arrivals = [];
      this.showCount();
    }

    // A line the live stream brought: with a search on, every one is a match.
    arrived(seq) {
      if (!this.pane.searching()) return;
      if (this.total === null) {
        if (this.counting) this.arrivals.push(seq);
      }
      else if (seq > this.through) {
        this.total += 1;
        if (!this.current) this.showCount();
      }
    }

    showCount() {
      this.counter.textContent = Console.fillTemplate(this.label("count"), { count: this.total.toLocaleString() });
    }

    // The previous (older, -1) or next (newer, +1) match from the one chosen; the first step up starts
    // from the newest. Older pages are read as the step needs them.
    async step(direction) {
      const pane = this.pane;
      const generation = pane.generation;
      const from = this.current && this.current.isConnected ? this.current : null;
      const neighbour = () => (from ? (direction < 0 ? from.previousElementSibling : from.nextElementSibling)
        : (direction < 0 ? pane.view.lastElementChild : null));
      while (!neighbour() && direction < 0 && pane.previous) {
        if (!(await pane.loadOlder({ quiet: true })) || generation !== pane.generation) return;
      }
      const row = neighbour();
      if (!row) {
        pane.showNote(this.label("noMore"), "no-more");
        return;
      }
      if (from) from.classList.remove("log-current");
      row.classList.add("log-current");
      this.current = row;
      pane.follow.checked = false;
      pane.showNote("");
      pane.reveal(row);
      if (this.total !== null) {
        const newer = pane.view.childElementCount - 1 - Array.prototype.indexOf.call(pane.view.children, row);
        this.counter.textContent = Console.fillTemplate(this.label("position"), {
          index: Math.max(this.total - newer, 1).toLocaleString(), count: this.total.toLocaleString() });
      }
    }

    // Where the filter's text is in a line, case-blind as the database finds it. A pattern's matches are not
    // marked: the browser's regular expressions backtrack, and a pattern RE2 runs in linear time on the
    // server could hold the tab for minutes here.
    spans(text) {
      const spans = [];
      if (this.pane.regex.checked) return spans;
      const lower = text.toLowerCase(), needle = this.pane.query().toLowerCase();
      for (let at = lower.indexOf(needle); at !== -1; at = lower.indexOf(needle, at + needle.length)) {
        spans.push([at, at + needle.length]);
      }
      return spans;
    }

    // The line numbered `seq` among the lines around it, every line (no filter), the line itself marked.
    async showContext(seq, className) {
      const params = new URLSearchParams();
      params.set("after", String(Math.max(seq - CONTEXT_LINES - 1, 0)));
      params.set("limit", String(2 * CONTEXT_LINES + 1));
      let result = null;
      try {
        result = await Console.fetchJSON(this.pane.root.dataset.linesUrl + "?" + params.toString());
      } catch (error) {
        return;  // the connection was lost: the box stays as it was
      }
      if (!result.ok || !result.body) return;
      const rows = result.body.lines.map((line) => {
        const row = this.pane.renderLine(line);
        if (line.seq === seq) row.classList.add(className);
        return row;
      });
      this.contextLines.replaceChildren(...rows);
      this.contextTitle.textContent = Console.fillTemplate(this.label("context"), {
        seq: seq.toLocaleString(), total: Math.max(result.body.total, this.pane.total).toLocaleString() });
      this.context.hidden = false;
      const target = this.contextLines.querySelector("." + className);
      if (target) this.contextLines.scrollTop = target.offsetTop - this.contextLines.offsetTop - this.contextLines.clientHeight / 2;
    }

    closeContext() {
      this.context.hidden = true;
      this.contextLines.replaceChildren();
      this.pane.follow.checked = true;
      this.pane.showNote("");
      this.pane.scrollToEnd();
    }
  }

  window.LogSearch = LogSearch;
})();
