"""Django settings, all from the environment.

Unset variables give the embedded default: SQLite under ``var/``, Celery tasks run in-process,
DEBUG on, a development secret key. A deployment sets ``DATABASE_URL``, ``REDIS_URL``,
``SECRET_KEY``, ``DEBUG=0`` and ``ALLOWED_HOSTS``.
"""

import ipaddress
from datetime import timedelta
from pathlib import Path

import dj_database_url

from portal.env import envbool, envfloat, envint, envlist, envstr
from scheduler.domain import sharing_error

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(envstr("COSCHED_DATA_DIR", str(BASE_DIR / "var")))
# The built documentation site (`make docs`), served at /docs/.
DOCS_SITE_DIR = Path(envstr("COSCHED_DOCS_DIR", str(BASE_DIR / "var" / "docs-site")))

DEBUG = envbool("DEBUG", default=not envstr("SECRET_KEY"))
SECRET_KEY = envstr("SECRET_KEY") or "cosched-embedded-development-key-not-for-production-use"
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "axes",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "portal.core",
    "portal.api",
    "portal.front",
    "portal.ml",
    "portal.replay",
    "portal.teams",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.api.limits.ApiBodyLimitMiddleware",
    # A NUL character in a query parameter is a 400 naming it (portal.core.request_guards).
    "portal.core.request_guards.QueryTextMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A request whose database connection died: retried once (GET) or a 503 with Retry-After.
    "portal.core.request_guards.LostDatabaseMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

# Login lockout (django-axes): after AXES_FAILURE_LIMIT failed logins for one username from one
# address, that pair is locked out for AXES_COOLOFF_TIME. Only HTTP logins count (see
# portal.front.authentication.LockoutBackend); staff unlock with `manage.py axes_reset`.
AUTHENTICATION_BACKENDS = [
    "portal.front.authentication.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = envint("COSCHED_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=envint("COSCHED_LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

_default_db = f"sqlite:///{DATA_DIR / 'cosched.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(envstr("DATABASE_URL", _default_db), conn_max_age=60)}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # The embedded default writes from the web threads and the in-process loop: wait for the
    # lock instead of failing, and let readers go on while one thread writes. IMMEDIATE: a
    # transaction takes the write lock when it begins, so two writers queue on the timeout
    # instead of one failing at once when it upgrades from reading to writing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        }
    )
else:
    # A connection killed under us (a PostgreSQL restart, pg_terminate_backend) is noticed and
    # replaced at the next request instead of failing it.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if envstr("TEST_DB_NAME"):  # lets parallel test runs on one server use separate databases
    DATABASES["default"]["TEST"] = {"NAME": envstr("TEST_DB_NAME")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's full set: not too similar to the username/e-mail, at least 8 characters, not one of
# 20,000 common passwords, not all digits.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(envstr("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# Development (DEBUG, the embedded default and the tests): WhiteNoise serves straight from the
# finders (static/ and the apps) and looks at STATIC_ROOT per request, so no collectstatic is
# needed. A deployment (DEBUG off) serves only the collected STATIC_ROOT, and WhiteNoise's
# "No directory at" warning then means collectstatic was not run.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "jobs"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.front.authentication.ApiTokenAuthentication",  # named, hashed cos_ tokens
        "rest_framework.authentication.SessionAuthentication",
    ],
    # JSON nested deeper than portal.api.limits.MAX_BODY_DEPTH is a 400, not a 500.
    "DEFAULT_PARSER_CLASSES": [
        "portal.api.limits.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "portal.api.limits.exception_handler",
    # Per user (a session or any of its tokens) and per token; anonymous callers per address.
    # Atomic counters (portal.api.throttles): the limits hold under concurrent clients.
    "DEFAULT_THROTTLE_CLASSES": [
        "portal.api.throttles.AnonThrottle",
        "portal.api.throttles.UserThrottle",
        "portal.api.throttles.TokenRateThrottle",
    ],
    # X-Forwarded-For counts for the anonymous limit's client address only behind this many
    # trusted proxies (0: ignored, so no client can choose its own identity per request).
    "NUM_PROXIES": envint("COSCHED_TRUSTED_PROXIES", 0),
    "DEFAULT_THROTTLE_RATES": {
        "anon": envstr("COSCHED_THROTTLE_ANON", "60/min"),
        "user": envstr("COSCHED_THROTTLE_USER", "2400/min"),
        "token": envstr("COSCHED_THROTTLE_TOKEN", "1200/min"),
        # The training SDK's endpoints, per running attempt (portal.core.training_views)
        "job": envstr("COSCHED_THROTTLE_JOB", "1200/min"),
    },
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Cosched API",
    "DESCRIPTION": "Job submission, profiles and cluster state for Cosched.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI / Redoc assets come from drf-spectacular-sidecar: served by us, no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Every status each operation answers, NUL-free text, JSON bodies (portal.api.schema).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api.schema.document_every_status",
    ],
    "ENUM_NAME_OVERRIDES": {
        "JobKindEnum": "portal.core.models.JOB_KINDS",
        "NodeKindEnum": "portal.core.models.Node.Kind",
        "NodeStatusEnum": "portal.core.models.Node.Status",
        "ProfileStatusEnum": "portal.core.models.ApplicationProfile.Status",
        "ProfileSourceEnum": "portal.core.models.ApplicationProfile.Source",
    },
}

# Celery: without REDIS_URL, tasks run in-process (embedded default).
REDIS_URL = envstr("REDIS_URL")
# The cache holds the API's rate-limit counters: in Redis when there is one, so every web
# worker counts together; in process memory for the embedded default.


def redis_cache(url: str) -> dict:
    """The cache of a deployment with Redis at ``url``."""
    return {
        # Django's Redis cache, but reads miss and writes are dropped while Redis is down:
        # the API must keep working then (docs/reliability.md).
        "BACKEND": "portal.core.cache.ResilientRedisCache",
        "LOCATION": url,
        "KEY_PREFIX": "cosched-cache",
        # JSON, never pickle: whoever writes into Redis must not run code in the portal
        # (docs/security.md); a value that is not our JSON reads as a miss.
        "OPTIONS": {
            "socket_connect_timeout": 1,
            "socket_timeout": 2,
            "serializer": "portal.core.cache.JSONSerializer",
        },
    }


if REDIS_URL:
    CACHES = {"default": redis_cache(REDIS_URL)}
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
# Every message is signed JSON (portal.core.signed_messages): a worker accepts nothing else,
# so a task pushed into Redis by anyone but the portal is dropped, and pickle is never read.
# Protocol 1 puts the task's name inside the signed body.
CELERY_SIGNING_KEY = envstr("COSCHED_CELERY_SIGNING_KEY")
CELERY_TASK_PROTOCOL = 1
CELERY_TASK_SERIALIZER = "cosched-signed-json"
CELERY_RESULT_SERIALIZER = "cosched-signed-json"
CELERY_EVENT_SERIALIZER = "cosched-signed-json"
CELERY_ACCEPT_CONTENT = ["application/x-cosched-signed+json"]
CELERY_RESULT_ACCEPT_CONTENT = ["application/x-cosched-signed+json"]
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

CELERY_TASK_DEFAULT_QUEUE = "scheduler"
COSCHED = {
    "METRICS_RETENTION_DAYS": envint("COSCHED_METRICS_RETENTION_DAYS", 14),
    # Jobs' full logs (portal.core.joblogs) are kept this long after the job ended.
    "LOG_RETENTION_DAYS": envint("COSCHED_LOG_RETENTION_DAYS", 30),
    "IDEMPOTENCY_TTL_S": envint("COSCHED_IDEMPOTENCY_TTL_S", 24 * 3600),
    # Larger API request bodies get a JSON 413 (portal.api.limits).
    "API_MAX_BODY_BYTES": envint("COSCHED_API_MAX_BODY_BYTES", 4 * 1024 * 1024),
    # API tokens expire this many days after creation (0: never).
    "TOKEN_EXPIRY_DAYS": envint("COSCHED_TOKEN_EXPIRY_DAYS", 0),
    # Node leases (docs/reliability.md): one agent sync keeps a node's lease LEASE_S seconds;
    # its runners stop its jobs when it runs out; the portal starts them elsewhere only
    # LEASE_MARGIN_S after that. Agents sync every SYNC_INTERVAL_S (and when nudged).
    "LEASE_S": envfloat("COSCHED_LEASE_S", 20.0),
    "LEASE_MARGIN_S": envfloat("COSCHED_LEASE_MARGIN_S", 10.0),
    "SYNC_INTERVAL_S": envfloat("COSCHED_SYNC_INTERVAL_S", 1.0),
    "RECONCILE_EVERY_S": envfloat("COSCHED_RECONCILE_EVERY_S", 5.0),
    "CYCLE_EVERY_S": envfloat("COSCHED_CYCLE_EVERY_S", 10.0),
    # SIGTERM, then SIGKILL this many seconds later, when a node stops a job that was preempted,
    # requeued or cancelled, or that ran past its time limit: the job's time to checkpoint.
    "STOP_GRACE_S": envfloat("COSCHED_STOP_GRACE_S", 10.0),
    # A job's checkpoint directory (COSCHED_CHECKPOINT_DIR) is deleted by the nodes this many
    # seconds after the job ended (docs/preemption.md); a negative value keeps them for ever.
    "CHECKPOINT_KEEP_S": envfloat("COSCHED_CHECKPOINT_KEEP_S", 7 * 24 * 3600.0),
    # A job whose process died of GPU out-of-memory on a GPU it shared is requeued (kept away
    # from its co-runners' types) up to this many times, then fails (portal.core.oom).
    "OOM_REQUEUES": envint("COSCHED_OOM_REQUEUES", 3),
    # Prometheus /metrics (docs/metrics.md): a scrape passes with this bearer token, or from an
    # address in one of these networks (comma-separated addresses or CIDRs; loopback default).
    "METRICS_TOKEN": envstr("COSCHED_METRICS_TOKEN"),
    "METRICS_ALLOWED_NETWORKS": envlist("COSCHED_METRICS_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128"),
    # Fair share (docs/projects.md): past usage counts half after this many seconds; CPU-only
    # jobs count their core-seconds times FAIRSHARE_CPU_WEIGHT (GPU-seconds count 1).
    "FAIRSHARE_HALF_LIFE_S": envfloat("COSCHED_FAIRSHARE_HALF_LIFE_S", 7 * 24 * 3600.0),
    "FAIRSHARE_CPU_WEIGHT": envfloat("COSCHED_FAIRSHARE_CPU_WEIGHT", 0.0),
    # Container jobs (docs/containers.md): the images users may run, as comma-separated shell
    # patterns ("docker.io/library/*,localhost/*"); empty: any image.
    "CONTAINER_IMAGES": envlist("COSCHED_CONTAINER_IMAGES", ""),
    # Measured profiles (docs/profiles.md, "Measured on the cluster"): a job's progress is cut
    # into windows of at least OBSERVATION_WINDOW_S seconds (scheduler.knowledge observations);
    # each scheduling cycle learns from the newest OBSERVATIONS_PER_TYPE of every job type it
    # sees. MEASURED_PROFILES: "draft" (observations update a draft profile version for an
    # administrator to approve), "approve" (the draft is approved at once) or "off".
    "OBSERVATION_WINDOW_S": envfloat("COSCHED_OBSERVATION_WINDOW_S", 10.0),
    "OBSERVATIONS_PER_TYPE": envint("COSCHED_OBSERVATIONS_PER_TYPE", 200),
    "MEASURED_PROFILES": envstr("COSCHED_MEASURED_PROFILES") or "draft",
    # A job that does not say whether its GPUs may be shared gets this (docs/jobs.md): never,
    # allowed, mps, time_slicing or a MIG profile name.
    "DEFAULT_SHARING": envstr("COSCHED_DEFAULT_SHARING", "never"),
}
if COSCHED["MEASURED_PROFILES"] not in ("draft", "approve", "off"):
    raise ValueError("COSCHED_MEASURED_PROFILES must be draft, approve or off")
if _sharing_problem := sharing_error(COSCHED["DEFAULT_SHARING"]):
    raise ValueError(f"COSCHED_DEFAULT_SHARING: {_sharing_problem}")
for _net in COSCHED["METRICS_ALLOWED_NETWORKS"]:  # a typo fails at start-up, not per scrape
    try:
        ipaddress.ip_network(_net, strict=False)
    except ValueError as _exc:
        raise ValueError(f"COSCHED_METRICS_ALLOWED_NETWORKS: {_exc}") from None
if COSCHED["LEASE_S"] <= 2 * COSCHED["SYNC_INTERVAL_S"] or COSCHED["LEASE_MARGIN_S"] <= 0:
    raise ValueError(
        "COSCHED_LEASE_S must exceed two sync intervals (COSCHED_SYNC_INTERVAL_S) and "
        "COSCHED_LEASE_MARGIN_S must be positive"
    )
DATA_UPLOAD_MAX_MEMORY_SIZE = COSCHED["API_MAX_BODY_BYTES"]

# Periodic work (``celery -A portal beat``): a cycle also runs on every submission, job end and
# node change (through the outbox); the beat catches anything those missed, finds lost nodes
# and retries outbox messages the broker refused.
CELERY_BEAT_SCHEDULE = {
    "schedule-cycle": {"task": "cosched.schedule_cycle", "schedule": COSCHED["CYCLE_EVERY_S"]},
    "reconcile": {"task": "cosched.reconcile", "schedule": COSCHED["RECONCILE_EVERY_S"]},
    "outbox-relay": {"task": "cosched.outbox_relay", "schedule": 2.0},
    "cluster-metrics": {"task": "cosched.cluster_metrics", "schedule": 5.0},
    "metrics-retention": {"task": "cosched.metrics_retention", "schedule": 3600.0},
    # Co-scheML online learning (portal.ml): live co-runs -> samples; retrain proposals.
    "ml-collect-coruns": {"task": "cosched.ml_collect_coruns", "schedule": 300.0},
    "ml-retrain": {"task": "cosched.ml_retrain", "schedule": 6 * 3600.0},
}

if not DEBUG:
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = envlist("SECURE_REDIRECT_EXEMPT")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    # django-axes logs every login at INFO; lockouts are warnings.
    "loggers": {"axes": {"level": "WARNING"}},
}
