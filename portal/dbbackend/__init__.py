"""Django's PostgreSQL backend plus the tenant scope of row-level security."""
