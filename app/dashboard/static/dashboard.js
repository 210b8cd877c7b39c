/* jobq dashboard: pauses auto-refresh while the tab is hidden or jobs are ticked, and counts
 * leases down.
 *
 * Refreshable parts carry data-refresh and hx-trigger="every Ns, refresh" (JOBQ_DASHBOARD_REFRESH_SECONDS): htmx polls them.
 * Polling is cancelled while document.visibilityState is not "visible" (no eval needed, so
 * the Content-Security-Policy can forbid it), and each part is refreshed once when the tab
 * comes back. Countdowns are <time data-expires-at="ISO" data-server-now="ISO">: the server's
 * clock at render time is the reference, so a browser whose clock is off still counts right.
 *
 * The jobs list's checkboxes (input.pick, submitted with form#pick-form): while any is ticked,
 * the part holding them is not refreshed, so the rows a person picked from stay as they saw
 * them (a refresh would replace them, and could move a ticked job off the page or change its
 * state under the tick). Unticking the last one refreshes it at once. #pick-all ticks or clears
 * every row of the page; the count and the buttons follow the ticks.
 */
(function () {
  "use strict";

  function visible() {
    return document.visibilityState === "visible";
  }

  // Parts whose refresh was held back by ticks, refreshed once the last tick goes.
  var held = [];

  function ticked(part) {
    return part.querySelector("input.pick:checked") !== null;
  }

  function hold(part) {
    if (held.indexOf(part) < 0) {
      held.push(part);
    }
  }

  function refreshable(elt) {
    return elt && elt.hasAttribute && elt.hasAttribute("data-refresh");
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!refreshable(elt)) {
      return;
    }
    if (!visible()) {
      event.preventDefault();
    } else if (ticked(elt)) {
      event.preventDefault();
      hold(elt);
    }
  });

  // A refresh sent just before the first tick must not land on it either.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (refreshable(target) && ticked(target)) {
      event.detail.shouldSwap = false;
      hold(target);
    }
  });

  function syncPicks() {
    var boxes = document.querySelectorAll("input.pick");
    var count = 0;
    for (var i = 0; i < boxes.length; i++) {
      if (boxes[i].checked) {
        count++;
      }
    }
    var all = document.getElementById("pick-all");
    if (all) {
      all.checked = boxes.length > 0 && count === boxes.length;
      all.indeterminate = count > 0 && count < boxes.length;
    }
    var shown = document.getElementById("picked-count");
    if (shown) {
      shown.textContent = String(count);
    }
    var buttons = ["picked-retry", "picked-cancel"];
    for (var b = 0; b < buttons.length; b++) {
      var button = document.getElementById(buttons[b]);
      if (button) {
        button.disabled = count === 0;
      }
    }
    var note = document.getElementById("picked-paused");
    if (note) {
      note.hidden = count === 0;
    }
    return count;
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (!target || !target.matches || !target.matches("#pick-all, input.pick")) {
      return;
    }
    if (target.id === "pick-all") {
      var boxes = document.querySelectorAll("input.pick");
      for (var i = 0; i < boxes.length; i++) {
        boxes[i].checked = target.checked;
      }
    }
    if (syncPicks() === 0 && window.htmx) {
      var parts = held;
      held = [];
      for (var p = 0; p < parts.length; p++) {
        if (parts[p].isConnected) {
          window.htmx.trigger(parts[p], "refresh");
        }
      }
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
  // Also when the browser restores ticks (back to the list from the confirmation).
  document.addEventListener("DOMContentLoaded", syncPicks);
  window.addEventListener("pageshow", syncPicks);
  document.addEventListener("htmx:afterSettle", syncPicks);
  window.setInterval(tick, 1000);
})();
