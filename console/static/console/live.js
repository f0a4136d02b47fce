/* Keeps a page's live part current: every element with data-refresh-every="N" is
   replaced by the same element of a fresh copy of the page every N seconds, while
   the tab is visible. No inline script (the Content-Security-Policy runs none) and
   nothing from another origin. The element's data-refreshed-at says when. */
(function () {
  "use strict";
  function refresh(element) {
    if (document.hidden) { return Promise.resolve(); }
    return fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Portal-Refresh": "1" },
    }).then(function (response) {
      if (!response.ok) { throw new Error(response.status); }
      return response.text();
    }).then(function (html) {
      var fresh = new DOMParser().parseFromString(html, "text/html")
        .getElementById(element.id);
      if (fresh) {
        element.innerHTML = fresh.innerHTML;
        element.dataset.refreshedAt = new Date().toISOString();
        element.classList.remove("refresh-failed");
      }
    }).catch(function () {
      element.classList.add("refresh-failed");
    });
  }
  function start() {
    document.querySelectorAll("[data-refresh-every]").forEach(function (element) {
      var seconds = Math.max(2, parseInt(element.dataset.refreshEvery, 10) || 10);
      var loop = function () {
        refresh(element).then(function () { window.setTimeout(loop, seconds * 1000); });
      };
      window.setTimeout(loop, seconds * 1000);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
