// The resources panel: per chart (CPU, memory, and GPU where the job has GPUs) a uPlot line per worker,
// from the API's samples, redrawn on the page's poll while the job runs. The x axis is seconds since
// the job's first sample; memory charts show each worker's limit as a dashed line.
(function () {
  "use strict";

  const HEIGHT = 200;
  const COLOURS = ["#1f5fd1", "#c62828", "#1b7f3b", "#b26a00", "#6a3fb5", "#0b6aa2", "#8a5a00", "#444"];
  const MIB = 1024 * 1024;
  const CHARTS = [
    { key: "Cpu", value: (sample) => sample.cpu_percent },
    { key: "Memory", value: (sample) => sample.memory_bytes / MIB, limit: (sample) => sample.memory_limit_bytes },
    { key: "Gpu", value: (sample) => sample.gpu_percent },
    { key: "Gpumemory", value: (sample) => (sample.gpu_memory_bytes === null ? null : sample.gpu_memory_bytes / MIB) },
  ];

  function setUp(panel) {
    const container = panel.querySelector("[data-resource-charts]");
    const label = (name) => panel.dataset["label" + name] || name;
    const plots = new Map();  // chart key -> {figure, plot, uplot, series}
    const workers = new Map();  // worker index -> {worker, node, samples}, grown by each answer
    let final = false, loading = false, after = 0, lastRead = 0, intervalMs = 0;

    function figureFor(chart) {
      if (plots.has(chart.key)) return plots.get(chart.key);
      const figure = document.createElement("figure");
      figure.className = "metric-chart";
      figure.dataset.resource = chart.key.toLowerCase();
      const caption = document.createElement("figcaption");
      const title = document.createElement("strong");
      title.textContent = label(chart.key);
      caption.append(title);
      const plot = document.createElement("div");
      plot.className = "metric-plot";
      figure.append(caption, plot);
      container.appendChild(figure);
      const entry = { figure, plot, uplot: null, series: "" };
      plots.set(chart.key, entry);
      return entry;
    }

    function draw(chart, workers, start) {
      const lines = [];
      workers.forEach((worker) => {
        const points = worker.samples.map((sample) => [(Date.parse(sample.at) - start) / 1000, chart.value(sample)]);
        if (points.every((point) => point[1] === null)) return;
        lines.push({ name: label("Worker") + "-" + worker.worker + " (" + worker.node + ")", points });
        const limited = chart.limit && worker.samples.length ? chart.limit(worker.samples[worker.samples.length - 1]) : null;
        if (limited) lines.push({ name: label("Worker") + "-" + worker.worker + " " + label("Limit"), dashed: true,
                                  points: points.map((point) => [point[0], limited / MIB]) });
      });
      if (!lines.length) return;
      const xs = [...new Set(lines.flatMap((line) => line.points.map((point) => point[0])))].sort((a, b) => a - b);
      const position = new Map(xs.map((x, index) => [x, index]));
      const data = [xs].concat(lines.map((line) => {
        const y = new Array(xs.length).fill(null);
        line.points.forEach((point) => { y[position.get(point[0])] = point[1]; });
        return y;
      }));
      const entry = figureFor(chart);
      entry.figure.dataset.points = String(xs.length);
      const series = lines.map((line) => line.name).join("|");
      const width = Math.max(entry.figure.clientWidth - 18, 280);
      if (!entry.uplot || entry.series !== series) {
        if (entry.uplot) entry.uplot.destroy();
        entry.series = series;
        let colour = -1;
        entry.uplot = new uPlot({
          width: width, height: HEIGHT, scales: { x: { time: false } },
          axes: [{ label: label("Time") }, { size: 60 }],
          series: [{ label: label("Time") }].concat(lines.map((line) => {
            if (!line.dashed) colour += 1;
            return { label: line.name, stroke: COLOURS[colour % COLOURS.length], width: line.dashed ? 1 : 1.5,
                     dash: line.dashed ? [6, 4] : undefined, spanGaps: true, points: { show: xs.length <= 60 } };
          })),
        }, data, entry.plot);
      } else {
        entry.uplot.setData(data);
      }
    }

    async function load() {
      if (loading) return;
      loading = true;
      try {
        // Only what was sampled since the last answer; the first read has the whole run, downsampled.
        const answer = await Console.fetchJSON(panel.dataset.resourcesUrl + "?after=" + after);
        if (!answer.ok || !answer.body) return;
        final = answer.body.final;
        after = answer.body.next;
        lastRead = Date.now();
        intervalMs = answer.body.interval_seconds * 1000;
        answer.body.workers.forEach((worker) => {
          if (!workers.has(worker.worker)) workers.set(worker.worker, { worker: worker.worker, node: worker.node, samples: [] });
          workers.get(worker.worker).samples.push(...worker.samples);
        });
        const all = [...workers.values()].sort((a, b) => a.worker - b.worker);
        const times = all.flatMap((worker) => worker.samples.map((sample) => Date.parse(sample.at)));
        if (!times.length) {
          if (!container.children.length) container.textContent = label("None");
          return;
        }
        if (container.firstChild && container.firstChild.nodeType === Node.TEXT_NODE) container.textContent = "";
        // A loop, not Math.min(...times): a long job's samples are too many for the call stack.
        const start = times.reduce((a, b) => Math.min(a, b));
        CHARTS.forEach((chart) => draw(chart, all, start));
      } catch (error) {
        // The next poll of the page tries again.
      } finally {
        loading = false;
      }
    }

    // A sample comes every interval_seconds: the page's faster tick asks only when one may be new.
    document.addEventListener("job:tick", () => { if (!final && Date.now() - lastRead >= intervalMs) load(); });
    document.addEventListener("tab:shown", (event) => {
      if (event.detail.name !== "metrics") return;
      plots.forEach((entry) => { if (entry.uplot) entry.uplot.setSize({ width: Math.max(entry.figure.clientWidth - 18, 280), height: HEIGHT }); });
    });
    load();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-resources-panel]").forEach(setUp);
  });
})();
