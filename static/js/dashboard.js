// Live dashboard: polls the JSON endpoints named in #dashboard's data-url-* attributes every
// data-poll-ms milliseconds and redraws the plots (plotly.js, served from our static files) and
// the live cells. Each plot container gets data-points="N" (points drawn) after each update.
// Pages work without it: the server renders the tables; only the plots need JavaScript.
(function () {
  "use strict";
  var root = document.getElementById("dashboard");
  if (!root) return;
  var page = root.dataset.page;
  var pollMs = parseInt(root.dataset.pollMs, 10) || 5000;
  var hasPlotly = typeof window.Plotly !== "undefined";
  var TERMINAL = ["COMPLETED", "FAILED", "CANCELLED"];
  var COLORS = ["#2f5bd3", "#d9822b", "#1d7a46", "#c0352b", "#7b4fc9", "#0f8b8d", "#9a6200",
    "#e0529c", "#4a5365", "#6c9a1f"];

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error(url + ": HTTP " + r.status);
        return r.json();
      });
  }

  function el(id) { return document.getElementById(id); }

  function setText(id, text) {
    var node = el(id);
    if (node && node.textContent !== text) node.textContent = text;
  }

  function fmt(value, digits) {
    return value === null || value === undefined ? "—" : Number(value).toFixed(digits);
  }

  function fmtMb(mb) {
    if (mb === null || mb === undefined) return "—";
    return mb >= 1024 ? (mb / 1024).toFixed(1) + " GB" : Math.round(mb) + " MB";
  }

  function baseLayout(yTitle, extra) {
    var layout = {
      margin: { l: 55, r: 15, t: 30, b: 40 },
      height: 280,
      xaxis: { type: "date" },
      yaxis: { title: { text: yTitle }, rangemode: "tozero" },
      legend: { orientation: "h", y: -0.2 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { size: 12 }
    };
    Object.keys(extra || {}).forEach(function (k) { layout[k] = extra[k]; });
    return layout;
  }

  // The toolbar shows only while the pointer is over a plot (CSS keeps it above the curves).
  var CONFIG = { displaylogo: false, responsive: true, displayModeBar: "hover" };
  // Legends list at most this many series (the highest latest values); the rest are drawn
  // and named on hover, so a legend never outgrows its plot.
  var LEGEND_MAX = 8;

  // Draws traces in the container `id`, or shows its empty state when there is nothing to draw.
  function draw(id, traces, layout) {
    var node = el(id);
    if (!node) return;
    var points = traces.reduce(function (n, t) { return n + (t.z ? t.z.length * t.z[0].length : t.x.length); }, 0);
    var empty = el(id + "-empty");
    if (empty) empty.hidden = points > 0;
    node.hidden = points === 0 && !!empty;
    if (hasPlotly && points > 0) window.Plotly.react(node, traces, layout, CONFIG);
    node.dataset.points = String(points);
  }

  function lineTraces(body, opts) {
    var drawn = body.series.filter(function (s) { return s.points > 0; });
    var last = function (s) { return s.v[s.v.length - 1]; };
    var ranked = drawn.slice().sort(function (a, b) { return last(b) - last(a); });
    var inLegend = {};
    ranked.slice(0, LEGEND_MAX).forEach(function (s) { inLegend[s.label] = true; });
    return drawn.map(function (s, i) {
      var trace = {
        x: s.t, y: s.v, name: s.label, type: "scatter", mode: s.points > 1 ? "lines" : "markers",
        line: { width: 1.8, color: COLORS[i % COLORS.length] }, marker: { color: COLORS[i % COLORS.length] },
        showlegend: !!inLegend[s.label], hovertemplate: "%{fullData.name}: %{y:.2f}<extra></extra>"
      };
      if (!inLegend[s.label]) trace.line.width = 1;
      if (opts && opts[s.metric]) Object.keys(opts[s.metric]).forEach(function (k) { trace[k] = opts[s.metric][k]; });
      return trace;
    });
  }

  // The legend's note: how many series are drawn but left out of it.
  function legendNote(id, traces) {
    var hidden = traces.filter(function (t) { return t.showlegend === false; }).length;
    var node = el(id + "-legend-note");
    if (!node) return;
    node.hidden = hidden === 0;
    node.textContent = hidden ? "Legend: the " + LEGEND_MAX + " highest; " + hidden + " more on hover." : "";
  }

  function withWindow(url) {
    var w = root.dataset.windowS;
    if (!w) return url;
    return url + (url.indexOf("?") >= 0 ? "&" : "?") + "window_s=" + w;
  }

  function jobRefsHtml(refs) {
    if (!refs.length) return '<span class="muted">idle</span>';
    return refs.map(function (r) {
      var state = '<span class="state state-' + r.state.toLowerCase() + '">' + r.state + "</span>";
      var sd = r.slowdown === null ? "" : ' <span class="muted small">SD ' + fmt(r.slowdown, 2) + "</span>";
      var name = r.id === null ? escapeHtml(r.name)
        : '<a href="/jobs/' + r.id + '/">#' + r.id + " " + escapeHtml(r.name) + "</a>";
      return '<span class="job-ref' + (r.id === null ? " job-ref-other" : "") + '">' + name + " " + state + sd + "</span>";
    }).join("");
  }

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  // -- cluster page ------------------------------------------------------------------------------

  function updateOverview(body) {
    setText("stat-queue", String(body.queue_length));
    setText("stat-running", String(body.running_jobs));
    setText("stat-down", String(body.nodes_down.length));
    setText("stat-sd-max-diff", fmt(body.sd_max_diff, 2));
    var box = el("stat-down-box");
    if (box) box.classList.toggle("stat-alert", body.nodes_down.length > 0);
    var banner = el("down-nodes");
    if (banner) banner.hidden = body.nodes_down.length === 0;
    setText("down-nodes-list", body.nodes_down.join(", "));
    body.results.forEach(function (node) {
      var row = document.querySelector('#nodes-table tr[data-node-id="' + node.id + '"]');
      if (row) {
        row.classList.toggle("node-down", node.status === "down");
        var status = row.querySelector(".js-node-status");
        status.className = "status status-node-" + node.status + " js-node-status";
        status.textContent = node.status.charAt(0).toUpperCase() + node.status.slice(1);
        row.querySelector(".js-node-heartbeat").textContent = node.heartbeat_age_s === null
          ? "none yet" : Math.round(node.heartbeat_age_s) + " s ago";
        row.querySelector(".js-node-jobs").textContent = String(node.job_count);
      }
      var cpuJobs = document.querySelector('.js-node-cpu-jobs[data-node-id="' + node.id + '"]');
      if (cpuJobs) cpuJobs.innerHTML = jobRefsHtml(node.cpu_jobs);
      node.gpus.forEach(function (gpu) {
        var tr = document.querySelector('tr[data-gpu-id="' + gpu.id + '"]');
        if (!tr) return;
        tr.querySelector(".js-gpu-util").textContent = gpu.util_pct === null ? "—" : Math.round(gpu.util_pct) + "%";
        tr.querySelector(".js-gpu-mem").textContent = fmtMb(gpu.memory_used_mb);
        tr.querySelector(".js-gpu-jobs").innerHTML = jobRefsHtml(gpu.jobs);
      });
    });
  }

  // "4 minutes", like the server's timesince, for the queue's waiting column.
  function waited(iso) {
    var s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
    if (s < 60) return Math.round(s) + " seconds";
    if (s < 3600) return Math.round(s / 60) + " minutes";
    if (s < 86400) return (s / 3600).toFixed(1) + " hours";
    return (s / 86400).toFixed(1) + " days";
  }

  function updateQueue(body) {
    setText("queue-count", body.count + " pending");
    var rows = el("queue-rows");
    if (!rows) return;
    var staff = el("queue-table").dataset.staff === "1";
    rows.innerHTML = body.results.map(function (r) {
      var job = r.id === null ? '<span class="muted">another user\'s job</span>'
        : '<a href="/jobs/' + r.id + '/">#' + r.id + " " + escapeHtml(r.name) + "</a>";
      return "<tr" + (r.mine ? ' class="mine"' : "") + '><td class="num">' + r.position + "</td><td>" + job + "</td>" +
        (staff ? "<td>" + escapeHtml(r.owner || "") + "</td>" : "") +
        '<td class="num">' + r.gpus + '</td><td class="num">' + r.cpus + '</td><td class="num">' + r.priority + "</td>" +
        '<td><time datetime="' + escapeHtml(r.submitted_at) + '">' + waited(r.submitted_at) + "</time></td>" +
        '<td class="waiting-reason">' + escapeHtml(r.waiting_reason || "not looked at by the scheduler yet") + "</td></tr>";
    }).join("");
    el("queue-table").hidden = body.results.length === 0;
    el("queue-empty").hidden = body.results.length > 0;
    var more = el("queue-more");
    more.hidden = body.count <= body.results.length;
    more.textContent = "Showing the first " + body.results.length + " of " + body.count + ".";
  }

  var rangeSelect = el("plot-range");
  if (rangeSelect) {
    var seconds = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
    rangeSelect.addEventListener("change", function () {
      root.dataset.windowS = String(seconds[rangeSelect.value] || 3600);
      if (window.history && window.history.replaceState) {
        window.history.replaceState(null, "", "?range=" + encodeURIComponent(rangeSelect.value));
      }
      pollCluster().catch(function (err) { if (window.console) console.warn(err); });
    });
  }

  function pollCluster() {
    var d = root.dataset;
    return Promise.all([
      getJSON(d.urlOverview).then(updateOverview),
      getJSON(d.urlQueue).then(updateQueue),
      getJSON(withWindow(d.urlGpuUtil)).then(function (b) {
        var traces = lineTraces(b);
        draw("plot-gpu-util", traces, baseLayout("utilisation (%)", { yaxis: { title: { text: "utilisation (%)" }, range: [0, 105] } }));
        legendNote("plot-gpu-util", traces);
      }),
      getJSON(withWindow(d.urlGpuMemory)).then(function (b) {
        var traces = lineTraces(b);
        draw("plot-gpu-memory", traces, baseLayout("memory used (MB)"));
        legendNote("plot-gpu-memory", traces);
      }),
      getJSON(withWindow(d.urlJobSlowdown)).then(function (b) {
        var traces = lineTraces(b);
        draw("plot-job-slowdown", traces, baseLayout("Slow-Down"));
        legendNote("plot-job-slowdown", traces);
      }),
      getJSON(withWindow(d.urlClusterSeries)).then(function (b) {
        var traces = lineTraces(b, { queue_length: { yaxis: "y2", line: { width: 1.2, dash: "dot", color: "#667085" } } });
        draw("plot-sd-max-diff", traces, baseLayout("SD_max_diff", {
          margin: { l: 55, r: 55, t: 10, b: 40 },
          yaxis2: { title: { text: "jobs queued" }, overlaying: "y", side: "right", rangemode: "tozero" }
        }));
      })
    ]);
  }

  function drawInterference() {
    return getJSON(root.dataset.urlInterference).then(function (b) {
      setText("interference-source", b.model + " · " + b.source);
      setText("interference-note", b.note + " Running GPU jobs per class: " + b.classes.map(function (c) {
        return c + " " + b.running_by_class[c];
      }).join(", ") + ".");
      draw("plot-interference", [{
        type: "heatmap", z: b.matrix, x: b.labels, y: b.labels, colorscale: "YlOrRd", reversescale: true, zmin: 1,
        texttemplate: "%{z:.2f}", hovertemplate: "%{y} next to %{x}: %{z:.2f}<extra></extra>",
        colorbar: { title: { text: "slowdown" } }
      }], {
        margin: { l: 170, r: 20, t: 10, b: 90 }, height: 340,
        xaxis: { title: { text: "co-runner" } }, yaxis: { title: { text: "job" }, autorange: "reversed" },
        paper_bgcolor: "rgba(0,0,0,0)", font: { size: 12 }
      });
    });
  }

  // -- job page ------------------------------------------------------------------------------------

  var jobState = root.dataset.jobState;

  // The job's own GPU memory and SM utilisation, one trace per attempt and GPU.
  function updateJobGpu(body) {
    var groups = {};
    var order = [];
    body.readings.forEach(function (r) {
      var key = "attempt " + r.attempt + ", " + (r.node || "?") + " GPU " + r.gpu_index;
      if (!groups[key]) { groups[key] = { x: [], mem: [], util: [] }; order.push(key); }
      groups[key].x.push(r.at);
      groups[key].mem.push(r.memory_mb);
      groups[key].util.push(r.util_pct);
    });
    function traces(field) {
      return order.filter(function (key) {
        return groups[key][field].some(function (v) { return v !== null; });
      }).map(function (key, i) {
        return { type: "scatter", mode: "lines", name: key, x: groups[key].x, y: groups[key][field],
          line: { color: COLORS[i % COLORS.length], shape: "hv" } };
      });
    }
    draw("plot-job-gpu-memory", traces("mem"), baseLayout("MB"));
    draw("plot-job-gpu-util", traces("util"), baseLayout("%", { yaxis: { title: { text: "%" }, range: [0, 100] } }));
    var peak = body.summary.reduce(function (m, s) { return Math.max(m, s.memory_peak_mb || 0); }, 0);
    setText("job-gpu-peak", body.summary.length ? fmtMb(peak) : "—");
  }

  function pollJob() {
    var d = root.dataset;
    return Promise.all([
      getJSON(d.urlJob).then(function (job) {
        jobState = job.state;
        var badge = el("job-state");
        var label = job.state + (job.end_label ? " (" + job.end_label + ")" : "");
        if (badge && badge.textContent !== label) {
          badge.textContent = label;
          badge.className = "state state-" + job.state.toLowerCase();
        }
        var waiting = el("job-waiting-reason");
        if (waiting) {
          waiting.hidden = job.state !== "PENDING";
          if (job.waiting_reason) setText("job-waiting-text", job.waiting_reason);
        }
      }),
      getJSON(d.urlJobSlowdown).then(function (b) {
        var slowdown = b.series.filter(function (s) { return s.metric === "slowdown"; });
        var progress = b.series.filter(function (s) { return s.metric === "progress"; })[0];
        draw("plot-job-slowdown", lineTraces({ series: slowdown }), baseLayout("Slow-Down"));
        if (progress && progress.points) setText("job-progress", Math.round(100 * progress.v[progress.v.length - 1]) + " %");
      }),
      d.urlJobGpu ? getJSON(d.urlJobGpu).then(updateJobGpu) : null,
      getJSON(d.urlJobLog).then(function (log) {
        var pre = el("job-log");
        var source = { live: "live from the node agent", file: "from the log file", none: "" }[log.source];
        setText("job-log-source", source);
        var text = log.text || (log.source === "none" ? "No output yet." : "");
        if (pre.textContent !== text) {
          var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.textContent = text;
          pre.dataset.lines = String(text ? text.split("\n").length : 0);
          if (atBottom) pre.scrollTop = pre.scrollHeight;
        }
      })
    ]);
  }

  // -- loop ----------------------------------------------------------------------------------------

  var poll = page === "cluster" ? pollCluster : pollJob;
  function tick() {
    poll().catch(function (err) { if (window.console) console.warn("dashboard:", err); })
      .then(function () {
        // A finished job's page stops polling after one last refresh.
        if (page === "job" && TERMINAL.indexOf(jobState) >= 0) return;
        window.setTimeout(tick, document.hidden ? pollMs * 4 : pollMs);
      });
  }
  // The cluster page now draws predicted vs measured interference with interference.js; the
  // class-based heatmap is drawn only where a page still names its endpoint.
  if (page === "cluster" && root.dataset.urlInterference) drawInterference().catch(function (err) { if (window.console) console.warn(err); });
  tick();
})();
