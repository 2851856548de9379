// Submit page: choosing a profile fills the blank resource fields (and the fields this script
// filled for the previous profile). The page works without it: "Fill in from profile" does the
// same on the server.
(function () {
  "use strict";
  var data = document.getElementById("profile-defaults");
  var select = document.getElementById("id_profile");
  if (!data || !select) return;
  var defaults = JSON.parse(data.textContent);
  var names = ["kind", "gpus", "gpu_memory_mb", "params"];

  function show(name, value) {
    if (value === null || value === undefined) return "";
    if (name === "params") return Object.keys(value).length ? JSON.stringify(value, null, 2) : "";
    return String(value);
  }

  select.addEventListener("change", function () {
    var chosen = defaults[select.value] || {};
    names.forEach(function (name) {
      var input = document.getElementById("id_" + name);
      if (!input) return;
      var blank = input.value.trim() === "";
      if (!blank && input.dataset.filledFromProfile !== input.value) return;
      var value = show(name, chosen[name]);
      if (name === "gpu_memory_mb" && document.getElementById("id_gpus").value === "0") value = "";
      input.value = value;
      input.dataset.filledFromProfile = value;
    });
  });
})();
