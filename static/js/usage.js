// The usage page's figure: built on the server (portal.teams.accounting.usage_figure) and drawn
// here with the vendored plotly.
(function () {
  var data = document.getElementById("usage-figure-data");
  var target = document.getElementById("usage-figure");
  if (!data || !target || typeof Plotly === "undefined") return;
  var fig = JSON.parse(data.textContent);
  Plotly.newPlot(target, fig.data, fig.layout, { responsive: true, displaylogo: false });
})();
