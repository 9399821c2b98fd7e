// The metrics panel: one uPlot chart per metric, a line per rank, fed from the API and growing on the
// page's poll while the job runs. Long series come downsampled by the server on the first read (first,
// last, and each bucket's lowest and highest point), then only new points. The headline above a chart is
// its rank-0 line's last point (the rank whose value the job list shows), so the two always agree.
// The x axis is the step when every point of a metric has one, else seconds since its first point.
(function () {
  "use strict";

  const FIRST_READ_POINTS = 2000;
  const HEIGHT = 220;
  const COLOURS = ["#1f5fd1", "#c62828", "#1b7f3b", "#b26a00", "#6a3fb5", "#0b6aa2", "#8a5a00", "#444"];

  const formatNumber = Console.formatNumber;

  // "val_loss" reads "Val loss"; the name as the job defines it stays beside it.
  function readable(name) {
    const words = name.replace(/[_.:/-]+/g, " ").trim();
    return words.charAt(0).toUpperCase() + words.slice(1);
  }

  function csvCell(value) {
    const text = value === null || value === undefined ? "" : String(value);
    return /[",\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
  }

  function setUp(panel) {
    const container = panel.querySelector("[data-metric-charts]");
    const rankSelect = panel.querySelector("[data-metric-rank]");
    const label = (name) => panel.dataset["label" + name] || name;
    const charts = new Map();  // name -> chart state
    let after = 0, first = true, final = false, loading = false, ranksSeen = new Set();

    function chartFor(metric) {
      if (charts.has(metric.name)) return charts.get(metric.name);
      const figure = document.createElement("figure");
      figure.className = "metric-chart";
      figure.dataset.metric = metric.name;
      const caption = document.createElement("figcaption");
      const title = document.createElement("strong");
      title.textContent = readable(metric.name);
      const code = document.createElement("code");
      code.className = "sub";
      code.textContent = metric.name;
      code.title = metric.regex;
      const headline = document.createElement("span");
      headline.className = "metric-last";
      headline.dataset.metricLast = "";
      const csv = document.createElement("button");
      csv.type = "button";
      csv.className = "button small";
      csv.textContent = label("Csv");
      caption.append(title, " ", code, " ", headline);
      const plot = document.createElement("div");
      plot.className = "metric-plot";
      const note = document.createElement("p");
      note.className = "hint";
      const foot = document.createElement("div");
      foot.className = "metric-foot";
      foot.append(note, csv);
      figure.append(caption, plot, foot);
      container.appendChild(figure);
      const chart = { name: metric.name, figure, plot, note, headline, lines: new Map(), uplot: null, ranks: [] };
      csv.addEventListener("click", () => exportCsv(chart));
      charts.set(metric.name, chart);
      return chart;
    }

    function exportCsv(chart) {
      const rows = [["metric", "rank", "step", "time", "value"].join(",")];
      chart.lines.forEach((line) => line.points.forEach((point) => {
        rows.push([chart.name, line.rank, point.step, new Date(point.time).toISOString(), point.value].map(csvCell).join(","));
      }));
      const link = document.createElement("a");
      link.href = URL.createObjectURL(new Blob([rows.join("\n") + "\n"], { type: "text/csv" }));
      link.download = panel.dataset.jobName + "-" + chart.name + ".csv";
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 1000);
    }

    // uPlot wants one x array and a y array per line, aligned; a rank without a point at an x gets null.
    function aligned(chart) {
      const lines = [...chart.lines.values()].sort((a, b) => (a.rank === null ? -1 : a.rank) - (b.rank === null ? -1 : b.rank));
      let bySteps = true, start = Infinity;
      lines.forEach((line) => line.points.forEach((point) => {
        if (point.step === null) bySteps = false;
        if (point.time < start) start = point.time;
      }));
      const xOf = (point) => (bySteps ? point.step : (point.time - start) / 1000);
      const xs = new Set();
      lines.forEach((line) => line.points.forEach((point) => xs.add(xOf(point))));
      const x = Float64Array.from(xs).sort();
      const index = new Map();
      x.forEach((value, position) => index.set(value, position));
      const ys = lines.map((line) => {
        const y = new Array(x.length).fill(null);
        line.points.forEach((point) => { y[index.get(xOf(point))] = point.value; });
        return y;
      });
      return { lines, bySteps, data: [Array.from(x), ...ys] };
    }

    function rankName(rank) {
      return rank === null ? label("Allranks") : label("Rank") + " " + rank;
    }

    function draw(chart) {
      const { lines, bySteps, data } = aligned(chart);
      const ranks = lines.map((line) => line.rank);
      const width = Math.max(container.clientWidth > 0 ? Math.floor(chart.figure.clientWidth - 18) : 480, 280);
      if (!chart.uplot || ranks.join() !== chart.ranks.join() || chart.bySteps !== bySteps) {
        if (chart.uplot) chart.uplot.destroy();
        chart.ranks = ranks;
        chart.bySteps = bySteps;
        chart.uplot = new uPlot({
          width: width,
          height: HEIGHT,
          scales: { x: { time: false } },
          axes: [{ label: bySteps ? label("Step") : label("Time") }, { size: 60, values: (u, values) => values.map(formatNumber) }],
          series: [{ label: bySteps ? label("Step") : label("Time"), value: (u, v) => formatNumber(v) }].concat(lines.map((line, position) => ({
            label: rankName(line.rank),
            stroke: COLOURS[position % COLOURS.length],
            width: 1.5,
            spanGaps: true,
            points: { show: data[0].length <= 60 },
            value: (u, v) => formatNumber(v),
          }))),
        }, data, chart.plot);
        applyRank(chart);
      } else {
        chart.uplot.setData(data);
      }
      chart.figure.dataset.points = String(data[0].length);
      showHeadline(chart, lines, data);
    }

    // The rank the headline speaks for: rank 0 (or the line without a rank), else the lowest rank.
    function showHeadline(chart, lines, data) {
      const position = lines.findIndex((line) => line.rank === 0 || line.rank === null);
      const line = position >= 0 ? position : 0;
      const y = data[line + 1];
      let last = y.length - 1;
      while (last >= 0 && y[last] === null) last -= 1;
      if (last < 0) return;
      const rank = lines[line].rank;
      chart.headline.textContent = label("Last") + ": " + formatNumber(y[last]) + " · "
        + (chart.bySteps ? label("Step") + " " + data[0][last] + " · " : "") + rankName(rank);
      chart.headline.dataset.value = String(y[last]);
      chart.headline.dataset.rank = rank === null ? "" : String(rank);
      chart.headline.dataset.step = chart.bySteps ? String(data[0][last]) : "";
    }

    function applyRank(chart) {
      if (!chart.uplot || !rankSelect) return;
      const wanted = rankSelect.value;
      chart.ranks.forEach((rank, position) => {
        chart.uplot.setSeries(position + 1, { show: wanted === "" || String(rank) === wanted });
      });
    }

    function updateRankChoices() {
      if (!rankSelect) return;
      [...ranksSeen].filter((rank) => rank !== null).sort((a, b) => a - b).forEach((rank) => {
        if (!rankSelect.querySelector('option[value="' + rank + '"]')) {
          const option = document.createElement("option");
          option.value = String(rank);
          option.textContent = rankName(rank);
          rankSelect.appendChild(option);
        }
      });
      rankSelect.closest("label").hidden = rankSelect.options.length <= 2;
    }

    async function load() {
      if (loading) return;
      loading = true;
      try {
        let more = true;
        while (more) {
          const query = first ? "?after=0&max_points=" + FIRST_READ_POINTS : "?after=" + after;
          const answer = await Console.fetchJSON(panel.dataset.metricsUrl + query);
          if (!answer.ok || !answer.body) return;
          const body = answer.body;
          first = false;
          if (!body.metrics.length && !container.children.length) container.textContent = label("None");
          body.metrics.forEach((metric) => {
            const chart = chartFor(metric);
            // The API's note in English; the page's own words for it.
            const note = metric.matched ? "" : label(body.final ? "Nomatch" : "Nomatchyet");
            chart.note.textContent = note + (metric.downsampled ? (note ? " " : "") + label("Downsampled") : "");
          });
          const touched = new Set();
          body.points.forEach((point) => {
            const chart = charts.get(point.name);
            if (!chart) return;
            const key = point.rank === null ? -1 : point.rank;
            if (!chart.lines.has(key)) chart.lines.set(key, { rank: point.rank, points: [] });
            chart.lines.get(key).points.push({ step: point.step, value: point.value, time: Date.parse(point.at) });
            ranksSeen.add(point.rank);
            touched.add(point.name);
          });
          touched.forEach((name) => draw(charts.get(name)));
          updateRankChoices();
          after = body.next;
          more = body.more;
          final = body.final;
        }
      } catch (error) {
        // The next poll of the page tries again.
      } finally {
        loading = false;
      }
    }

    if (rankSelect) rankSelect.addEventListener("change", () => charts.forEach(applyRank));
    document.addEventListener("job:tick", () => { if (!final) load(); });
    document.addEventListener("job:status", () => load());
    document.addEventListener("tab:shown", (event) => {
      if (event.detail.name !== "metrics") return;
      charts.forEach((chart) => { if (chart.uplot) chart.uplot.setSize({ width: Math.max(chart.figure.clientWidth - 18, 280), height: HEIGHT }); });
    });
    load();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-metrics-panel]").forEach(setUp);
  });
})();
