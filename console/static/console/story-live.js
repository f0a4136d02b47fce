// Refresh a live task's timeline in place (console/templates/admin/console/
// event_table.html): every data-live seconds, fetch this page again and swap in the
// table of the same id (and the elements marked data-refresh with its id), until
// the page says the task can no longer change.
"use strict";
(function () {
  for (const table of document.querySelectorAll("table[data-live]")) {
    const seconds = Number(table.dataset.live) || 5;
    const id = table.id;
    const timer = window.setInterval(async function () {
      let response;
      try {
        response = await fetch(window.location.href, {
          credentials: "same-origin",
          headers: { Accept: "text/html" },
        });
      } catch (error) {
        return; // offline for a moment: the next tick tries again
      }
      if (!response.ok) {
        return;
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById(id);
      const current = document.getElementById(id);
      if (!fresh || !current) {
        return;
      }
      current.replaceWith(document.importNode(fresh, true));
      // What the page says about the table (a count in a heading) follows it.
      for (const part of document.querySelectorAll('[data-refresh="' + id + '"]')) {
        const freshPart = part.id ? page.getElementById(part.id) : null;
        if (freshPart) {
          part.replaceWith(document.importNode(freshPart, true));
        }
      }
      if (!fresh.hasAttribute("data-live")) {
        window.clearInterval(timer);
        const note = document.getElementById(id + "-live");
        if (note) {
          note.textContent = "The task has ended: no more refreshes.";
        }
      }
    }, seconds * 1000);
  }
})();
