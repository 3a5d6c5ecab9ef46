// Loom console: live updates of a session page over SSE. The server sends, per event, the HTML
// of the nodes it changed, rendered (and escaped) by the same templates as the page; this
// script only puts that HTML in place. No build step, no dependencies.
(function () {
  "use strict";
  var script = document.currentScript;
  // forms that destroy something ask first (no inline handlers: the CSP allows none)
  document.addEventListener("submit", function (event) {
    var form = event.target.closest && event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); }
  }, true);
  var url = script && script.getAttribute("data-live");
  if (!url || !window.EventSource) { return; }
  var state = document.getElementById("live-state");
  var source = new EventSource(url);
  var seen = 0;

  function place(part) {
    var el = part.node ? document.getElementById(part.node) : null;
    if (part.mode === "text") {
      if (el) { el.textContent = part.html; }
      return;
    }
    if (el) {  // an update, or a node sent again after a reconnect: replace it
      var open = el.querySelectorAll("details[open]").length > 0 && el.querySelector("details");
      el.outerHTML = part.html;
      if (open) {
        var again = document.getElementById(part.node);
        var first = again && again.querySelector("details");
        if (first) { first.open = true; }
      }
      return;
    }
    if (part.mode !== "new") { return; }
    var top = part.parent === "timeline" || part.parent === "transcript";
    var parent = document.getElementById(top ? part.parent : part.parent + "-children");
    if (parent) { parent.insertAdjacentHTML("beforeend", part.html); }
  }

  source.onopen = function () { if (state) { state.textContent = "live"; } };
  source.onerror = function () { if (state) { state.textContent = "reconnecting"; } };
  source.onmessage = function (message) {
    var data = JSON.parse(message.data);
    data.parts.forEach(place);
    seen += 1;
    document.body.setAttribute("data-live-events", String(seen));
  };
  source.addEventListener("reload", function () { window.location.reload(); });
})();
