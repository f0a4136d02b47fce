"""The kill switch and per-agent rate limits and budgets (docs/limits.md)."""
