// The replay page polls its status while the replay runs and reloads once it has ended.
(function () {
  "use strict";
  var panel = document.getElementById("replay-progress");
  if (!panel || panel.dataset.running !== "1") return;
  var bar = document.getElementById("replay-bar");
  var status = document.getElementById("replay-status");
  var message = document.getElementById("replay-message");
  function poll() {
    fetch(panel.dataset.statusUrl, { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (s) {
        bar.value = s.progress;
        message.textContent = s.message;
        status.textContent = s.status_display;
        if (s.status === "done" || s.status === "failed") {
          window.location.reload();
        } else {
          window.setTimeout(poll, 1000);
        }
      })
      .catch(function () { window.setTimeout(poll, 3000); });
  }
  window.setTimeout(poll, 1000);
})();
