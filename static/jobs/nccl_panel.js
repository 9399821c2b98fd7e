// The NCCL panel: what the job's log says NCCL did, a picture of ranks on nodes and devices and the
// links between them, and the diagnosis against the job's spec. Read when its tab is first shown, again on
// the page's poll while it is shown and the job runs, and when the job's state changes; the server reads
// only the log lines that are new.
(function () {
  "use strict";

  const panel = document.querySelector("[data-nccl-panel]");
  if (!panel) return;
  const SVG = "http://www.w3.org/2000/svg";
  const MAX_HOSTS_DRAWN = 8;
  const label = (name) => panel.dataset["label" + name.charAt(0).toUpperCase() + name.slice(1)] || name;
  let loading = false;
  let loaded = false;
  let final = false;

  function element(tag, attributes, text) {
    const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    Object.entries(attributes || {}).forEach(([name, value]) => node.setAttribute(name, value));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function counted(counts) {
    const entries = Object.entries(counts || {});
    return entries.length ? entries.map(([name, count]) => name + " ×" + count).join(", ") : "–";
  }

  function interfaces(list) {
    if (!list || !list.length) return "–";
    return list.map((item) => item.name + (item.address ? " " + item.address : "")).filter((v, i, all) => all.indexOf(v) === i).join(", ");
  }

  function yesNo(value) {
    return value === true ? label("yes") : value === false ? label("no") : label("unknown");
  }

  function setFact(name, text) {
    const cell = panel.querySelector('[data-nccl-fact="' + name + '"]');
    if (cell) cell.textContent = text === null || text === undefined || text === "" ? "–" : text;
  }

  function showFacts(summary) {
    setFact("version", summary.version);
    setFact("ranks", summary.nranks !== null ? summary.nranks : (summary.ranks || []).length || null);
    setFact("hosts", (summary.hosts || []).join(", "));
    setFact("net", summary.net_detail || summary.net);
    setFact("interfaces", interfaces(summary.socket_interfaces) !== "–" ? interfaces(summary.socket_interfaces)
      : (summary.ib_devices || []).map((device) => device.name + ":" + device.port + "/" + (device.link_layer || "?")).join(", "));
    setFact("bootstrap", interfaces(summary.bootstrap_interfaces));
    const plugin = summary.net_plugin || {};
    setFact("plugin", [plugin.name, plugin.state].filter(Boolean).join(" · "));
    setFact("transports", counted(summary.transport_counts));
    const rings = summary.rings || {};
    const trees = summary.trees || {};
    const howMany = (name, count) => (count ? Console.fillTemplate(label(name), { count: count }) : null);
    setFact("topology", [howMany("ringChannels", rings.channel_count), howMany("ringOrders", (rings.orders || []).length),
      howMany("treeChannels", trees.channels)].filter(Boolean).join(", "));
    setFact("init", yesNo(summary.init_complete));
    setFact("warnings", String((summary.warnings || []).length + (summary.warnings_omitted || 0)));
  }

  function showDiagnosis(findings) {
    const list = panel.querySelector("[data-nccl-diagnosis]");
    list.replaceChildren(...findings.map((finding) => {
      const badge = { error: "danger", warning: "warning", info: "info" }[finding.severity] || "muted";
      const item = element("li", { class: "nccl-finding nccl-" + finding.severity, "data-code": finding.code });
      item.append(element("span", { class: "badge badge-" + badge }, label(finding.severity)), " ", element("span", {}, finding.message));
      return item;
    }));
  }

  function showProblems(summary) {
    const problems = (summary.warnings || []).concat(summary.errors || []);
    const box = panel.querySelector("[data-nccl-problems]");
    box.hidden = !problems.length;
    panel.querySelector("[data-nccl-problem-list]").replaceChildren(...problems.map((text) => element("li", {}, text)));
  }

  function hostOrder(summary, workers) {
    const hosts = [...new Set((summary.hosts || []).concat((summary.ranks || []).map((rank) => rank.host).filter(Boolean)))];
    const position = (host) => { const index = workers.indexOf(host); return index === -1 ? workers.length : index; };
    return hosts.sort((a, b) => position(a) - position(b) || a.localeCompare(b));
  }

  function drawPicture(report) {
    const figure = panel.querySelector("[data-nccl-picture]");
    figure.querySelectorAll("svg").forEach((old) => old.remove());
    const summary = report.summary;
    const workers = report.expected.workers || [];
    const hosts = hostOrder(summary, workers).slice(0, MAX_HOSTS_DRAWN);
    if (!hosts.length) return;
    const transports = Object.entries(summary.transport_counts || {});
    const between = transports.filter(([name]) => name.startsWith("NET/") || name === "CollNet");
    const within = transports.filter(([name]) => !(name.startsWith("NET/") || name === "CollNet"));
    const devices = {};
    // Two ranks on one GPU of one host are drawn in red; ranks whose host or device the log does not show are not.
    const device = (rank) => (rank.host && rank.cuda_dev !== null && rank.cuda_dev !== undefined ? rank.host + "/" + rank.cuda_dev : null);
    (summary.ranks || []).forEach((rank) => {
      if (device(rank)) devices[device(rank)] = (devices[device(rank)] || 0) + 1;
    });
    const chip = { w: 64, h: 38, gap: 8 };
    const boxes = hosts.map((host) => ({ host: host, ranks: (summary.ranks || []).filter((rank) => rank.host === host) }));
    const unplaced = (summary.ranks || []).filter((rank) => !rank.host);
    if (unplaced.length) boxes.push({ host: null, ranks: unplaced });
    boxes.forEach((box) => { box.w = Math.max(170, box.ranks.length * (chip.w + chip.gap) + chip.gap); });
    const gap = 120;
    const height = 150;
    const width = boxes.reduce((sum, box) => sum + box.w, 0) + gap * (boxes.length - 1) + 2;
    const svg = element("svg:svg", { viewBox: "0 0 " + width + " " + height, width: "100%", role: "img",
      "aria-label": figure.querySelector("figcaption").textContent });
    let x = 1;
    boxes.forEach((box, index) => {
      const group = element("svg:g", { class: box.host ? "nccl-host" : "nccl-host-unknown", "data-host": box.host || "" });
      group.append(element("svg:rect", { x: x, y: 1, width: box.w, height: height - 2, rx: 8, fill: "#f6f8fa",
        stroke: "#8c959f", "stroke-dasharray": box.host ? "" : "4 3" }));
      const worker = workers.indexOf(box.host);
      group.append(element("svg:text", { x: x + 8, y: 18, "font-size": 12, "font-weight": 600 },
        box.host ? (worker !== -1 ? "worker-" + worker + " · " : "") + box.host : label("unknownHost")));
      box.ranks.forEach((rank, slot) => {
        const shared = device(rank) !== null && devices[device(rank)] > 1;
        const cx = x + chip.gap + slot * (chip.w + chip.gap);
        group.append(element("svg:rect", { x: cx, y: 32, width: chip.w, height: chip.h, rx: 4,
          fill: shared ? "#ffebe9" : "#ddf4ff", stroke: shared ? "#cf222e" : "#0969da", class: "nccl-rank", "data-rank": rank.rank }));
        group.append(element("svg:text", { x: cx + 6, y: 48, "font-size": 11 }, label("rank") + " " + rank.rank));
        group.append(element("svg:text", { x: cx + 6, y: 63, "font-size": 10, fill: "#57606a" },
          rank.cuda_dev !== null && rank.cuda_dev !== undefined ? label("device") + " " + rank.cuda_dev : "–"));
      });
      if (within.length) {
        group.append(element("svg:text", { x: x + 8, y: 95, "font-size": 10, fill: "#57606a" }, label("within") + ":"));
        group.append(element("svg:text", { x: x + 8, y: 110, "font-size": 11 }, counted(Object.fromEntries(within))));
      }
      svg.append(group);
      if (index < boxes.length - 1 && boxes[index + 1].host) {
        const fallback = report.diagnosis.some((finding) => finding.code === "socket-fallback");
        const y = height / 2;
        svg.append(element("svg:line", { x1: x + box.w, y1: y, x2: x + box.w + gap, y2: y, "stroke-width": 3,
          stroke: fallback ? "#cf222e" : "#1a7f37", "stroke-dasharray": fallback ? "6 4" : "" }));
        svg.append(element("svg:text", { x: x + box.w + 6, y: y - 8, "font-size": 10 },
          between.length ? counted(Object.fromEntries(between)) : (summary.net || "?")));
        svg.append(element("svg:text", { x: x + box.w + 6, y: y + 16, "font-size": 10, fill: "#57606a" }, label("between")));
      }
      x += box.w + gap;
    });
    figure.prepend(svg);
  }

  function show(report) {
    const state = panel.querySelector("[data-nccl-state]");
    const body = panel.querySelector("[data-nccl-body]");
    if (!report.seen) {
      state.textContent = report.final ? label("none") : label("noneYet");
      state.hidden = false;
      body.hidden = true;
      return;
    }
    state.hidden = true;
    body.hidden = false;
    showDiagnosis(report.diagnosis);
    showFacts(report.summary);
    showProblems(report.summary);
    drawPicture(report);
    panel.querySelector("[data-nccl-source]").textContent = label("source")
      .replace("{nccl}", report.nccl_lines).replace("{total}", report.log_lines)
      + (report.truncated ? " (" + label("truncated") + ")" : "");
  }

  async function load() {
    if (loading) return;
    loading = true;
    try {
      const answer = await Console.fetchJSON(panel.dataset.ncclUrl);
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      show(answer.body);
      loaded = true;
      final = Boolean(answer.body.final);
    } catch (error) {
      panel.querySelector("[data-nccl-state]").textContent = label("failed");
    } finally {
      loading = false;
    }
  }

  const seen = () => panel.offsetParent !== null;
  document.addEventListener("tab:shown", (event) => { if (event.detail.name === "nccl" && (!loaded || !final)) load(); });
  document.addEventListener("job:tick", () => { if (seen() && !final) load(); });
  document.addEventListener("job:status", () => { if (loaded) load(); });
  if (seen()) load();
})();
