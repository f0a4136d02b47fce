"""Django settings, driven by environment variables (see README, "Configuration").

Fail closed: without ``DJANGO_SECRET_KEY`` the portal refuses to start unless
development mode is explicit (``PORTAL_DEV_MODE=1``, which ``manage.py up``,
``manage.py test``, pytest and ``.ci/run`` set). Production also needs
``DJANGO_ALLOWED_HOSTS``, and refuses placeholder, short or missing secrets
(``portal/production_secrets.py``).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any, Final

from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from portal import database_url, process, production_secrets

BASE_DIR = Path(__file__).resolve().parent.parent
# Project-local, git-ignored state: embedded PostgreSQL data, broker folders, logs.
VAR_DIR = Path(os.environ.get("PORTAL_VAR_DIR", BASE_DIR / "var"))


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item]


DEBUG = _env_bool("DJANGO_DEBUG", default=False)
# Development mode is a decision, never a default: without it and without a secret
# key the portal would run on the public development key with insecure cookies.
DEV_MODE = _env_bool("PORTAL_DEV_MODE", default=False)
if "DJANGO_SECRET_KEY" not in os.environ and not DEV_MODE:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set, so the portal will not start. Either set "
        "DJANGO_SECRET_KEY (and DJANGO_ALLOWED_HOSTS) to run it for real, or set "
        "PORTAL_DEV_MODE=1 to run the development setup on its public, insecure "
        "key (manage.py up and manage.py test set it for you)."
    )
PRODUCTION = not DEBUG and "DJANGO_SECRET_KEY" in os.environ
if PRODUCTION:
    # No placeholder, short or missing secret, no signing key in the web server
    # (portal/production_secrets.py; config/wsgi.py marks the web's process).
    production_secrets.secrets_refuse_weak(os.environ, web=process.is_web())

# Development runs get a fixed, clearly insecure key; production must bring its own.
SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "django-insecure-development-only-key-never-use-in-production"
)
ALLOWED_HOSTS = _env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = _env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    # First: its templates/admin/ (the dashboard index) override the admin's own.
    "console",
    "console.apps.PortalAdminConfig",  # django.contrib.admin with the portal's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc served from static files
    "guardian",
    "axes",  # login lockout (AXES_* below)
    "portal",
    "tasks",
    "policies",  # the tenants' Cedar policy sets (docs/policies.md)
    "limits",  # the kill switch, rate limits and budgets (docs/limits.md)
    "routing",  # desk items' groups, SLAs and notifications (docs/routing.md)
    "audit",
    "tenant_deletion",  # above the apps: its migration holds the operator's purge
    "mcp_server",  # above the apps: the MCP server's `manage.py mcp` (docs/mcp.md)
    "config",  # the wiring above every app: the commands that span apps (up, test, ...)
]

MIDDLEWARE = [
    # Outermost of all: times every request Django answers, by route (/metrics).
    "portal.metrics.HttpMetricsMiddleware",
    # The request's trace (the caller's traceparent or a new one), where the Django
    # instrumentation, installed only while spans are exported, makes no span.
    "portal.tracing.RequestSpanMiddleware",
    # Every answer leaves with a Content-Security-Policy header (below), the
    # problem+json rewrites of the next one included.
    "portal.csp.ContentSecurityPolicyMiddleware",
    # Then: every error answer under /api/ leaves as problem+json.
    "portal.middleware.ApiProblemMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "portal.middleware.CommonMiddleware",  # Django's, no slash redirect of API writes
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After authentication: a person's tenants are the request's scope.
    "portal.scope_middleware.TenantScopeMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a locked-out login into its 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The embedded server started by ``manage.py up`` (see launcher/embedded_db.py) listens
# here when DATABASE_URL is unset.
EMBEDDED_DATABASE_URL = "postgres://postgres@127.0.0.1:{port}/portal".format(
    port=os.environ.get("PORTAL_EMBEDDED_PG_PORT", "54329")
)
DATABASE_URL = os.environ.get("DATABASE_URL") or EMBEDDED_DATABASE_URL
# Two roles (portal/db_roles.py): DATABASE_URL is the app role's, which runs web,
# workers, beat and commands; ``manage.py migrate`` connects as the schema owner of
# DATABASE_OWNER_URL. ``up`` and the test suite set both from an administrator's URL.
DATABASE_OWNER_URL = os.environ.get("DATABASE_OWNER_URL", "")
DATABASE_APP_ROLE = ""  # DATABASE_URL's user unless ``up`` or the tests say otherwise
# The operator role's, for ``manage.py delete_tenant`` only (docs/tenant-deletion.md).
DATABASE_OPERATOR_URL = os.environ.get("DATABASE_OPERATOR_URL", "")
# A multi-host URL (libpq's, with ``target_session_attrs=read-write``) names every
# node of a highly available cluster (portal/database_url.py, deploy/ha/).
_database: dict[str, Any] = database_url.parse(
    DATABASE_URL, conn_max_age=60, conn_health_checks=True
)
# What the URL's query says (target_session_attrs, ...) is kept below; the portal's
# own options win over the same names.
_url_options: dict[str, Any] = dict(_database.get("OPTIONS") or {})
# Django's PostgreSQL backend, plus the tenant scope of row-level security.
_database["ENGINE"] = "portal.dbbackend"
_server_side_binding = _env_bool("PORTAL_DB_SERVER_SIDE_BINDING", default=True)


def _prepare_threshold(server_side_binding: bool) -> int | None:
    """Runs of a statement on a connection before psycopg prepares it; None: never.

    Django 5.2 passes ``prepare_threshold=None`` to psycopg unless OPTIONS names it,
    so this must be said here for prepared statements to be on at all.
    """
    value = os.environ.get("PORTAL_DB_PREPARE_THRESHOLD", "").strip().lower()
    if value in {"off", "none", "no", "false"}:
        return None
    if not value:
        return 5 if server_side_binding else None
    try:
        threshold = int(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"PORTAL_DB_PREPARE_THRESHOLD={value!r}: a number of runs, or 'off'"
        ) from None
    if threshold < 0:
        raise ImproperlyConfigured(
            f"PORTAL_DB_PREPARE_THRESHOLD={value!r}: a number of runs, or 'off'"
        )
    return threshold


# A link that goes silent under an OPEN connection (a partition, a dead host, a
# failover's lost address) while a query waits: libpq has no timeout for a reply, so
# the wait lasted until gunicorn killed the worker (30 s). Keepalive probes after
# ``KEEPALIVES_IDLE_S`` of silence, one each ``INTERVAL_S``, and ``TCP_USER_TIMEOUT_S``
# for unanswered probes or unacknowledged data end it: an OperationalError, a 503.
# A slow query on a healthy link is not cut: the server's kernel answers the probes
# while the statement runs (statement_timeout, 60 s, bounds the statement; this bounds
# the silence of the peer). Under gunicorn's 30 s so the client gets the 503, over a
# few seconds of packet loss. The same values go to the server for its side of the
# connection, so a backend whose client vanished mid-transaction rolls back and
# frees its locks instead of waiting for the kernel's 2-hour keepalive.
# docs/reliability.md "Network faults (R15)", tests/http/test_db_partition.py.


def _env_count(name: str, default: int) -> int:
    """A whole number >= 0 from the environment (0: the system's default)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ImproperlyConfigured(f"{name}={value!r}: a whole number >= 0")
    return int(value)


_DB_TCP_USER_TIMEOUT_S = _env_count("PORTAL_DB_TCP_USER_TIMEOUT_S", 10)
_DB_KEEPALIVES_IDLE_S = _env_count("PORTAL_DB_KEEPALIVES_IDLE_S", 5)
_DB_KEEPALIVES_INTERVAL_S = _env_count("PORTAL_DB_KEEPALIVES_INTERVAL_S", 1)
# Probes before giving up where TCP_USER_TIMEOUT is unknown (Linux lets it decide).
_DB_KEEPALIVES_COUNT = _env_count("PORTAL_DB_KEEPALIVES_COUNT", 5)
# 0 leaves an option out, to the kernel's default (libpq would pass 0 to setsockopt,
# which refuses it for the keepalive knobs: every connection would fail).
_db_tcp_values = {
    "keepalives_idle": _DB_KEEPALIVES_IDLE_S,
    "keepalives_interval": _DB_KEEPALIVES_INTERVAL_S,
    "keepalives_count": _DB_KEEPALIVES_COUNT,
    "tcp_user_timeout": _DB_TCP_USER_TIMEOUT_S * 1000,  # libpq: milliseconds
}
_db_tcp_options: dict[str, int] = {
    "keepalives": 1,
    **{name: value for name, value in _db_tcp_values.items() if value > 0},
}
# The server's names for the same (tcp_user_timeout in ms there too); 0 is its
# "the kernel's default", so every value may be said.
_db_server_tcp = (
    f"-c tcp_keepalives_idle={_DB_KEEPALIVES_IDLE_S}"
    f" -c tcp_keepalives_interval={_DB_KEEPALIVES_INTERVAL_S}"
    f" -c tcp_keepalives_count={_DB_KEEPALIVES_COUNT}"
    f" -c tcp_user_timeout={_DB_TCP_USER_TIMEOUT_S * 1000}"
)

_portal_options: dict[str, Any] = {
    # Fail fast rather than queue behind a stuck lock; services retry where it is safe.
    "options": f"-c lock_timeout=10000 -c statement_timeout=60000 {_db_server_tcp}",
    **_db_tcp_options,
    # A database that cannot be reached makes the request a 503 within this many
    # seconds (libpq waits forever by default, so a partitioned link held a web
    # worker until gunicorn killed it). tests/http/test_db_link.py.
    "connect_timeout": int(os.environ.get("PORTAL_DB_CONNECT_TIMEOUT_S", "5")),
    # Bind parameters on the server and let psycopg prepare a statement the fifth
    # time it runs, so the hot paths' statements are parsed and planned once per
    # connection (docs/performance.md). Turn both off behind PgBouncer's transaction
    # pooling older than 1.21, which cannot keep prepared statements.
    "server_side_binding": _server_side_binding,
    "prepare_threshold": _prepare_threshold(_server_side_binding),
}
_database["OPTIONS"] = {**_url_options, **_portal_options}
_database["TEST"] = {"NAME": os.environ.get("PORTAL_TEST_DATABASE", "test_portal")}
DATABASES = {"default": _database}
# A hot standby for the reviewers' read-only pages (portal/replica.py): the same
# role and options; the router sends only those pages' reads there.
PORTAL_REPLICA_DATABASE_URL = os.environ.get("PORTAL_REPLICA_DATABASE_URL", "")
if PORTAL_REPLICA_DATABASE_URL:
    _replica: dict[str, Any] = database_url.parse(
        PORTAL_REPLICA_DATABASE_URL, conn_max_age=60, conn_health_checks=True
    )
    _replica["ENGINE"] = _database["ENGINE"]
    _replica["OPTIONS"] = {**(_replica.get("OPTIONS") or {}), **_portal_options}
    # The test runner makes no database for it: in tests it is the default one.
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
    DATABASE_ROUTERS = ["portal.replica.ReplicaRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Each service opens its own durable transaction (docs/style.md R5).
ATOMIC_REQUESTS = False

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username and address before any password check.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

# Login lockout (django-axes; docs/portal.md, "Login and page security"): five
# failed logins for one username from one address lock that pair out for 15 minutes
# (each refused try restarts the 15). The pair, not the username alone: nobody can
# lock a person out from anywhere by typing their name; nor the address alone: one
# office behind one address is not locked out by one person. A success clears the
# count. The operator unlocks sooner: manage.py axes_reset_username NAME.
AXES_FAILURE_LIMIT = 5
# No INFO line at every process start ("AXES: BEGIN version ..."); lockouts are
# still logged as warnings.
AXES_VERBOSE = False
AXES_COOLOFF_TIME = dt.timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "console.lockout.lockout_response"  # the 429 page
AXES_CLIENT_IP_CALLABLE = "console.lockout.client_ip"
# The attempts are read with manage.py axes_list_attempts; axes' own admin pages
# would show every tenant's people to every staff account.
AXES_ENABLE_ADMIN = False
# Masked in axes' log lines and stored form data (the password always is).
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "csrfmiddlewaretoken"]
# Reverse proxies in front of the web process that append the client's address to
# X-Forwarded-For (nginx: $proxy_add_x_forwarded_for); 0: the peer's address counts.
PORTAL_TRUSTED_PROXIES = int(os.environ.get("PORTAL_TRUSTED_PROXIES", "0"))

# Content-Security-Policy on every answer (django-csp, through portal/csp.py).
# Pages take scripts, styles, images and fonts from this server only; no inline
# script or style runs unless it carries the request's nonce (only the Redoc page
# uses one: its start and the style sheets Redoc writes). data: images are the SVG
# icons of Swagger UI's style sheet.
CONTENT_SECURITY_POLICY: dict[str, Any] = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}
# The Redoc page (/api/redoc/) adds what its bundle needs and cannot carry a nonce
# for: the two style elements it writes as it loads (perfect-scrollbar's sheet, and
# an empty one), by hash; and its search index's worker, made from a blob.
# tests/browser/test_csp.py fails on any violation, so a new bundle's sheets show.
PORTAL_CSP_REDOC: dict[str, list[str]] = {
    "style-src": [
        "'sha256-QMIg+bpjm3JdElJ388KYke01izlUW0UoNOeKjpMxdgc='",
        "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='",
    ],
    "worker-src": [SELF, "blob:"],
}
# Answers that are not HTML (the API's JSON, /metrics, the probes, static files)
# have nothing to load: this policy instead.
PORTAL_CSP_NOT_HTML: dict[str, list[str]] = {
    "default-src": [NONE],
    "frame-ancestors": [NONE],
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# The admin shows times to the second with the zone (console/formats/en/formats.py).
FORMAT_MODULE_PATH = ["console.formats"]

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT", BASE_DIR / "staticfiles"))

# Agents authenticate with a Bearer key (portal/api.py); staff use the admin session.
REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["portal.parsers.JSONParser"],
    # portal.api's, which it calls, after recording frozen callers (docs/limits.md).
    "EXCEPTION_HANDLER": "limits.api.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_RATES": {
        "agent": os.environ.get("PORTAL_AGENT_RATE_LIMIT", "1200/min"),
        # Failed API authentications per source address and per key prefix
        # (portal.api.AuthFailureThrottle, docs/limits.md).
        "auth_failure": os.environ.get("PORTAL_AUTH_FAILURE_LIMIT", "20/min"),
    },
}
SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Agent governance portal API",
    "DESCRIPTION": (
        "Agents register tasks, hold leases, reserve operations under idempotency "
        "keys and read their redacted history. Errors are RFC 9457 problem+json "
        "with a stable `code`. See docs/api.md."
    ),
    "VERSION": "1.0.0",
    # OpenAPI 3.1 (JSON Schema 2020-12): ``propertyNames`` states what an object's
    # keys may be (no NUL), which 3.0 cannot.
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Swagger UI and Redoc from this server's static files, not a CDN: the docs
    # work offline and the pages name no third-party host.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # What the server checks beyond DRF's defaults, stated in the schema
    # (portal/api_input.py): free-form JSON components, and no NUL in request text.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api_input.api_schema_hook",
    ],
    "ENUM_NAME_OVERRIDES": {
        "ReasonCodeEnum": "portal.codes.ReasonCode",
        "TaskStateEnum": "tasks.models.TaskState",
        "OperationStateEnum": "tasks.models.OperationState",
    },
}
PORTAL_IDEMPOTENCY_WINDOW_S = int(
    os.environ.get("PORTAL_IDEMPOTENCY_WINDOW_S", "86400")
)
# How long a first delivery may run before a duplicate may take its key over.
PORTAL_IDEMPOTENCY_LOCK_S = int(os.environ.get("PORTAL_IDEMPOTENCY_LOCK_S", "60"))

# Django's cache stays its default, per-process memory: nothing in the portal uses
# it. The API throttle counts in PostgreSQL (portal/api.py, docs/limits.md), the one
# counter every process shares; there is no Redis to configure.

# Celery: RabbitMQ (or any broker URL) when configured; kombu's filesystem transport
# under var/broker/ otherwise, so one laptop needs no broker service. The host part
# means nothing to that transport, but without one kombu logs "No hostname was
# supplied" each time a connection is cloned (manage.py up printed it).
EMBEDDED_BROKER_URL: Final = "filesystem://localhost/"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", EMBEDDED_BROKER_URL)
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "control_folder": str(_broker_dir / "control"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
    }
    # kombu's filesystem transport does not make its folders; a fresh clone has none,
    # and the first publish (an enqueue from a web request) would fail without them.
    for _folder in ("queue", "control", "processed"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
# The queue jobs go to and workers take from: one name per portal sharing a broker.
# A durable quorum queue on RabbitMQ (replicated with Raft, fsynced before the broker
# confirms; Celery's documented ``task_default_queue_type``): its jobs survive a
# broker restart. Celery then turns off global QoS and declares its native
# delayed-delivery queues (quorum too) for the jobs' retries with a countdown. The
# default name is not Celery's ``celery``: a deployed broker that has a classic queue
# of that name would refuse the quorum declaration (406 PRECONDITION_FAILED); see
# docs/outbox.md, "Quorum queues", for the migration. The filesystem transport
# ignores the type.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("PORTAL_CELERY_QUEUE", "portal.jobs")
CELERY_TASK_DEFAULT_QUEUE_TYPE = os.environ.get("PORTAL_CELERY_QUEUE_TYPE", "quorum")
CELERY_TASK_CREATE_MISSING_QUEUE_TYPE = CELERY_TASK_DEFAULT_QUEUE_TYPE
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 60
CELERY_TASK_TIME_LIMIT = 90
CELERY_TASK_IGNORE_RESULT = True
# Routing and notifications (docs/routing.md). Mail goes through Django's SMTP
# backend to PORTAL_EMAIL_HOST:PORTAL_EMAIL_PORT; links point at PORTAL_PUBLIC_URL.
# Development without PORTAL_EMAIL_HOST prints mail (invitations' links) on the
# console, so that manage.py up needs no SMTP server.
EMAIL_BACKEND = (
    "django.core.mail.backends.console.EmailBackend"
    if DEV_MODE and "PORTAL_EMAIL_HOST" not in os.environ
    else "django.core.mail.backends.smtp.EmailBackend"
)
EMAIL_HOST = os.environ.get("PORTAL_EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = int(os.environ.get("PORTAL_EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("PORTAL_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("PORTAL_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("PORTAL_EMAIL_USE_TLS", "") == "1"
DEFAULT_FROM_EMAIL = os.environ.get("PORTAL_EMAIL_FROM", "portal@localhost")
PORTAL_PUBLIC_URL = os.environ.get(
    "PORTAL_PUBLIC_URL", f"http://127.0.0.1:{os.environ.get('PORTAL_PORT', '8000')}"
)
PORTAL_SLA_REMIND_AFTER_S = 900  # items with no routing rule: remind after 15 min
PORTAL_SLA_ESCALATE_AFTER_S = 3600  # and count a breach after an hour
PORTAL_NOTIFY_TIMEOUT_S = 10.0
PORTAL_NOTIFY_CLAIM_LEASE_S = 60
PORTAL_NOTIFY_BACKOFF_BASE_S = 5
PORTAL_NOTIFY_BACKOFF_CAP_S = 600
PORTAL_NOTIFY_MAX_ATTEMPTS = 20

CELERY_BEAT_SCHEDULE: dict[str, Any] = {
    "reap-leases": {"task": "tasks.jobs.reap_leases_job", "schedule": 5.0},
    "wake-tasks": {"task": "tasks.jobs.wake_tasks_job", "schedule": 5.0},
    "check-receipts": {
        "task": "tasks.jobs.check_receipts_job",
        "schedule": 10.0,
    },
    "purge-idempotent-requests": {
        "task": "portal.jobs.purge_idempotent_requests_job",
        "schedule": 3600.0,
    },
    # Sign every moved chain head (docs/audit-integrity.md).
    "checkpoint-audit": {
        "task": "audit.jobs.checkpoint_audit_job",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    # Retention (docs/retention.md): month partitions of audit_event made ahead;
    # expired events, payloads and delivered outbox rows removed.
    "ensure-event-partitions": {
        "task": "audit.jobs.ensure_event_partitions_job",
        "schedule": 6 * 3600.0,
    },
    "apply-retention": {
        "task": "audit.jobs.apply_retention_job",
        "schedule": 24 * 3600.0,
    },
    "purge-sent-outbox": {
        "task": "audit.jobs.purge_sent_outbox_job",
        "schedule": 3600.0,
    },
    # Desk items' SLA clocks and their notifications (docs/routing.md).
    "sweep-sla": {
        "task": "routing.jobs.sweep_sla_job",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    "deliver-notifications": {
        "task": "routing.jobs.deliver_notifications_job",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    # The outbox relay's safety net; commits also nudge it (docs/outbox.md).
    "relay-outbox": {
        "task": "audit.jobs.relay_outbox_job",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
}
# The outbox relay (audit/relay.py, docs/outbox.md): where events are published, and
# how rows are leased, retried and given up on.
PORTAL_EVENTS_BROKER_URL = os.environ.get("PORTAL_EVENTS_BROKER_URL", CELERY_BROKER_URL)
PORTAL_EVENTS_EXCHANGE = os.environ.get("PORTAL_EVENTS_EXCHANGE", "portal.events")
# A commit that wrote an outbox row nudges a relay run at once (coalesced), through
# this Celery app (the relay is handed it by name, as WSGI_APPLICATION names the web's).
PORTAL_RELAY_NUDGE = _env_bool("PORTAL_RELAY_NUDGE", default=True)
PORTAL_CELERY_APP = "config.celery.app"
# 200: one relay drained 3,015 rows/s (median of three) with batches of 200 against
# 2,498 with 50, interleaved on a quiet machine (bench/relay.py --batch, 2026-12-02):
# fewer passes, each with its claim, waves and marks.
PORTAL_OUTBOX_BATCH_SIZE = 200
PORTAL_OUTBOX_CLAIM_LEASE_S = 30.0
PORTAL_OUTBOX_BACKOFF_BASE_S = 1.0
PORTAL_OUTBOX_BACKOFF_CAP_S = 60.0
PORTAL_OUTBOX_MAX_ATTEMPTS = 25
PORTAL_OUTBOX_CONFIRM_TIMEOUT_S = 10.0
PORTAL_OUTBOX_RELAY_BUDGET_S = 20.0

# The audit checkpoints' Ed25519 signing key (docs/audit-integrity.md): PEM text in
# the environment, or a PEM file, given to the Celery workers only: the web server
# never loads it (portal/process.py) and production refuses a web that is given one.
# Production refuses to sign without one; development and tests generate
# PORTAL_AUDIT_DEV_SIGNING_KEY_FILE on first use, and its public half beside it.
PORTAL_AUDIT_SIGNING_KEY = os.environ.get("PORTAL_AUDIT_SIGNING_KEY", "")
PORTAL_AUDIT_SIGNING_KEY_FILE = os.environ.get("PORTAL_AUDIT_SIGNING_KEY_FILE", "")
PORTAL_AUDIT_DEV_SIGNING_KEY_FILE = VAR_DIR / "audit-signing-key.pem"
# The public half, which the web publishes (GET /api/v1/audit/public-key); required
# by a production web, and checked against the private key by the signer. Empty:
# PORTAL_AUDIT_DEV_PUBLIC_KEY_FILE, which the development signer writes.
PORTAL_AUDIT_PUBLIC_KEY_FILE = os.environ.get("PORTAL_AUDIT_PUBLIC_KEY_FILE", "")
PORTAL_AUDIT_DEV_PUBLIC_KEY_FILE = VAR_DIR / "audit-public-key.pem"
# Witnesses of the tree heads (docs/audit-integrity.md, "Witnesses"): each entry is
# "<verifier key> <add-checkpoint URL prefix>", entries separated by ";". The
# checkpoint job submits every new head to each after commit, and verify_audit
# requires each one's cosignature. Empty: no witness.
PORTAL_AUDIT_WITNESSES = [
    entry.strip()
    for entry in os.environ.get("PORTAL_AUDIT_WITNESSES", "").split(";")
    if entry.strip()
]
PORTAL_AUDIT_WITNESS_TIMEOUT_S = 5.0
# RFC 3161 time-stamping of the tree heads (docs/audit-integrity.md, "Timestamps"):
# the TSA's URL, and the PEM file of the root its certificates chain to (verify_audit
# checks every token against it). Empty URL: no timestamps.
PORTAL_AUDIT_TSA_URL = os.environ.get("PORTAL_AUDIT_TSA_URL", "")
PORTAL_AUDIT_TSA_ROOT_FILE = os.environ.get("PORTAL_AUDIT_TSA_ROOT_FILE", "")
# The append-only export of the tree heads (docs/audit-integrity.md, "Append-only
# export"): one JSON-lines file per tenant in this folder. Production puts it on
# object-lock (WORM) storage. Empty: no export.
PORTAL_AUDIT_EXPORT_DIR = os.environ.get("PORTAL_AUDIT_EXPORT_DIR", "")
# How long an evidence export in the web waits for the worker to sign the task's
# new events (audit/evidence.py) before it answers with the chain not yet covered.
PORTAL_EVIDENCE_SIGN_WAIT_S = 10.0

# Redaction (docs/redaction.md): the server secret the per-tenant keys of the keyed
# hashes and of the sealed operation values are derived from; required in production
# (32+ characters), in development empty means SECRET_KEY.
# Outside the database; changing it makes old hashes unsearchable and sealed values
# of unfinished operations unreadable.
PORTAL_REDACTION_SECRET = os.environ.get("PORTAL_REDACTION_SECRET", "")

# Domain settings.
PORTAL_EVENT_PAYLOAD_MAX_BYTES = 8192  # copied into audit migration 0002 (R7)
# Retention (docs/retention.md): the defaults for tenants without a policy row.
# Events go by whole months (UTC), payloads by days; delivered outbox rows after
# PORTAL_OUTBOX_SENT_RETENTION_DAYS. Partitions are made this many months ahead.
PORTAL_AUDIT_EVENT_RETENTION_MONTHS = int(
    os.environ.get("PORTAL_AUDIT_EVENT_RETENTION_MONTHS", "24")
)
PORTAL_AUDIT_PAYLOAD_RETENTION_DAYS = int(
    os.environ.get("PORTAL_AUDIT_PAYLOAD_RETENTION_DAYS", "180")
)
PORTAL_OUTBOX_SENT_RETENTION_DAYS = int(
    os.environ.get("PORTAL_OUTBOX_SENT_RETENTION_DAYS", "7")
)
PORTAL_AUDIT_PARTITIONS_AHEAD = 3
# /metrics (docs/observability.md, "Metrics"): scrapers send it as a bearer token;
# while it is empty /metrics answers 404.
PORTAL_METRICS_TOKEN = os.environ.get("PORTAL_METRICS_TOKEN", "")

# Where the admin links a trace id: a URL with "{trace_id}", e.g. Jaeger's
# "http://localhost:16686/trace/{trace_id}"; empty shows trace ids as plain text.
PORTAL_TRACE_URL_TEMPLATE = os.environ.get("PORTAL_TRACE_URL_TEMPLATE", "")
PORTAL_DEFAULT_LEASE_SECONDS = 60
PORTAL_MAX_LEASE_SECONDS = 3600
# The gateway: how long a call may be in flight before recovery treats its result as
# unknown, how often recovery may fail to get an answer before a person decides, and
# the first wait between such lookups (doubling, capped at 300 s).
PORTAL_EXECUTION_DEADLINE_S = int(os.environ.get("PORTAL_EXECUTION_DEADLINE_S", "60"))
PORTAL_RECOVERY_MAX_LOOKUPS = 5
PORTAL_RECOVERY_BACKOFF_S = 5
# A credential that expired while the remote held the call (401, and past its expiry
# on the database clock): fresh credentials under the same key at most this many
# times in the same execution, then a person (CREDENTIAL_EXPIRED).
PORTAL_CREDENTIAL_EXPIRED_RETRIES = int(
    os.environ.get("PORTAL_CREDENTIAL_EXPIRED_RETRIES", "2")
)
# host:port pairs the gateway may call though not public (tasks/outbound.py), and
# the only ones it may call over http, in development: there the demo desk's.
PORTAL_OUTBOUND_ALLOWED_HOSTS = _env_list(
    "PORTAL_OUTBOUND_ALLOWED_HOSTS",
    f"127.0.0.1:{os.environ.get('PORTAL_TICKETDESK_PORT', '8100')}" if DEV_MODE else "",
)

# Log lines: "plain" text, or "json" (portal/logs.py: one redacted JSON object per
# line with tenant, task, operation, trace and span ids). PORTAL_LOG_FORMAT chooses;
# production settings default to json (docs/observability.md, "Logs").
PORTAL_LOG_FORMAT = os.environ.get(
    "PORTAL_LOG_FORMAT", "json" if PRODUCTION else "plain"
)
if PORTAL_LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(
        f"PORTAL_LOG_FORMAT must be plain or json, not {PORTAL_LOG_FORMAT!r}"
    )
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "portal.logs.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
            # By dotted path: loaded when logging is configured, after the apps.
            "redactor": "audit.redaction.redact",
        },
    },
    "filters": {
        "require_debug_false": {"()": "django.utils.log.RequireDebugFalse"},
        "without_traceback": {"()": "portal.logs.WithoutTraceback"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": PORTAL_LOG_FORMAT},
        # Django's error report to ADMINS (none by default), redacted first
        # (docs/redaction.md, "The canary test"); it replaces Django's own handler.
        "mail_admins": {
            "class": "portal.logs.RedactingAdminEmailHandler",
            "level": "ERROR",
            "filters": ["require_debug_false"],
            "redactor": "audit.redaction.redact",
        },
    },
    "loggers": {
        "django": {"handlers": ["mail_admins"], "level": "INFO"},
        # A bad Host is answered (400 problem+json); its stack says nothing more.
        "django.security.DisallowedHost": {"filters": ["without_traceback"]},
    },
    "root": {
        "handlers": ["console"],
        "level": os.environ.get("PORTAL_LOG_LEVEL", "INFO"),
    },
}

if PRODUCTION:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = _env_bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
    # Probes and scrapers speak plain HTTP to the process itself.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"
