// Predicted vs measured interference (Co-scheML, ALGORITHMS.md §2): fills every element with a
// data-interference-url attribute from /api/v1/interference/heatmap/ (profile x profile), on the
// cluster page and the profile page, and refreshes every data-poll-ms (default 30 s). Each plot
// container gets data-points="N" (cells drawn) after each update; the text parts work without
// plotly.
(function () {
  "use strict";
  var hasPlotly = typeof window.Plotly !== "undefined";
  var CONFIG = { displaylogo: false, responsive: true };

  function fmt(v, digits) { return v === null || v === undefined ? "—" : Number(v).toFixed(digits); }

  function setText(root, role, text) {
    var node = root.querySelector('[data-role="' + role + '"]');
    if (node && node.textContent !== text) node.textContent = text;
  }

  function modelText(m) {
    if (!m) return "no model active";
    var parts = [m.name + " (" + m.algorithm + ")"];
    ["cv5", "cv5_pairs", "loao"].forEach(function (v) {
      var s = m.scores[v];
      if (s && s.n) parts.push(v + " MSE " + fmt(s.mse, 4) + ", R² " + fmt(s.r2, 2));
    });
    return parts.join(" · ");
  }

  function heatmap(node, z, labels, title, hover) {
    var cells = 0;
    z.forEach(function (row) { row.forEach(function (v) { if (v !== null) cells += 1; }); });
    var empty = node.parentNode.querySelector('[data-role="' + node.dataset.role + '-empty"]');
    if (empty) empty.hidden = cells > 0;
    node.hidden = cells === 0 && !!empty;
    if (hasPlotly && cells > 0) {
      window.Plotly.react(node, [{
        type: "heatmap", z: z, x: labels, y: labels, colorscale: "YlOrRd", zmin: 1, zmax: 2.5,
        texttemplate: "%{z:.2f}", hovertemplate: "%{y} next to %{x}: " + hover + " %{z:.2f}<extra></extra>",
        colorbar: { title: { text: title } }, hoverongaps: false
      }], {
        margin: { l: 150, r: 20, t: 10, b: 110 }, height: 360,
        xaxis: { title: { text: "co-runner" } }, yaxis: { title: { text: "job" }, autorange: "reversed" },
        paper_bgcolor: "rgba(0,0,0,0)", font: { size: 11 }
      }, CONFIG);
    }
    node.dataset.points = String(cells);
  }

  function update(root, body) {
    setText(root, "model", modelText(body.model));
    var err = body.mean_abs_error === null ? "" : " Mean |predicted − measured| over " +
      body.measured_pairs + " pair(s): " + fmt(body.mean_abs_error, 3) + ".";
    setText(root, "note", body.note + err + " GPU model: " + body.gpu_model + ".");
    var predicted = root.querySelector('[data-role="predicted"]');
    var measured = root.querySelector('[data-role="measured"]');
    if (predicted) heatmap(predicted, body.predicted, body.labels, "predicted", "predicted slowdown");
    if (measured) heatmap(measured, body.measured, body.labels, "measured", "measured slowdown");
  }

  function refresh(root) {
    return fetch(root.dataset.interferenceUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error(root.dataset.interferenceUrl + ": HTTP " + r.status);
        return r.json();
      })
      .then(function (body) { update(root, body); });
  }

  Array.prototype.forEach.call(document.querySelectorAll("[data-interference-url]"), function (root) {
    var every = parseInt(root.dataset.pollMs, 10) || 30000;
    function tick() {
      refresh(root).catch(function (err) { if (window.console) console.warn("interference:", err); })
        .then(function () { window.setTimeout(tick, document.hidden ? every * 4 : every); });
    }
    tick();
  });
})();
