from __future__ import annotations

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Governance portal"


class PortalAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin, with the portal's site (the dashboard) as ``admin.site``.

    Listed in INSTALLED_APPS by its path; ``default = False`` keeps Django from
    taking it for the console app's own config.
    """

    default = False
    default_site = "console.site.PortalAdminSite"
