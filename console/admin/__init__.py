"""The portal's admin pages; importing the package registers them (autodiscover)."""

from __future__ import annotations

from django.contrib import admin

from . import desk, domain, identity, limits, policies, routing, trail

__all__ = ["desk", "domain", "identity", "limits", "policies", "routing", "trail"]

admin.site.site_header = "Agent governance portal"
admin.site.site_title = "Governance portal"
admin.site.index_title = "Your tenants"
