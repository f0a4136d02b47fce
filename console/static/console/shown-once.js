// The page showing a new key's secret answers a POST. Point its history entry at
// the list it came from, so a reload reads the list: it neither shows the secret
// again nor posts the action again (which would issue yet another key).
"use strict";
history.replaceState(null, "", document.currentScript.dataset.next);
