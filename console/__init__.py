"""The people's portal: the admin site for reviewers, support staff and tenant admins.

It sits above the apps (docs/style.md R1): it reads and changes tasks, the audit trail
and tenancy only through their services and selectors, scoped to the tenants where
the person holds a membership (portal/roles.py).
"""
