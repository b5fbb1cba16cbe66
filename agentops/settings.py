"""Settings: every environment read of agentops lives here, with defaults that run the demo.

Production differs from the demo by environment variables only:
DATABASE_URL (PostgreSQL), CELERY_BROKER_URL (Redis), DJANGO_SECRET_KEY, DJANGO_DEBUG,
DJANGO_ALLOWED_HOSTS and the AGENTOPS_* names below, each of which carries its unit.
"""
import importlib.metadata
import importlib.util
import json
import os
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from agentops.config import (
    agent_template_dirs,
    beat_sweep,
    env_bool,
    env_choice,
    env_concurrency_keys,
    env_float,
    env_int,
    env_label_keys,
    env_names,
    env_rate_limits,
    env_str,
    webhook_rotation_checked,
    webhook_secrets,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("AGENTOPS_VAR_DIR", BASE_DIR / "var"))


SECRET_KEY = env_str("DJANGO_SECRET_KEY", "agentops-demo-insecure-key-change-me")
# Off unless asked for: a debug page shows settings and tracebacks to whoever reaches the server.
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",") if h]
# Served over HTTPS (directly or behind a proxy that sets X-Forwarded-Proto): secure cookies, HSTS
# and a redirect from http. `manage.py check --deploy` is clean with the settings docs/operators.md lists.
HTTPS = env_bool("DJANGO_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_PRELOAD = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("DJANGO_BEHIND_PROXY", False) else None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_fsm",
    "django_celery_beat",
    # django-ninja: the HTTP API; listed so /api/docs serves its Swagger UI from the app, not a CDN.
    "ninja",
    "workflows",
    # Features that have admin pages or join the kernel's changes (workflows.hooks) from ready().
    "workflows.features.access",
    "workflows.features.schedules",
    "workflows.features.webhooks",
    "workflows.features.notifications",
    # The project shell: its commands (demo, deploy_target) use the sandbox and the deploy target.
    "agentops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A request id on every request and log line; the one JSON error shape for all of /api.
    "workflows.api.middleware.ApiMiddleware",
    # The admin's CSS and scripts, served by the app itself whatever DJANGO_DEBUG says.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "agentops.urls"
WSGI_APPLICATION = "agentops.wsgi.application"

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

# SQLite (the demo default) needs IMMEDIATE transactions: a DEFERRED reader that upgrades
# to a writer gets SQLITE_BUSY at once whatever the timeout; WAL adds throughput.
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
}
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'agentops.sqlite3'}"),
        # Kept open across requests and Celery tasks (agentops/celery.py): a new PostgreSQL
        # connection is a new server process, a fifth of a short activity's time.
        conn_max_age=env_int("AGENTOPS_DB_CONN_MAX_AGE_SECONDS", 300),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-agentops.sqlite3")}
# A pool of at most this many PostgreSQL connections per process (psycopg_pool through Django),
# instead of one kept connection per thread: a threads-pool worker runs hundreds of activities
# at once, and each gives its connection back while it waits for a model or a tool
# (workflows/connections.py), so a few connections serve them all. 0: no pool. A thread that
# finds every connection taken waits up to AGENTOPS_DB_POOL_TIMEOUT_SECONDS, then its task fails
# and is retried like any database error.
AGENTOPS_DB_POOL_SIZE = env_int("AGENTOPS_DB_POOL_SIZE", 0)
AGENTOPS_DB_POOL_TIMEOUT_SECONDS = env_float("AGENTOPS_DB_POOL_TIMEOUT_SECONDS", 30.0)
ON_POSTGRESQL = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if AGENTOPS_DB_POOL_SIZE:
    if not ON_POSTGRESQL or AGENTOPS_DB_POOL_SIZE < 1:
        raise ImproperlyConfigured(f"AGENTOPS_DB_POOL_SIZE={AGENTOPS_DB_POOL_SIZE} needs PostgreSQL and a size of "
                                   "at least 1 (0 turns the pool off).")
    # The pool keeps the connections open; Django refuses CONN_MAX_AGE beside it. Django's
    # backend, but its pool checks only a connection that sat idle (agentops/db/postgresql/base.py).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["ENGINE"] = "agentops.db.postgresql"
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1, "max_size": AGENTOPS_DB_POOL_SIZE, "timeout": AGENTOPS_DB_POOL_TIMEOUT_SECONDS,
    }

# PostgreSQL: parameters bound by the server, and a statement run this many times on a connection
# prepared there (psycopg's prepare_threshold): planning was 40 % of the database's time per model
# call, every statement planned anew (bench/README.md, "CPU per call"). 0: parameters bound in
# the client and nothing prepared, for a PgBouncer older than 1.21 in transaction pooling mode.
AGENTOPS_DB_PREPARE_THRESHOLD = env_int("AGENTOPS_DB_PREPARE_THRESHOLD", 2, at_least=0,
                                        what="0 (off) or a count of runs")
if ON_POSTGRESQL and AGENTOPS_DB_PREPARE_THRESHOLD:
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=AGENTOPS_DB_PREPARE_THRESHOLD)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Dates and times on admin pages: one format with the zone (agentops/formats/en/formats.py).
FORMAT_MODULE_PATH = ["agentops.formats"]
STATIC_URL = "static/"
# WhiteNoise finds the files where the apps keep them: no collectstatic step to forget (and no
# STATIC_ROOT to keep in step with the code).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Every line carries the request id of its request (workflows/logs.py); AGENTOPS_LOG_FORMAT=json writes
# one JSON object a line, extras as keys. django.request is configured too: with DEBUG off Django logs a
# 5xx of a page (the admin's) with its traceback there, and nowhere when no handler is set.
AGENTOPS_LOG_FORMAT = env_choice("AGENTOPS_LOG_FORMAT", "plain", ("plain", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "workflows.logs.RequestIdFilter"}},
    "formatters": {
        "plain": {"()": "workflows.logs.PlainFormatter",
                  "format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "workflows.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": AGENTOPS_LOG_FORMAT,
                             "filters": ["request_id"]}},
    "loggers": {
        "agentops": {"handlers": ["console"], "level": env_str("AGENTOPS_LOG_LEVEL", "WARNING")},
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
# The web tier (gunicorn, agentops/gunicorn.py): worker processes, and threads per process (gthread).
# Each thread keeps one database connection (CONN_MAX_AGE), so a web host holds at most
# workers × threads of them; a live stream (server-sent events) holds its thread while it is open.
AGENTOPS_WEB_WORKERS = env_int("AGENTOPS_WEB_WORKERS", 2)
AGENTOPS_WEB_THREADS = env_int("AGENTOPS_WEB_THREADS", 16)
AGENTOPS_WEB_BIND = env_str("AGENTOPS_WEB_BIND", "0.0.0.0:8000")
AGENTOPS_WEB_TIMEOUT_SECONDS = env_int("AGENTOPS_WEB_TIMEOUT_SECONDS", 60)
# On SIGTERM (a deploy), how long gunicorn lets requests in flight finish; open event streams are cut
# then, and their clients reconnect with Last-Event-ID (docs/live.md).
AGENTOPS_WEB_GRACEFUL_SECONDS = env_int("AGENTOPS_WEB_GRACEFUL_SECONDS", 30)
if AGENTOPS_WEB_WORKERS < 1 or AGENTOPS_WEB_THREADS < 1:
    raise ImproperlyConfigured("AGENTOPS_WEB_WORKERS and AGENTOPS_WEB_THREADS must be at least 1.")

# --- Celery: a broker message is a doorbell; the database holds the truth. ---
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
# Redis only: how long a task's message may stay unacknowledged before Redis delivers it again.
AGENTOPS_VISIBILITY_TIMEOUT_SECONDS: int | None = None
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    # kombu's transport with atomic publishing: its own lets a worker read a half-written message
    # and stop (agentops/filesystem_broker.py).
    CELERY_BROKER_TRANSPORT = "agentops.filesystem_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        # The transport sleeps this long whenever the queue looks empty; at its 1 s default
        # the worker takes about two messages a second, fewer than beat alone sends.
        "polling_interval": 0.05,
    }
else:
    # The visibility timeout must exceed the longest activity lease, else Redis
    # redelivers running tasks; our leases make redelivery harmless, not free.
    AGENTOPS_VISIBILITY_TIMEOUT_SECONDS = env_int("AGENTOPS_VISIBILITY_TIMEOUT_SECONDS", 3600)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": AGENTOPS_VISIBILITY_TIMEOUT_SECONDS,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "health_check_interval": 25,
    }
# Two queues. The default one carries short work (advances, beat sweeps, most activities) for
# prefork workers, one process per core; AGENTOPS_IO_QUEUE carries the activities declared
# ``io_bound`` (those that wait for a model or a tool), for a threads-pool worker that keeps
# hundreds of them in flight (README, "Workers for model-heavy agents"). A worker started without
# -Q consumes both.
CELERY_TASK_DEFAULT_QUEUE = "celery"
AGENTOPS_IO_QUEUE = env_str("AGENTOPS_IO_QUEUE", "agentops.io")
# Each queue bound under its own name: without a routing key Celery binds both under "celery",
# and Redis's direct exchange would then deliver every message to both queues.
CELERY_TASK_QUEUES = [Queue(name, routing_key=name) for name in (CELERY_TASK_DEFAULT_QUEUE, AGENTOPS_IO_QUEUE)]
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's task events (received, started, succeeded; and sent, from publishers) are for Flower,
# which turns them on in the workers it watches (its enable_events, on by default). Always on,
# they cost each threads worker's consumer a publish per event: about a tenth of its CPU with
# hundreds of model calls in flight (bench/HISTORY.md, "Task events are Flower's to turn on").
AGENTOPS_CELERY_TASK_EVENTS = env_bool("AGENTOPS_CELERY_TASK_EVENTS", False)
CELERY_WORKER_SEND_TASK_EVENTS = AGENTOPS_CELERY_TASK_EVENTS
CELERY_TASK_SEND_SENT_EVENT = AGENTOPS_CELERY_TASK_EVENTS
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"

# --- agentops: the durable plane's clocks and limits. ---
# Whole seconds, at least 1: django-celery-beat's DatabaseScheduler stores the interval in an
# integer column, where 0.5 became 0 and beat sent the sweeps in a busy loop (~36 a second).
AGENTOPS_BEAT_INTERVAL_SECONDS = env_int("AGENTOPS_BEAT_INTERVAL_SECONDS", 2, at_least=1)
AGENTOPS_LEASE_SECONDS = env_int("AGENTOPS_LEASE_SECONDS", 60)
# Where durable time (leases, timers, retry windows, deadlines) comes from: "database" is the
# PostgreSQL server's clock, read every AGENTOPS_CLOCK_RESYNC_SECONDS and advanced in between on
# the process's monotonic clock, so hosts' wall clocks may be off; "python" is each process's
# clock. SQLite always uses the Python clock (one host). See workflows/clock.py.
AGENTOPS_CLOCK = env_choice("AGENTOPS_CLOCK", "database", ("database", "python"))
AGENTOPS_CLOCK_RESYNC_SECONDS = env_float("AGENTOPS_CLOCK_RESYNC_SECONDS", 60.0)
AGENTOPS_REDISPATCH_AFTER_SECONDS = env_int("AGENTOPS_REDISPATCH_AFTER_SECONDS", 30)
# How long one activity task may go on running its workflow's next activities itself, each
# claimed in the transaction that records the result before it (no broker round trip);
# 0 sends every activity through the broker.
AGENTOPS_ACTIVITY_CHAIN_SECONDS = env_float("AGENTOPS_ACTIVITY_CHAIN_SECONDS", 1.0)
# The same for the ``io_bound`` activities a threads-pool worker runs: each of its hundreds of
# threads would otherwise only wait for the next message, so a task follows its workflow's model
# calls for this long (a prefork worker keeps AGENTOPS_ACTIVITY_CHAIN_SECONDS: a process that
# follows one workflow leaves the others queued). Under the broker's visibility timeout, which
# would deliver the task's message again.
AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS = env_float("AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS", 600.0)
if AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS < 0 or AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS >= (
        AGENTOPS_VISIBILITY_TIMEOUT_SECONDS or float("inf")):
    raise ImproperlyConfigured(f"AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS={AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS:g} must be 0 "
                               "or more and under the broker's visibility timeout "
                               f"(AGENTOPS_VISIBILITY_TIMEOUT_SECONDS={AGENTOPS_VISIBILITY_TIMEOUT_SECONDS}).")
# How many threads of a threads-pool worker run the engine's bookkeeping at once (claims, notes,
# checkpoints, a model call's reservation and charge, results); the others wait for a turn in
# line instead of handing Python's interpreter lock around at every statement. 0: no limit.
# The activity functions, the models' answers and every other wait run outside it
# (workflows/lane.py; bench/HISTORY.md, "CPU per call: the engine lane").
AGENTOPS_IO_ENGINE_THREADS = env_int("AGENTOPS_IO_ENGINE_THREADS", 4, at_least=0, what="0 (no limit) or more")
# A worker's cyclic garbage collector: at start, what the worker imported and built is frozen
# out of its passes (``gc.freeze``: it lives as long as the process), and the youngest objects
# are collected every this many allocations instead of Python's 700. A threads worker with
# hundreds of calls in flight spent a tenth of its CPU in the collector, mostly walking the same
# long-lived objects again (bench/HISTORY.md, "CPU per call: the garbage collector"). 0: Python's defaults.
AGENTOPS_WORKER_GC_THRESHOLD = env_int("AGENTOPS_WORKER_GC_THRESHOLD", 10_000, at_least=0,
                                       what="0 (Python's defaults) or more")
# How often a long activity that checkpoints (the autonomous agent's tasks) saves its working
# state; a retried attempt resumes from the last save instead of starting over. 0: after every
# step (every turn of a task), so no tool call is redone after a crash; a turn's model call takes
# seconds, its checkpoint one UPDATE.
AGENTOPS_CHECKPOINT_SECONDS = env_float("AGENTOPS_CHECKPOINT_SECONDS", 0.0)
# State that does not grow (workflows/statestore.py): a string of the state or of an activity's
# result this long or longer is stored once (a blob row) and referenced; an object element of a
# list whose JSON is this many bytes or more is stored once too (a step that changes one of 500
# features writes that one). Lowering them only moves more values out of the row.
AGENTOPS_STATE_BLOB_MIN_CHARS = env_int("AGENTOPS_STATE_BLOB_MIN_CHARS", 1024)
AGENTOPS_STATE_ITEM_LIST_MIN_BYTES = env_int("AGENTOPS_STATE_ITEM_LIST_MIN_BYTES", 16384)
if AGENTOPS_STATE_BLOB_MIN_CHARS < 64 or AGENTOPS_STATE_ITEM_LIST_MIN_BYTES < 1024:
    raise ImproperlyConfigured(f"AGENTOPS_STATE_BLOB_MIN_CHARS={AGENTOPS_STATE_BLOB_MIN_CHARS} must be 64 or more and "
                               f"AGENTOPS_STATE_ITEM_LIST_MIN_BYTES={AGENTOPS_STATE_ITEM_LIST_MIN_BYTES} 1024 or more "
                               "(a reference is about 60 bytes).")
# The lease of model-calling activities. A background thread heartbeats every third of it while
# the activity waits for the provider's answer (or runs a tool), so a slow answer keeps it; a
# dead worker's attempt is taken over this many seconds (plus a beat tick) after its last beat.
AGENTOPS_MODEL_CALL_LEASE_SECONDS = env_int("AGENTOPS_MODEL_CALL_LEASE_SECONDS", 20, at_least=3,
                                            what="at least 3 (it is heartbeated every third of it)")
AGENTOPS_ALLOW_SELF_APPROVAL = env_bool("AGENTOPS_ALLOW_SELF_APPROVAL", False)
AGENTOPS_SWEEP_BATCH_SIZE = env_int("AGENTOPS_SWEEP_BATCH_SIZE", 200)
AGENTOPS_DEPLOY_TARGET_URL = env_str("AGENTOPS_DEPLOY_TARGET_URL", "http://127.0.0.1:8765")
AGENTOPS_HTTP_TIMEOUT_SECONDS = env_float("AGENTOPS_HTTP_TIMEOUT_SECONDS", 10.0)
AGENTOPS_TEST_TIMEOUT_SECONDS = env_int("AGENTOPS_TEST_TIMEOUT_SECONDS", 300)
# Claude when an API key is set, else the offline scripted provider. The key is a secret: never log it.
ANTHROPIC_API_KEY = env_str("ANTHROPIC_API_KEY", "")
ANTHROPIC_BASE_URL = env_str("ANTHROPIC_BASE_URL", "") or "https://api.anthropic.com"
AGENTOPS_MODEL_PROVIDER = env_str("AGENTOPS_MODEL_PROVIDER", "anthropic" if ANTHROPIC_API_KEY else "scripted")
AGENTOPS_MODEL = env_str("AGENTOPS_MODEL", "claude-sonnet-5-5")
# The providers AGENTOPS_MODEL_PROVIDER may name: each a class with ``from_settings(model=…)``
# implementing workflows.provider.ModelProvider (the kernel imports the one chosen, when it is).
AGENTOPS_MODEL_PROVIDERS = {
    "anthropic": "agentops.providers.anthropic.AnthropicProvider",
    "scripted": "agentops.providers.scripted.ScriptedProvider",
}
# The SDK's own in-process retries (0–2); 429/529 beyond them become stored retry windows.
AGENTOPS_ANTHROPIC_MAX_RETRIES = env_int("AGENTOPS_ANTHROPIC_MAX_RETRIES", 1)
if not 0 <= AGENTOPS_ANTHROPIC_MAX_RETRIES <= 2:
    raise ImproperlyConfigured(f"AGENTOPS_ANTHROPIC_MAX_RETRIES={AGENTOPS_ANTHROPIC_MAX_RETRIES} must be 0, 1 or 2.")
# Rate limits (429) and overloads (529) give their attempt back and are retried after the
# server's retry-after, or else after a jittered exponential backoff from this to the cap.
# A workflow launched with --fallback-model moves its calls there after this many throttled
# attempts of one activity in a row (sustained 429/529), recorded as a release change.
AGENTOPS_FALLBACK_AFTER_THROTTLES = env_int("AGENTOPS_FALLBACK_AFTER_THROTTLES", 3)
AGENTOPS_THROTTLE_BACKOFF_SECONDS = env_float("AGENTOPS_THROTTLE_BACKOFF_SECONDS", 5.0)
AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS = env_float("AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS", 300.0)
# Reserve each request's cost from the API's own token count (a free endpoint) rather than
# from the prompt's length; off, or when the count fails, the length-based estimate is used.
AGENTOPS_ANTHROPIC_COUNT_TOKENS = env_bool("AGENTOPS_ANTHROPIC_COUNT_TOKENS", True)
AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS = env_float("AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS", 120.0)
if not AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS > 0:
    raise ImproperlyConfigured(
        f"AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS={AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS} must be above 0.")
AGENTOPS_PROMPT_VERSION = env_str("AGENTOPS_PROMPT_VERSION", "prompts-2")  # 2: structured answers as forced tool calls
# Part of the behavioral release: bump a version when a tool's contract with the model changes
# (workspace-tools 2: the harness's ranged reads, edits, services and proposals).
AGENTOPS_TOOL_VERSIONS = {"git": "1", "test-runner": "1", "deploy-target": "1", "workspace-tools": "2"}


# Shared rate limits, fair shares and priorities for model calls (docs/operators.md, "Rate limits").
# The limiter's Redis: every worker of every host must use the same one; by default the broker's
# when it is Redis, else none (the limiter is off: calls go as they come, 429s back off as before).
_BROKER_IS_REDIS = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
AGENTOPS_RATE_LIMIT_REDIS_URL = env_str("AGENTOPS_RATE_LIMIT_REDIS_URL", CELERY_BROKER_URL if _BROKER_IS_REDIS else "")
# Per-minute limits by "<provider>:<model>" (or "<provider>:*"): requests_per_minute,
# input_tokens_per_minute, output_tokens_per_minute. The limits the API's answers report
# (anthropic-ratelimit-* headers) are learned too, times the headroom; the lower of the two holds.
AGENTOPS_RATE_LIMITS = env_rate_limits("AGENTOPS_RATE_LIMITS")
AGENTOPS_RATE_LIMIT_HEADROOM = env_float("AGENTOPS_RATE_LIMIT_HEADROOM", 0.95)
if not 0 < AGENTOPS_RATE_LIMIT_HEADROOM <= 1:
    raise ImproperlyConfigured(f"AGENTOPS_RATE_LIMIT_HEADROOM={AGENTOPS_RATE_LIMIT_HEADROOM} must be in (0, 1].")
# The most a fleet sends at once: each limit's bucket holds this many seconds of its rate (less
# when the provider's own bucket, learned from its answers' reset headers, holds less), so sends
# follow the provider's refill whatever interval it enforces its limit over.
AGENTOPS_RATE_LIMIT_BURST_SECONDS = env_float("AGENTOPS_RATE_LIMIT_BURST_SECONDS", 3.0, at_least=0.1)
if AGENTOPS_RATE_LIMIT_BURST_SECONDS > 60:
    raise ImproperlyConfigured(f"AGENTOPS_RATE_LIMIT_BURST_SECONDS={AGENTOPS_RATE_LIMIT_BURST_SECONDS:g} must be at "
                               "most 60 (a minute's limit).")
# The launch label that names a workflow's tenant for fair shares and concurrency keys (e.g.
# "team": --label team=infra is the tenant "team=infra"). Empty: the launcher ("user:<id>", or
# "system"); see workflows/tenancy.py.
AGENTOPS_TENANT_LABEL = env_str("AGENTOPS_TENANT_LABEL", "")
if AGENTOPS_TENANT_LABEL and not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", AGENTOPS_TENANT_LABEL):
    raise ImproperlyConfigured(f"AGENTOPS_TENANT_LABEL={AGENTOPS_TENANT_LABEL!r} is not a label key: 1-63 "
                               "lowercase letters, digits, _ and -, starting with a letter.")


# Concurrent model requests by key: "tenant:<tenant>" and "kind:<kind>", "tenant:*" and "kind:*"
# for every tenant or kind without a key of its own. A tenant as AGENTOPS_TENANT_LABEL says.
AGENTOPS_MODEL_CALL_CONCURRENCY = env_concurrency_keys("AGENTOPS_MODEL_CALL_CONCURRENCY")
# Activity attempts running at once by the same keys (every activity: model calls, tools,
# commands, deploys; compensations are never held back). An attempt over a cap waits, stored,
# for a slot (workflows/services/slots.py; docs/operators.md, "Concurrency keys").
AGENTOPS_ACTIVITY_CONCURRENCY = env_concurrency_keys("AGENTOPS_ACTIVITY_CONCURRENCY")
# When the limiter's Redis cannot be reached: "open" sends the call unlimited (429s back off as
# before), "closed" does not send it (a throttled attempt: retried later, its attempt given back).
AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN = env_choice("AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN", "open", ("open", "closed"))
# The longest a call waits for its turn in a worker; past it the attempt is throttled (a stored
# retry window, its attempt given back) and frees its thread.
AGENTOPS_RATE_LIMIT_MAX_WAIT_SECONDS = env_float("AGENTOPS_RATE_LIMIT_MAX_WAIT_SECONDS", 300.0)
# A waiting call looks again at least this often even unwoken; a waiter silent for 4 times it is dropped.
AGENTOPS_RATE_LIMIT_POLL_SECONDS = env_float("AGENTOPS_RATE_LIMIT_POLL_SECONDS", 5.0)
# A request's concurrency slot expires after this (a dead worker's slots come back then).
AGENTOPS_RATE_LIMIT_SLOT_SECONDS = env_float("AGENTOPS_RATE_LIMIT_SLOT_SECONDS", 300.0)
# How long a limit learned from an answer holds without another answer confirming it.
AGENTOPS_RATE_LIMIT_LEARN_TTL_SECONDS = env_int("AGENTOPS_RATE_LIMIT_LEARN_TTL_SECONDS", 3600)
AGENTOPS_WORKSPACE_DIR = Path(env_str("AGENTOPS_WORKSPACE_DIR", str(VAR_DIR / "workspaces")))
# Every command run for a user (the autonomous agent's run_command, the release agent's tests) is
# sandboxed (agentops/sandbox/): scrubbed environment, own process group, redacted output, and
# bubblewrap (read-only system, no network, own PID namespace): "auto" uses it where it works,
# "bwrap" refuses to run a command without it, "none" never uses it.
AGENTOPS_SANDBOX = env_choice("AGENTOPS_SANDBOX", "auto", ("auto", "bwrap", "none"))
# After a command's timeout its process group gets SIGTERM, then SIGKILL this much later.
AGENTOPS_SANDBOX_GRACE_SECONDS = env_float("AGENTOPS_SANDBOX_GRACE_SECONDS", 5.0)
# What one sandboxed command (and everything it starts) may use (docs/security.md, "Limits"):
# memory and processes through a control group of its own where the worker may create one
# (AGENTOPS_SANDBOX_CGROUP: "auto" finds a writable cgroup v1 hierarchy, a path names a
# delegated cgroup v2 directory, "none" uses none: then memory is an address-space limit per
# process and processes are not limited), the size of one file it writes, and its private /tmp.
AGENTOPS_SANDBOX_MEMORY_MB = env_int("AGENTOPS_SANDBOX_MEMORY_MB", 2048)
AGENTOPS_SANDBOX_MAX_PROCESSES = env_int("AGENTOPS_SANDBOX_MAX_PROCESSES", 256)
AGENTOPS_SANDBOX_MAX_FILE_MB = env_int("AGENTOPS_SANDBOX_MAX_FILE_MB", 512)
AGENTOPS_SANDBOX_TMP_MB = env_int("AGENTOPS_SANDBOX_TMP_MB", 512)
AGENTOPS_SANDBOX_CGROUP = env_str("AGENTOPS_SANDBOX_CGROUP", "auto")
# A workspace's whole disk use (its .git included): a command that takes it past this is stopped,
# an engine write tool that would is refused (docs/security.md, "Limits").
AGENTOPS_SANDBOX_WORKSPACE_MB = env_int("AGENTOPS_SANDBOX_WORKSPACE_MB", 4096, at_least=1)
# The harness kind (docs/harness.md): how many of a feature list's checks run at once on a worker,
# and the ceiling of the hard timeout of one run_command on this worker (a workflow's
# command_timeout_seconds applies under it; the command and its children are killed).
AGENTOPS_HARNESS_CHECK_PARALLELISM = env_int("AGENTOPS_HARNESS_CHECK_PARALLELISM", 4)
AGENTOPS_HARNESS_COMMAND_TIMEOUT_SECONDS = env_int("AGENTOPS_HARNESS_COMMAND_TIMEOUT_SECONDS", 120)
# The lease of a harness session or check run between heartbeats: every blocking step (a model
# call, a command, a check) heartbeats it, so a dead worker's session is taken over this soon.
AGENTOPS_HARNESS_SESSION_LEASE_SECONDS = env_int("AGENTOPS_HARNESS_SESSION_LEASE_SECONDS", 45)
# The scripted provider's harness sessions (a JSON schedule as in agentops/agents/harness/demo/);
# empty: the todo demo's.
AGENTOPS_HARNESS_SCHEDULE_FILE = env_str("AGENTOPS_HARNESS_SCHEDULE_FILE", "")
# The packages that hold agent kinds (definition, activities, optional admin templates), imported at
# start-up by web, workers and beat alike. Add a kind of your own with one more entry, or install
# its package: every module of the "agentops.kinds" entry point group is added (docs/authoring.md).
AGENT_KINDS_ENTRY_POINTS = "agentops.kinds"
AGENTOPS_AGENT_MODULES = list(dict.fromkeys([
    *(m.strip() for m in env_str("AGENTOPS_AGENT_MODULES",
                                 "agentops.agents.release,agentops.agents.autonomous,agentops.agents.harness,"
                                 "agentops.agents.reviewer")
      .split(",") if m.strip()),
    *(ep.module for ep in importlib.metadata.entry_points(group=AGENT_KINDS_ENTRY_POINTS)),
]))


TEMPLATES[0]["DIRS"] = agent_template_dirs(AGENTOPS_AGENT_MODULES)
# USD per million tokens; cache reads and writes have their own prices. Override the whole
# table with AGENTOPS_MODEL_PRICES_JSON (same shape). "default" prices unknown models.
_DEFAULT_PRICES = {
    "claude-opus-4-5": {"input": 5, "output": 25, "cache_read": 0.5, "cache_write": 6.25, "cache_write_1h": 10},
    "claude-sonnet-5-5": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75, "cache_write_1h": 6},
    "claude-sonnet-4-5": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75, "cache_write_1h": 6},
    "claude-haiku-4-5": {"input": 1, "output": 5, "cache_read": 0.1, "cache_write": 1.25, "cache_write_1h": 2},
    "default": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75, "cache_write_1h": 6},
}
try:
    AGENTOPS_MODEL_PRICES_USD_PER_MTOK = json.loads(os.environ.get("AGENTOPS_MODEL_PRICES_JSON") or "null") \
        or _DEFAULT_PRICES
except json.JSONDecodeError as exc:
    raise ImproperlyConfigured(f"AGENTOPS_MODEL_PRICES_JSON is not valid JSON: {exc}.") from None
AGENTOPS_STAGNATION_WINDOW_HOURS = env_float("AGENTOPS_STAGNATION_WINDOW_HOURS", 6.0)
AGENTOPS_SILENCE_HOURS = env_float("AGENTOPS_SILENCE_HOURS", 2.0)
# Fault points fire only in test runs that set this; production never does.
AGENTOPS_TESTING_FAULTS = env_str("AGENTOPS_TESTING_FAULTS", "")
AGENTOPS_FAULT_LOG = env_str("AGENTOPS_FAULT_LOG", str(VAR_DIR / "faults.log"))
# Flower's base URL as operators reach it (e.g. http://flower.internal:5555); when set, the admin
# links every activity attempt to its Celery task page there. Empty: no links.
AGENTOPS_FLOWER_URL = env_str("AGENTOPS_FLOWER_URL", "")

CELERY_BEAT_SCHEDULE = {
    # A sweep message that waited longer than a few intervals is stale; the next tick replaces it.
    name: beat_sweep(name, AGENTOPS_BEAT_INTERVAL_SECONDS, expires=max(10.0, 5 * AGENTOPS_BEAT_INTERVAL_SECONDS))
    for name in ("fire_timers", "redrive_activities", "reap_leases", "redrive_workflows", "enforce_deadlines",
                 "fire_schedules", "collect_children")
}
AGENTOPS_STAGNATION_CHECK_SECONDS = env_int("AGENTOPS_STAGNATION_CHECK_SECONDS", 60)
CELERY_BEAT_SCHEDULE["check_stagnation"] = beat_sweep("check_stagnation", AGENTOPS_STAGNATION_CHECK_SECONDS)

# Telling approvers that a decision waits (docs/operators.md, "Notifications"): email through
# Django's mail framework (console by default; EMAIL_* are Django's own settings) and, when set,
# a Slack-compatible incoming webhook. The webhook URL and the SMTP password are secrets.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are both true; set one of them (STARTTLS or TLS).")
# Django waits forever by default; a notification attempt must end within its lease.
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 10.0)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "agentops@localhost")
AGENTOPS_NOTIFY_WEBHOOK_URL = env_str("AGENTOPS_NOTIFY_WEBHOOK_URL", "")
# The site as approvers reach it; notifications link to <this>/admin/workflows/wait/approvals/#wait-<id>.
AGENTOPS_ADMIN_BASE_URL = env_str("AGENTOPS_ADMIN_BASE_URL", "http://127.0.0.1:8000")
# Remind the approvers of an approval wait this long before it expires (once); 0: no reminders.
AGENTOPS_APPROVAL_REMINDER_HOURS = env_float("AGENTOPS_APPROVAL_REMINDER_HOURS", 1.0)
AGENTOPS_APPROVAL_REMINDER_CHECK_SECONDS = env_int("AGENTOPS_APPROVAL_REMINDER_CHECK_SECONDS", 60)
CELERY_BEAT_SCHEDULE["remind_approvals"] = beat_sweep("remind_approvals", AGENTOPS_APPROVAL_REMINDER_CHECK_SECONDS)

# Retention (docs/operators.md, "Retention"): the checkpoints and events of workflows that
# completed, failed or were cancelled this many days ago are written to an archive file (JSON
# Lines, `agent export-history`'s format) in AGENTOPS_ARCHIVE_DIR, then deleted; the workflow row
# stays and says where its history went. 0 (the default) keeps every history in the database
# forever: deleting history is for an operator to decide. Fractions of a day are allowed.
AGENTOPS_RETENTION_DAYS = env_float("AGENTOPS_RETENTION_DAYS", 0.0, at_least=0, what="0 (keep forever) or more")
AGENTOPS_ARCHIVE_DIR = Path(env_str("AGENTOPS_ARCHIVE_DIR", "") or VAR_DIR / "archive")
# Workflows archived per run of the job, at most; the next run takes the rest.
AGENTOPS_RETENTION_BATCH_SIZE = env_int("AGENTOPS_RETENTION_BATCH_SIZE", 20, at_least=1)
# A run that claimed a workflow and died is taken over after this long; longer than writing the
# largest archive takes.
AGENTOPS_RETENTION_CLAIM_SECONDS = env_int("AGENTOPS_RETENTION_CLAIM_SECONDS", 3600)
AGENTOPS_RETENTION_CHECK_SECONDS = env_int("AGENTOPS_RETENTION_CHECK_SECONDS", 3600)
if AGENTOPS_RETENTION_CHECK_SECONDS < 1 or AGENTOPS_RETENTION_CLAIM_SECONDS < 1:
    raise ImproperlyConfigured("AGENTOPS_RETENTION_CHECK_SECONDS and AGENTOPS_RETENTION_CLAIM_SECONDS must be at "
                               "least 1.")
CELERY_BEAT_SCHEDULE["archive_histories"] = beat_sweep("archive_histories", AGENTOPS_RETENTION_CHECK_SECONDS)

# The failure boundary around definition code: an advance that raises is recorded and retried
# with backoff (30 s, 60 s, 120 s …); after this many failures in a row the workflow pauses
# for a person (`manage.py agent resume ID` after a fix, or cancel).
AGENTOPS_HANDLER_MAX_FAILURES = env_int("AGENTOPS_HANDLER_MAX_FAILURES", 5)


# Inbound webhooks (README, "Webhooks"): "source=secret,source2=secret2", secrets of at least 32
# characters. Each source signs its deliveries with scheme v2: HMAC-SHA256 of
# "v2\n<timestamp>\n<delivery id>\n<method>\n<path>\n<body>" (workflows/features/webhooks/inbound.py).
# During a rotation a source has a second, previous secret in AGENTOPS_WEBHOOK_PREVIOUS_SECRETS (same
# format): deliveries signed with either verify, until the previous one is removed.
AGENTOPS_WEBHOOK_SECRETS = webhook_secrets("AGENTOPS_WEBHOOK_SECRETS")
AGENTOPS_WEBHOOK_PREVIOUS_SECRETS = webhook_secrets("AGENTOPS_WEBHOOK_PREVIOUS_SECRETS")
# Sources whose senders still sign the retired unversioned scheme (sha256= over "<timestamp>.<body>",
# which covers neither the delivery id nor the path): refused unless listed here, while they upgrade.
AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES = frozenset(env_names("AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES"))
webhook_rotation_checked(AGENTOPS_WEBHOOK_SECRETS, AGENTOPS_WEBHOOK_PREVIOUS_SECRETS,
                         AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES)
# How far a delivery's timestamp may be from the server's clock (replays of old deliveries are refused).
AGENTOPS_WEBHOOK_TOLERANCE_SECONDS = env_int("AGENTOPS_WEBHOOK_TOLERANCE_SECONDS", 300)
AGENTOPS_WEBHOOK_MAX_BODY_BYTES = 256 * 1024

# Prometheus metrics at /metrics (docs/operators.md, "Metrics"): scraped with
# "Authorization: Bearer <this>"; empty turns the endpoint off.
AGENTOPS_METRICS_TOKEN = env_str("AGENTOPS_METRICS_TOKEN", "")
# Launch label keys that become Prometheus labels (label_<key>) of agentops_workflows, e.g. "team,env";
# empty: none. Each key keeps its AGENTOPS_METRICS_LABEL_VALUES_MAX most used values, the rest counted
# as "_other", so a label with a value per workflow cannot grow the series without bound.
AGENTOPS_METRICS_LABELS = env_label_keys("AGENTOPS_METRICS_LABELS", most=5)
AGENTOPS_METRICS_LABEL_VALUES_MAX = env_int("AGENTOPS_METRICS_LABEL_VALUES_MAX", 20)

# Live event streams (docs/live.md): how often a stream looks for new events (holding no database
# connection in between), the longest silence before a keep-alive comment, how long one stream runs
# before it ends and the client reconnects with Last-Event-ID (so that server threads recycle), the
# reconnect delay a client is told, and how long the all-workflows stream waits for a hole in the
# event numbers to fill (a transaction still committing) before it passes it (one rolled back).
AGENTOPS_STREAM_POLL_SECONDS = env_float("AGENTOPS_STREAM_POLL_SECONDS", 1.0)
AGENTOPS_STREAM_KEEPALIVE_SECONDS = min(env_float("AGENTOPS_STREAM_KEEPALIVE_SECONDS", 15.0), 15.0)
AGENTOPS_STREAM_MAX_SECONDS = env_float("AGENTOPS_STREAM_MAX_SECONDS", 300.0)
AGENTOPS_STREAM_RETRY_MILLISECONDS = env_int("AGENTOPS_STREAM_RETRY_MILLISECONDS", 2000)
AGENTOPS_STREAM_GAP_SECONDS = env_float("AGENTOPS_STREAM_GAP_SECONDS", 1.0)

# OpenTelemetry traces (docs/live.md, "Traces"), from the standard variables: OTEL_TRACES_EXPORTER
# is a comma-separated list of otlp (OTLP over HTTP/protobuf; OTEL_EXPORTER_OTLP_ENDPOINT and the
# other OTEL_EXPORTER_OTLP_* variables are read by the exporter itself), console, or none (the
# default: off, at no cost). AGENTOPS_OTEL_CONSOLE_PATH sends the console exporter's lines to a
# file instead of standard output (`manage.py demo` collects its workers' spans there).
AGENTOPS_OTEL_TRACES_EXPORTER = tuple(
    n for n in (p.strip().lower() for p in env_str("OTEL_TRACES_EXPORTER", "none").split(",")) if n and n != "none")
if set(AGENTOPS_OTEL_TRACES_EXPORTER) - {"otlp", "console"}:
    raise ImproperlyConfigured(f"OTEL_TRACES_EXPORTER={os.environ.get('OTEL_TRACES_EXPORTER')!r} names an exporter "
                               "agentops does not have; use otlp, console or none.")
AGENTOPS_OTEL_SDK_DISABLED = env_bool("OTEL_SDK_DISABLED", False)
AGENTOPS_OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "agentops")
AGENTOPS_OTEL_CONSOLE_PATH = env_str("AGENTOPS_OTEL_CONSOLE_PATH", "")

# Outbound webhooks (docs/live.md, "Outbound webhooks"): how often beat scans for new events and
# sends due deliveries (whole seconds), how long a receiver may take to answer, the first retry's
# delay (doubled after each failure, up to the maximum) and the attempts before a delivery fails.
AGENTOPS_OUTBOUND_WEBHOOK_TICK_SECONDS = max(1, env_int("AGENTOPS_OUTBOUND_WEBHOOK_TICK_SECONDS", 2))
AGENTOPS_OUTBOUND_WEBHOOK_TIMEOUT_SECONDS = env_float("AGENTOPS_OUTBOUND_WEBHOOK_TIMEOUT_SECONDS", 10.0)
AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_SECONDS = env_float("AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_SECONDS", 10.0)
AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_MAX_SECONDS = env_float("AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0)
AGENTOPS_OUTBOUND_WEBHOOK_MAX_ATTEMPTS = env_int("AGENTOPS_OUTBOUND_WEBHOOK_MAX_ATTEMPTS", 20)
CELERY_BEAT_SCHEDULE["deliver_webhooks"] = beat_sweep("deliver_webhooks", AGENTOPS_OUTBOUND_WEBHOOK_TICK_SECONDS,
                                                      expires=max(10.0, 5 * AGENTOPS_OUTBOUND_WEBHOOK_TICK_SECONDS))

# The model call in flight, live (docs/live.md): a Redis URL turns on streamed model calls whose
# partial output is published there (never stored) for the event streams; empty: off. At most one
# model.delta event per AGENTOPS_MODEL_DELTA_SECONDS per call.
AGENTOPS_LIVE_REDIS_URL = env_str("AGENTOPS_LIVE_REDIS_URL", "")
AGENTOPS_MODEL_DELTA_SECONDS = env_float("AGENTOPS_MODEL_DELTA_SECONDS", 0.2)
