/* jobq dashboard: pauses auto-refresh while the tab is hidden, and counts leases down.
 *
 * Refreshable parts carry data-refresh and hx-trigger="every Ns, refresh" (JOBQ_DASHBOARD_REFRESH_SECONDS): htmx polls them.
 * Polling is cancelled while document.visibilityState is not "visible" (no eval needed, so
 * the Content-Security-Policy can forbid it), and each part is refreshed once when the tab
 * comes back. Countdowns are <time data-expires-at="ISO" data-server-now="ISO">: the server's
 * clock at render time is the reference, so a browser whose clock is off still counts right.
 */
(function () {
  "use strict";

  function visible() {
    return document.visibilityState === "visible";
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!visible() && elt && elt.hasAttribute && elt.hasAttribute("data-refresh")) {
      event.preventDefault();
    }
  });

  document.addEventListener("visibilitychange", function () {
    if (!visible() || !window.htmx) {
      return;
    }
    var parts = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < parts.length; i++) {
      window.htmx.trigger(parts[i], "refresh");
    }
  });

  function spell(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    if (s < 60) {
      return s + " s";
    }
    var m = Math.floor(s / 60);
    s = s % 60;
    if (m < 60) {
      return s ? m + " min " + s + " s" : m + " min";
    }
    var h = Math.floor(m / 60);
    m = m % 60;
    return m ? h + " h " + m + " min" : h + " h";
  }

  // When this page first saw each countdown (by element): its server-now is that moment.
  var seen = new WeakMap();

  function tick() {
    var now = Date.now();
    var clocks = document.querySelectorAll("[data-expires-at]");
    for (var i = 0; i < clocks.length; i++) {
      var el = clocks[i];
      var expires = Date.parse(el.getAttribute("data-expires-at"));
      var serverNow = Date.parse(el.getAttribute("data-server-now") || "");
      if (isNaN(expires)) {
        continue;
      }
      if (!seen.has(el)) {
        seen.set(el, now);
      }
      var reference = isNaN(serverNow) ? now : serverNow + (now - seen.get(el));
      var left = (expires - reference) / 1000;
      if (left >= 1) {
        el.textContent = "in " + spell(left);
        el.classList.remove("expired");
      } else if (left > -1) {
        el.textContent = "now";
      } else {
        el.textContent = "expired " + spell(-left) + " ago";
        el.classList.add("expired");
      }
    }
  }

  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:afterSettle", tick);
  window.setInterval(tick, 1000);
})();
