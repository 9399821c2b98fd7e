// The metrics panel: one small SVG line chart per metric, fed from the API and growing while the job runs.
// Points come in pages after a cursor; a rank's points make one line. The x axis is the step when every
// point of a metric has one, else seconds since the metric's first point.
(function () {
  "use strict";

  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 480, HEIGHT = 180, LEFT = 52, RIGHT = 10, TOP = 10, BOTTOM = 26;
  const POLL_MS = 2000;
  const COLOURS = ["#1f5fd1", "#c62828", "#1b7f3b", "#b26a00", "#6a3fb5", "#0b6aa2", "#8a5a00", "#444"];

  function element(name, attributes, text) {
    const node = document.createElementNS(SVG, name);
    Object.entries(attributes || {}).forEach(([key, value]) => node.setAttribute(key, value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function formatNumber(value) {
    if (value === 0) return "0";
    const size = Math.abs(value);
    return size >= 1e4 || size < 1e-3 ? value.toExponential(2) : String(Number(value.toPrecision(4)));
  }

  function extent(values) {
    let low = Math.min(...values), high = Math.max(...values);
    if (low === high) { low -= Math.abs(low) * 0.1 || 1; high += Math.abs(high) * 0.1 || 1; }
    return [low, high];
  }

  function draw(svg, series, labels) {
    const all = series.flatMap((line) => line.points);
    svg.replaceChildren();
    if (!all.length) return;
    const bySteps = all.every((point) => point.step !== null);
    const start = Math.min(...all.map((point) => point.time));
    const xOf = (point) => (bySteps ? point.step : (point.time - start) / 1000);
    const [xLow, xHigh] = extent(all.map(xOf));
    const [yLow, yHigh] = extent(all.map((point) => point.value));
    const sx = (x) => LEFT + ((x - xLow) / (xHigh - xLow)) * (WIDTH - LEFT - RIGHT);
    const sy = (y) => HEIGHT - BOTTOM - ((y - yLow) / (yHigh - yLow)) * (HEIGHT - TOP - BOTTOM);

    svg.appendChild(element("line", { x1: LEFT, y1: HEIGHT - BOTTOM, x2: WIDTH - RIGHT, y2: HEIGHT - BOTTOM, class: "axis" }));
    svg.appendChild(element("line", { x1: LEFT, y1: TOP, x2: LEFT, y2: HEIGHT - BOTTOM, class: "axis" }));
    [[yHigh, TOP + 4], [yLow, HEIGHT - BOTTOM]].forEach(([value, y]) => {
      svg.appendChild(element("text", { x: LEFT - 4, y: y, "text-anchor": "end", class: "tick" }, formatNumber(value)));
    });
    [[xLow, LEFT, "start"], [xHigh, WIDTH - RIGHT, "end"]].forEach(([value, x, anchor]) => {
      svg.appendChild(element("text", { x: x, y: HEIGHT - 8, "text-anchor": anchor, class: "tick" }, formatNumber(value)));
    });
    svg.appendChild(element("text", { x: (LEFT + WIDTH) / 2, y: HEIGHT - 8, "text-anchor": "middle", class: "tick" },
      bySteps ? labels.step : labels.time));

    series.forEach((line, index) => {
      const colour = COLOURS[index % COLOURS.length];
      const sorted = line.points.slice().sort((a, b) => xOf(a) - xOf(b));
      const path = sorted.map((point) => `${sx(xOf(point)).toFixed(1)},${sy(point.value).toFixed(1)}`).join(" ");
      svg.appendChild(element("polyline", { points: path, fill: "none", stroke: colour, "stroke-width": 1.5 }));
      if (sorted.length <= 60) {
        sorted.forEach((point) => {
          const dot = element("circle", { cx: sx(xOf(point)), cy: sy(point.value), r: 2.2, fill: colour });
          dot.appendChild(element("title", {}, `${labels.rank} ${line.rank}: ${bySteps ? labels.step + " " + point.step : ""} ${formatNumber(point.value)}`));
          svg.appendChild(dot);
        });
      }
    });
  }

  function setUp(panel) {
    const url = panel.dataset.metricsUrl;
    const container = panel.querySelector("[data-metric-charts]");
    const labels = { step: panel.dataset.labelStep, time: panel.dataset.labelTime, rank: panel.dataset.labelRank,
                     last: panel.dataset.labelLast };
    const charts = new Map();  // name -> {figure, svg, note, last, lines: Map(rank -> {rank, points})}
    let after = 0;

    function chartFor(metric) {
      if (charts.has(metric.name)) return charts.get(metric.name);
      const figure = document.createElement("figure");
      figure.className = "metric-chart";
      figure.dataset.metric = metric.name;
      const caption = document.createElement("figcaption");
      const title = document.createElement("strong");
      title.textContent = metric.name;
      const regex = document.createElement("code");
      regex.className = "sub";
      regex.textContent = metric.regex;
      const last = document.createElement("span");
      last.className = "metric-last";
      caption.append(title, " ", regex, " ", last);
      const svg = element("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "metric-svg", role: "img", "aria-label": metric.name });
      const note = document.createElement("p");
      note.className = "hint";
      figure.append(caption, svg, note);
      container.appendChild(figure);
      const chart = { figure, svg, note, last, lines: new Map() };
      charts.set(metric.name, chart);
      return chart;
    }

    async function poll() {
      let body;
      try {
        const response = await fetch(`${url}?after=${after}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) return setTimeout(poll, POLL_MS * 2);
        body = await response.json();
      } catch (error) {
        return setTimeout(poll, POLL_MS * 2);
      }
      if (!body.metrics.length && !container.children.length) {
        container.textContent = panel.dataset.labelNone;
      }
      body.metrics.forEach((metric) => {
        const chart = chartFor(metric);
        chart.note.textContent = metric.note;
        chart.last.textContent = metric.last ? `${labels.last}: ${formatNumber(metric.last.value)}` : "";
      });
      const touched = new Set();
      body.points.forEach((point) => {
        const chart = charts.get(point.name);
        if (!chart) return;
        const key = point.rank === null ? -1 : point.rank;
        if (!chart.lines.has(key)) chart.lines.set(key, { rank: point.rank, points: [] });
        chart.lines.get(key).points.push({ step: point.step, value: point.value, time: Date.parse(point.at) });
        touched.add(point.name);
      });
      touched.forEach((name) => {
        const chart = charts.get(name);
        draw(chart.svg, [...chart.lines.values()], labels);
      });
      after = body.next;
      // A finished job's points are all there once a page comes back short.
      if (body.more) return poll();
      if (!body.final) setTimeout(poll, POLL_MS);
    }

    poll();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-metrics-panel]").forEach(setUp);
  });
})();
