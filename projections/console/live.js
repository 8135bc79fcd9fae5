// Live refresh of a console page whose run is in progress (the console's only script).
//
// Every two seconds, while the tab is visible, it fetches this same page again and puts
// each of the new page's live sections (data-live, by id) that changed in place of the old
// one, while the rest (a filter being typed, a section that did not change, with the text
// selected in it) stays as it is: new calls and ended ones appear without a reload, and
// the scroll position, the address and the filters stay. It stops
// when the new #live section no longer says data-live="1" (the run ended and nothing is in
// flight), or when the page cannot be fetched (the login ended, the console stopped),
// saying so in #live-status. It only reads the console's own page: same origin, the
// login cookie, nothing else.
"use strict";
(function () {
  var PERIOD_MS = 2000;
  var timer = null;
  var stopped = false;

  function say(text) {
    var status = document.getElementById("live-status");
    if (status) status.textContent = text;
  }

  function schedule() {
    timer = window.setTimeout(refresh, PERIOD_MS);
  }

  function refresh() {
    timer = null;
    if (document.hidden) return; // resumed by visibilitychange
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error(String(response.status));
        return response.text();
      })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.getElementById("live");
        if (!fresh || !document.getElementById("live")) throw new Error("no live section");
        document.querySelectorAll("[data-live]").forEach(function (shown) {
          var next = page.getElementById(shown.id);
          if (next && next.outerHTML !== shown.outerHTML) {
            shown.replaceWith(document.importNode(next, true));
          }
        });
        if (fresh.getAttribute("data-live") === "1") {
          say("live: refreshed " + new Date().toLocaleTimeString());
          schedule();
        } else {
          stopped = true;
          say("live: the run has ended");
        }
      })
      .catch(function () {
        stopped = true;
        say("live refresh stopped: reload the page");
      });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer === null && !stopped) refresh();
  });
  var live = document.getElementById("live");
  if (live && live.getAttribute("data-live") === "1") {
    say("live: refreshing every " + PERIOD_MS / 1000 + " s");
    schedule();
  }
})();
