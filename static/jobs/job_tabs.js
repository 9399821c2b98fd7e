// The job page's tabs: the address's hash says which one is shown (#logs, #metrics, ...), so a tab can be
// linked to and the back button goes back to the previous one. A link to something inside a tab opens it.
(function () {
  "use strict";

  const nav = document.querySelector("[data-tabs]");
  if (!nav) return;
  const panels = Array.from(document.querySelectorAll("[data-tab-panel]"));
  const names = panels.map((panel) => panel.dataset.tabPanel);

  function show(name, focusTab) {
    if (!names.includes(name)) name = names[0];
    panels.forEach((panel) => { panel.hidden = panel.dataset.tabPanel !== name; });
    nav.querySelectorAll('[role="tab"]').forEach((tab) => {
      const selected = tab.getAttribute("aria-controls") === "panel-" + name;
      tab.setAttribute("aria-selected", selected ? "true" : "false");
      tab.tabIndex = selected ? 0 : -1;
      if (selected && focusTab) tab.focus();
    });
    document.dispatchEvent(new CustomEvent("tab:shown", { detail: { name: name } }));
  }

  function fromHash() {
    const hash = decodeURIComponent(window.location.hash.slice(1));
    if (!hash) return show(names[0]);
    if (names.includes(hash)) return show(hash);
    const target = document.getElementById(hash);
    const panel = target && target.closest("[data-tab-panel]");
    show(panel ? panel.dataset.tabPanel : names[0]);
    if (target) target.scrollIntoView();
  }

  nav.addEventListener("keydown", (event) => {
    if (event.key !== "ArrowRight" && event.key !== "ArrowLeft") return;
    const current = names.findIndex((name) => !document.querySelector(`[data-tab-panel="${name}"]`).hidden);
    const next = names[(current + (event.key === "ArrowRight" ? 1 : names.length - 1)) % names.length];
    history.replaceState(null, "", "#" + next);
    show(next, true);
  });
  window.addEventListener("hashchange", fromHash);
  window.jobTabs = { show: show };
  fromHash();
})();
