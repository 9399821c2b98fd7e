// The job page's terminal: a shell in a worker's container through the API's shell routes. What is typed goes
// out in order, one request at a time (keys typed meanwhile go together in the next); the output comes as
// Server-Sent Events, which the browser resumes by itself after a lost connection.
(function () {
  "use strict";

  // What one request may carry (jobs.shell_channel.INPUT_CHUNK_MAX_CHARS).
  const CHUNK_CHARS = 16 * 1024;
  const card = document.querySelector("[data-terminal]");
  if (!card || !window.Terminal || !window.Console) return;
  const jobId = card.dataset.jobId;
  const form = card.querySelector("[data-terminal-form]");
  const openButton = card.querySelector("[data-terminal-open]");
  const closeButton = card.querySelector("[data-terminal-close]");
  const statusLine = card.querySelector("[data-terminal-status]");
  const screen = card.querySelector("[data-terminal-screen]");
  let session = null;

  function say(text) { statusLine.textContent = text; }

  function errorText(body, status) {
    if (body && typeof body === "object") {
      const first = Object.values(body)[0];
      return Array.isArray(first) ? first.join(" ") : String(first);
    }
    return `HTTP ${status}`;
  }

  function post(url, body) {
    return window.Console.fetchJSON(url, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
  }

  class Session {
    constructor(opened, worker) {
      this.inputUrl = opened.input_url;
      this.worker = worker;
      this.pending = "";
      this.sending = false;
      this.ended = false;
      this.terminal = new window.Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000 });
      this.fit = window.FitAddon ? new window.FitAddon.FitAddon() : null;
      if (this.fit) this.terminal.loadAddon(this.fit);
      screen.hidden = false;
      screen.textContent = "";
      this.terminal.open(screen);
      this.resize();
      this.terminal.onData((text) => this.type(text));
      this.terminal.onResize(({ cols, rows }) => this.send({ columns: cols, rows: rows }));
      this.events = new EventSource(opened.output_url);
      this.events.addEventListener("output", (event) => this.terminal.write(JSON.parse(event.data).text));
      this.events.addEventListener("end", (event) => this.end(JSON.parse(event.data).reason));
      this.onWindowResize = () => this.resize();
      window.addEventListener("resize", this.onWindowResize);
      this.terminal.focus();
    }

    resize() {
      if (this.fit && !screen.hidden) {
        try { this.fit.fit(); } catch (error) { /* not laid out yet */ }
      }
    }

    type(text) {
      if (this.ended) return;
      this.pending += text;
      this.flush();
    }

    async flush() {
      if (this.sending || !this.pending || this.ended) return;
      this.sending = true;
      // A paste goes in parts the console takes (INPUT_CHUNK_MAX_CHARS), in order.
      const text = this.pending.slice(0, CHUNK_CHARS);
      this.pending = this.pending.slice(CHUNK_CHARS);
      let answer = null;
      try {
        answer = await post(this.inputUrl, { text: text });
      } catch (error) {
        answer = { ok: false, status: 0, body: { detail: "the console did not answer" } };
      } finally {
        this.sending = false;
      }
      if (answer.status === 429 || answer.status === 0) {
        this.pending = text + this.pending;
        setTimeout(() => this.flush(), 1000);
        if (answer.status === 0) say(errorText(answer.body, answer.status));
        return;
      }
      if (!answer.ok) say(errorText(answer.body, answer.status));
      this.flush();
    }

    async send(body) {
      if (!this.ended) await post(this.inputUrl, body);
    }

    close() {
      this.send({ close: true });
    }

    end(reason) {
      if (this.ended) return;
      this.ended = true;
      this.events.close();
      window.removeEventListener("resize", this.onWindowResize);
      this.terminal.write(`\r\n\x1b[2m[${reason}]\x1b[0m\r\n`);
      say(reason);
      openButton.hidden = false;
      closeButton.hidden = true;
      session = null;
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (session) return;
    const worker = parseInt(card.querySelector("[data-terminal-worker]").value, 10) || 0;
    openButton.disabled = true;
    say("…");
    const answer = await post(`/api/v1/training-jobs/${jobId}/shells`, { worker: worker, columns: 100, rows: 30 });
    openButton.disabled = false;
    if (!answer.ok) {
      say(errorText(answer.body, answer.status));
      return;
    }
    say(`worker-${worker}`);
    openButton.hidden = true;
    closeButton.hidden = false;
    session = new Session(answer.body, worker);
  });

  closeButton.addEventListener("click", () => { if (session) session.close(); });
  document.addEventListener("tab:shown", (event) => {
    if (event.detail.name === "terminal" && session) session.resize();
  });
  // The page going away closes its terminal: a request the browser finishes after the page is gone.
  window.addEventListener("pagehide", () => {
    if (!session || session.ended) return;
    fetch(session.inputUrl, {
      method: "POST", credentials: "same-origin", keepalive: true,
      headers: { "Content-Type": "application/json", "X-CSRFToken": window.Console.csrfToken() },
      body: JSON.stringify({ close: true }),
    });
  });
})();
