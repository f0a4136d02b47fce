// Starts Redoc on /api/redoc/ (console/templates/drf_spectacular/redoc.html) under
// the page's Content-Security-Policy (portal/csp.py).
"use strict";
(() => {
  const script = document.currentScript;
  // Redoc writes its styles into <style> elements: they carry this script's nonce.
  const options = Object.assign(JSON.parse(script.dataset.settings || "{}"), {
    nonce: script.nonce,
  });
  // Redoc's menu footer asks Redocly's CDN for a logo. The page loads nothing from
  // other hosts (img-src), so that one image is left out rather than refused.
  const foreign = (value) => String(value).startsWith("https://cdn.redoc.ly/");
  const src = Object.getOwnPropertyDescriptor(HTMLImageElement.prototype, "src");
  Object.defineProperty(HTMLImageElement.prototype, "src", {
    ...src,
    set(value) {
      if (!foreign(value)) src.set.call(this, value);
    },
  });
  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (this instanceof HTMLImageElement && name === "src" && foreign(value)) {
      return undefined;
    }
    return setAttribute.call(this, name, value);
  };
  Redoc.init(
    script.dataset.specUrl,
    options,
    document.getElementById("redoc-container"),
  );
})();
