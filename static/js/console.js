// Behaviour every page shares: CSRF for scripted requests, copy buttons, confirmations, auto-submitting filters.
(function () {
  "use strict";

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  }

  // A chart's number: six significant digits, or an exponent for the very large and the very small.
  function formatNumber(value) {
    if (value === null || value === undefined) return "–";
    if (value === 0) return "0";
    const size = Math.abs(value);
    return size >= 1e5 || size < 1e-3 ? value.toExponential(3) : String(Number(value.toPrecision(6)));
  }

  async function fetchJSON(url, options) {
    const settings = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
    settings.headers = Object.assign({ Accept: "application/json" }, settings.headers);
    if (settings.method && settings.method.toUpperCase() !== "GET") {
      settings.headers["X-CSRFToken"] = csrfToken();
    }
    const response = await fetch(url, settings);
    let body = null;
    try {
      body = await response.json();
    } catch (error) {
      body = null;
    }
    return { ok: response.ok, status: response.status, body: body };
  }

  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined || isNaN(seconds)) return "–";
    const total = Math.max(Math.floor(seconds), 0);
    const hours = Math.floor(total / 3600);
    const minutes = Math.floor((total % 3600) / 60);
    const secs = total % 60;
    return hours + ":" + String(minutes).padStart(2, "0") + ":" + String(secs).padStart(2, "0");
  }

  function jobStates() {
    const data = document.getElementById("job-states");
    return data ? JSON.parse(data.textContent) : {};
  }

  function setBadge(badge, status, states) {
    const meta = states[status] || { label: status, badge: "muted" };
    badge.className = "badge badge-" + meta.badge;
    badge.dataset.status = status;
    badge.textContent = meta.label;
    // A "silent 12 min" hint is the server's, for the state it rendered (see _state_badge.html): not this one's.
    delete badge.dataset.hung;
    badge.removeAttribute("title");
  }

  function showActionsFor(container, status, states) {
    const meta = states[status] || {};
    container.querySelectorAll('[data-action="stop"]').forEach((form) => { form.hidden = !meta.stoppable; });
    container.querySelectorAll('[data-action="delete"]').forEach((form) => { form.hidden = !meta.final; });
  }

  function fillTemplate(template, values) {
    return template.replace(/\{(\w+)\}/g, (whole, key) => (key in values ? values[key] : whole));
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const text = source.textContent;
    const done = () => {
      button.classList.add("copied");
      setTimeout(() => button.classList.remove("copied"), 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => {});
    } else {
      // Plain-http deployments have no clipboard API; a selected textarea still copies.
      const area = document.createElement("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      try { document.execCommand("copy"); done(); } finally { area.remove(); }
    }
  });

  document.addEventListener("submit", (event) => {
    // The button pressed may ask its own question (the list's bulk buttons), else the form does.
    const form = event.target;
    const asker = event.submitter && event.submitter.dataset.confirm ? event.submitter : form;
    if (asker.dataset && asker.dataset.confirm && !window.confirm(asker.dataset.confirm)) {
      event.preventDefault();
    }
  });

  document.addEventListener("change", (event) => {
    if (event.target.matches("[data-autosubmit]")) event.target.form.requestSubmit();
  });

  // Every time on the pages in one format, in the browser's time zone: the server writes ISO 8601 in
  // <time datetime>, and this writes it as 2026-05-04 13:02:07 (the zone's name in the tooltip).
  const pad = (number) => String(number).padStart(2, "0");
  function formatTime(value) {
    const moment = value instanceof Date ? value : new Date(value);
    if (isNaN(moment.getTime())) return null;
    return moment.getFullYear() + "-" + pad(moment.getMonth() + 1) + "-" + pad(moment.getDate()) + " "
      + pad(moment.getHours()) + ":" + pad(moment.getMinutes()) + ":" + pad(moment.getSeconds());
  }
  const zone = (Intl.DateTimeFormat().resolvedOptions().timeZone || "");
  function formatTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach((element) => {
      const text = formatTime(element.getAttribute("datetime"));
      if (text === null) return;
      element.textContent = text;
      element.title = zone ? text + " (" + zone + ")" : text;
    });
  }
  document.addEventListener("DOMContentLoaded", () => formatTimes(document));
  document.addEventListener("htmx:load", (event) => formatTimes(event.target));

  // Pollers (htmx elements marked data-poll) ask every few seconds while the tab is seen; while it is
  // hidden only one tick in POLL_HIDDEN_EVERY goes out, and showing the tab asks at once.
  const POLL_HIDDEN_EVERY = 10;
  let hiddenTicks = 0;
  document.addEventListener("htmx:beforeRequest", (event) => {
    if (!event.target.matches || !event.target.matches("[data-poll]") || !document.hidden) return;
    hiddenTicks += 1;
    if (hiddenTicks % POLL_HIDDEN_EVERY !== 0) event.preventDefault();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && document.querySelector("[data-poll]")) {
      hiddenTicks = 0;
      document.body.dispatchEvent(new Event("job:refresh"));
    }
  });

  window.Console = { csrfToken, fetchJSON, formatNumber, formatDuration, formatTime, formatTimes, jobStates, setBadge, showActionsFor, fillTemplate };
})();
