"""Catch every Content-Security-Policy violation a page reports, in Chromium."""

from __future__ import annotations

# Runs before any page script, outside the page's policy (Playwright injects it).
_LISTEN = """
document.addEventListener("securitypolicyviolation", (e) => {
  window.__portalCspViolation(
    `${e.violatedDirective} blocked ${e.blockedURI || "inline"} ` +
    `at ${e.sourceFile || document.location.href}:${e.lineNumber}`
  );
});
"""


def watch_violations(page) -> list[str]:
    """Every violation of every page ``page`` loads from now on: the page's
    ``securitypolicyviolation`` events and Chromium's console lines about it."""
    seen: list[str] = []

    def violated(report: str) -> None:
        seen.append(report)

    def console(message) -> None:
        if "Content Security Policy" in message.text:
            seen.append(f"console: {message.text}")

    page.expose_function("__portalCspViolation", violated)
    page.add_init_script(_LISTEN)
    page.on("console", console)
    return seen
