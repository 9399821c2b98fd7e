// The compare page's charts: one uPlot chart per metric, one line per job (and per rank when every rank is
// asked for), overlaid, read once from the comparison API. The x axis is the step when every point of a
// metric has one, else the point's place in its line.
(function () {
  "use strict";

  const HEIGHT = 240;
  const COLOURS = ["#1f5fd1", "#c62828", "#1b7f3b", "#b26a00", "#6a3fb5", "#0b6aa2", "#8a5a00", "#444", "#d81b60", "#00897b"];

  const formatNumber = Console.formatNumber;

  // uPlot wants one x array and a y array per line, aligned; a line without a point at an x gets null.
  function aligned(lines) {
    const bySteps = lines.every((line) => line.points.every((point) => point[0] !== null));
    const xOf = (point, position) => (bySteps ? point[0] : position);
    const xs = new Set();
    lines.forEach((line) => line.points.forEach((point, position) => xs.add(xOf(point, position))));
    const x = Float64Array.from(xs).sort();
    const index = new Map();
    x.forEach((value, position) => index.set(value, position));
    const ys = lines.map((line) => {
      const y = new Array(x.length).fill(null);
      line.points.forEach((point, position) => { y[index.get(xOf(point, position))] = point[1]; });
      return y;
    });
    return { bySteps, data: [Array.from(x), ...ys] };
  }

  function draw(section, list, metric, lines, names) {
    const label = (key) => section.dataset["label" + key] || key;
    const figure = document.createElement("figure");
    figure.className = "metric-chart";
    figure.dataset.metric = metric;
    figure.dataset.series = String(lines.length);
    const caption = document.createElement("figcaption");
    caption.textContent = metric;
    figure.appendChild(caption);
    const plot = document.createElement("div");
    figure.appendChild(plot);
    list.appendChild(figure);
    const { bySteps, data } = aligned(lines);
    const width = Math.max(Math.floor(list.clientWidth - 18), 320);
    new uPlot({
      width: width,
      height: HEIGHT,
      scales: { x: { time: false } },
      axes: [{ label: bySteps ? label("Step") : label("Point") }, { size: 60, values: (u, values) => values.map(formatNumber) }],
      series: [{ label: bySteps ? label("Step") : label("Point"), value: (u, v) => formatNumber(v) }].concat(lines.map((line, position) => ({
        label: "#" + line.job + " " + (names.get(line.job) || "") + (line.rank === null ? "" : " · " + label("Rank") + " " + line.rank),
        stroke: COLOURS[position % COLOURS.length],
        width: 1.5,
        spanGaps: true,
        points: { show: data[0].length <= 60 },
        value: (u, v) => formatNumber(v),
      }))),
    }, data, plot);
  }

  async function load(section) {
    const list = section.querySelector("[data-compare-chart-list]");
    const answer = await Console.fetchJSON(section.dataset.url);
    if (!answer.ok || !answer.body) return;
    const names = new Map(answer.body.runs.map((run) => [run.id, run.name]));
    const byMetric = new Map();
    answer.body.series.forEach((line) => {
      if (!byMetric.has(line.metric)) byMetric.set(line.metric, []);
      byMetric.get(line.metric).push(line);
    });
    if (!byMetric.size) list.textContent = section.dataset.labelNone || "";
    byMetric.forEach((lines, metric) => draw(section, list, metric, lines, names));
    section.dataset.loaded = "true";
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-compare-charts]").forEach((section) => { load(section); });
  });
})();
