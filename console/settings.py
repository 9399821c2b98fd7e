"""Every setting of the console, read from the environment with its default here.

The helpers refuse values they cannot read instead of guessing, so a typo in a deployment
stops the process at start-up with the variable's name rather than misbehaving later.
"""

import os
import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from console.liveness import heartbeat_seconds

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str, *, pattern: str | None = None, says: str = "") -> str:
    """A text setting; with `pattern`, one the whole value must match (`says` what that is, in the error)."""
    value = os.environ.get(name, default)
    if pattern is not None and not re.fullmatch(pattern, value):
        raise ImproperlyConfigured(f"{name}={value!r}: {says or 'not of the form ' + pattern}")
    return value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def read_secret_key(path: Path) -> str:
    """SECRET_KEY from the environment, else from the file the console made (console.state.prepare)."""
    given = os.environ.get("SECRET_KEY", "")
    if given:
        return given
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise ImproperlyConfigured(
            f"SECRET_KEY is not set and {path} does not exist: set SECRET_KEY, or start the console through "
            "`manage.py` (`make run`), which makes one there") from None


# Runtime state (SQLite file, uploaded code, the secret key, collected outputs) lives outside the source
# tree, readable by the console's account alone: it holds every API token's digest and the sealed node keys.
# console.state.prepare() makes it (0700), with the secret key and the SQLite files: these settings only read.
VAR_DIR = Path(env_str("CONSOLE_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
# No public default: without SECRET_KEY in the environment, the console makes one on its first start and
# keeps it in var/secret_key (0600, console.state). Rotating: the old key goes to SECRET_KEY_FALLBACKS, so
# sessions and the sealed node keys made with it still open (`manage.py resealsecrets` then retires it).
SECRET_KEY = read_secret_key(VAR_DIR / "secret_key")
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

MEDIA_ROOT = VAR_DIR / "media"
CODE_DIRS_ROOT = VAR_DIR / "code-dirs"
EXAMPLES_DIR = BASE_DIR / "examples"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    # The schema at /api/v1/schema and its Swagger UI at /api/v1/docs, served from the sidecar package (no CDN).
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "console.security.ContentSecurityPolicyMiddleware",
    "console.security.ApiErrorsAsJsonMiddleware",
    "console.security.RequestLimitsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A database that cannot take a request (locked past its timeout, away) is a 503 with Retry-After, not a 500.
    "console.database_busy.DatabaseBusyMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

# Security and deployment. `make run` serves plain HTTP on 127.0.0.1 (CONSOLE_BIND), so what needs HTTPS is
# off by default; CONSOLE_HTTPS=1 turns all of it on for a deployment behind TLS, and each switch can still
# be set on its own. `manage.py check --deploy` with CONSOLE_HTTPS=1 and a SECRET_KEY gives no warning.
CONSOLE_BIND = env_str("CONSOLE_BIND", "127.0.0.1")
CONSOLE_HTTPS = env_bool("CONSOLE_HTTPS", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", CONSOLE_HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", CONSOLE_HTTPS)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", CONSOLE_HTTPS)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if CONSOLE_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", CONSOLE_HTTPS)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", CONSOLE_HTTPS)
# The header a TLS-terminating proxy sets to say the client came over HTTPS; it must overwrite whatever the
# client sent. Empty: none is trusted (uvicorn takes the scheme from X-Forwarded-Proto only from TRUSTED_PROXIES).
# The reverse proxies whose X-Forwarded-For and X-Forwarded-Proto the web server believes (addresses or
# networks, comma-separated): none by default, so a client cannot choose the address its failed logins and
# bad tokens are counted against. Behind a proxy on this host: TRUSTED_PROXIES=127.0.0.1.
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
_PROXY_SSL_HEADER = env_str("CONSOLE_PROXY_SSL_HEADER", "X-Forwarded-Proto" if CONSOLE_HTTPS else "").strip()
SECURE_PROXY_SSL_HEADER = ("HTTP_" + _PROXY_SSL_HEADER.upper().replace("-", "_"), "https") if _PROXY_SSL_HEADER else None
X_FRAME_OPTIONS = env_str("X_FRAME_OPTIONS", "DENY").upper()
if X_FRAME_OPTIONS not in ("DENY", "SAMEORIGIN"):
    raise ImproperlyConfigured(f"X_FRAME_OPTIONS={X_FRAME_OPTIONS!r} must be DENY or SAMEORIGIN")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# The pages load every script and style from /static/ (no inline <script>, style attribute or eval), and the
# scripts talk to this origin only; json_script data blocks are not scripts to the browser.
CONTENT_SECURITY_POLICY = env_str(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors "
    + ("'none'" if X_FRAME_OPTIONS == "DENY" else "'self'"),
)

ROOT_URLCONF = "console.urls"

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
                "django.template.context_processors.i18n",
            ],
        },
    },
]

ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = "console.wsgi.application"

DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            # CONSOLE_SQLITE_PATH lets a Celery worker started by the tests open the test database.
            "NAME": env_str("CONSOLE_SQLITE_PATH", str(VAR_DIR / "console.sqlite3")),
            "OPTIONS": {
                # WAL lets the web process read while a Celery worker writes; IMMEDIATE takes the
                # write lock at BEGIN so two writers queue on the busy timeout instead of deadlocking.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
            # A file, not memory: the Celery worker the integration tests start must see it. One per
            # TEST_RUN_ID, so that test runs sharing a machine never share it.
            "TEST": {"NAME": str(VAR_DIR / f"test-console-{env_int('TEST_RUN_ID', 0, minimum=0)}.sqlite3")},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

# Login failures (the sign-in page and the admin's) are limited by django-axes: after LOGIN_FAILURE_LIMIT
# failures for one username from one address, that username is refused from there (429) for
# LOGIN_COOLOFF_MINUTES; a success resets the count. Its records are in the admin (Axes), to unlock early.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = env_bool("LOGIN_RATE_LIMIT", True)
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Bad API tokens, counted per client address (jobs.api.errors.ThrottledTokenAuthentication, and the log
# stream): past the limit within the window, the address's tokens are refused (429) until the window ends.
API_TOKEN_FAILURE_LIMIT = env_int("API_TOKEN_FAILURE_LIMIT", 10, minimum=1)
API_TOKEN_FAILURE_WINDOW_SECONDS = env_int("API_TOKEN_FAILURE_WINDOW_SECONDS", 300, minimum=1)
# Live log streams (Server-Sent Events) one user may hold open at once; the next is a 429.
LOG_STREAMS_PER_USER = env_int("LOG_STREAMS_PER_USER", 20, minimum=1)
# How slowly a client may send a request (console.request_limits): its headers within
# REQUEST_HEADER_TIMEOUT_SECONDS, its body with no pause longer than REQUEST_BODY_IDLE_TIMEOUT_SECONDS and
# within REQUEST_BODY_TIMEOUT_SECONDS in all (a code-directory upload within CODE_DIR_UPLOAD_TIMEOUT_SECONDS).
REQUEST_HEADER_TIMEOUT_SECONDS = env_int("REQUEST_HEADER_TIMEOUT_SECONDS", 10, minimum=1)
REQUEST_BODY_IDLE_TIMEOUT_SECONDS = env_int("REQUEST_BODY_IDLE_TIMEOUT_SECONDS", 30, minimum=1)
REQUEST_BODY_TIMEOUT_SECONDS = env_int("REQUEST_BODY_TIMEOUT_SECONDS", 60, minimum=1)
CODE_DIR_UPLOAD_TIMEOUT_SECONDS = env_int("CODE_DIR_UPLOAD_TIMEOUT_SECONDS", 3600, minimum=1)

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("pt-br", "Português (Brasil)")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
SERVE_STATIC = env_bool("SERVE_STATIC", True)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "job-list"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # jobs.api.auth.HashedTokenAuthentication, with bad tokens counted per address.
        "jobs.api.errors.ThrottledTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON objects only: form-encoded and multipart bodies are a 415 (the code-directory upload names its
    # own multipart parser).
    "DEFAULT_PARSER_CLASSES": ["jobs.api.errors.JSONObjectParser"],
    "DEFAULT_PAGINATION_CLASS": "jobs.api.errors.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "jobs.api.errors.field_naming_exception_handler",
    # The OpenAPI schema (drf-spectacular), with the error answers every route shares.
    "DEFAULT_SCHEMA_CLASS": "jobs.api.schema.ConsoleAutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Training console API",
    "DESCRIPTION": (
        "Submit distributed training jobs, follow their logs and read their results. Authenticate with "
        "`Authorization: Token <token>` (made on the console's API tokens page). Every error is a JSON object, "
        "the ApiError schema. The job, spec and engine lists are paginated with `limit` and `offset`."),
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {"SharingEnum": "jobs.models.CodeDirectory.Sharing", "JobStatusEnum": "jobs.models.JobStatus"},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "jobs.api.schema.add_async_log_routes"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Celery beat, or a Celery worker, silent this long is taken as hung (SIGSTOPped, deadlocked): `runconsole`
# kills it and starts it again (console.liveness). Beat sends its heartbeat a few times within it.
HUNG_PROCESS_SECONDS = env_int("HUNG_PROCESS_SECONDS", 60, minimum=4)
BEAT_HEARTBEAT_SECONDS = heartbeat_seconds(HUNG_PROCESS_SECONDS)
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
# Tasks are acknowledged when taken, not when done. A job's run lasts as long as the job, longer than
# Redis' visibility timeout, and late acks would hand it to a second worker; they also make the worker
# crash when Redis restarts under it (kombu restores unacked messages on a dead connection). A run lost
# with its worker is not lost for the job: mpirun runs detached in worker-0's container, and the reaper
# hands a job whose run stopped beating to a live worker, which follows it on (jobs.runtime.launcher).
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Early acks would let a worker whose threads are all busy keep taking runs into its own buffer while
# another worker has free threads: with this a worker takes no more tasks than it has threads (Redis only).
CELERY_WORKER_DISABLE_PREFETCH = True
# Runs (hours long, one thread each) and control work (seconds: dispatch, stops, the reaper, node checks,
# notifications) on queues of their own, each served by its own worker process, so that a full set of runs
# never delays a stop, a check or a dispatch, and a burst of control work never takes a run's thread. A
# worker started without `-Q` serves both.
# Each queue its own exchange and key: Celery binds a queue given without them to the default queue's,
# and a message would then reach both.
# Terminals in jobs' containers (jobs.runtime.shell) hold a thread each for as long as they are open: they have
# a queue and a worker of their own, so an open terminal never takes a run's thread nor a control thread.
CELERY_TASK_QUEUES = [Queue(name, Exchange(name), routing_key=name) for name in ("control", "runs", "shells")]
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ROUTES = {"jobs.tasks.run_job": {"queue": "runs"}, "jobs.tasks.resume_job": {"queue": "runs"},
                      "jobs.tasks.relay_shell": {"queue": "shells"}}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = False
# Keep Django's logging (with each record's task id) in the worker instead of Celery's own format.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    # Beat's sign of life (console.liveness); a tick that waited past the next one is dropped, so the one
    # recorded is never more than a tick behind beat.
    "beat-heartbeat": {"task": "jobs.tasks.beat_heartbeat", "schedule": BEAT_HEARTBEAT_SECONDS,
                       "options": {"expires": BEAT_HEARTBEAT_SECONDS}},
    # A safety net: jobs are dispatched on submit and on every release, this catches anything missed.
    "dispatch-pending-jobs": {"task": "jobs.tasks.dispatch_pending_jobs", "schedule": 10.0},
    # The outbox of end notifications: what a broker that was away kept from going out.
    "sweep-end-notices": {"task": "jobs.tasks.sweep_end_notices", "schedule": 30.0},
    # Slurm pools: what Slurm did to the jobs it holds (a cancel, a time limit, a preemption), seen within
    # this many seconds; the allocations of jobs that ended given back.
    "watch-slurm-jobs": {"task": "jobs.tasks.watch_slurm_jobs",
                         "schedule": float(env_int("SLURM_WATCH_SECONDS", 3, minimum=1)),
                         "options": {"expires": float(env_int("SLURM_WATCH_SECONDS", 3, minimum=1))}},
    "reap-orphaned-jobs": {"task": "jobs.tasks.reap_orphaned_jobs",
                           "schedule": float(env_int("REAPER_INTERVAL_SECONDS", 15, minimum=1))},
    # Reach every enabled node, record what it has, and take unreachable ones out of scheduling.
    "check-node-health": {
        "task": "jobs.tasks.check_nodes",
        "schedule": float(env_int("NODE_HEALTH_INTERVAL_SECONDS", 60, minimum=5)),
        # A check still queued when the next one is due is dropped rather than run late.
        "options": {"expires": float(env_int("NODE_HEALTH_INTERVAL_SECONDS", 60, minimum=5))},
    },
}

# How the console reaches nodes and lays out a job on them.
SSH_CONNECT_TIMEOUT = env_int("SSH_CONNECT_TIMEOUT", 10, minimum=1)
SSH_COMMAND_TIMEOUT = env_int("SSH_COMMAND_TIMEOUT", 120, minimum=1)
NODE_WORK_ROOT = env_str("NODE_WORK_ROOT", "/var/lib/training-console/jobs")
# Where the console builds and keeps the engine images' archives (outside the checkout: they are large
# and survive a fresh clone); nodes that lack an image get it from here.
IMAGES_DIR = Path(env_str("CONSOLE_IMAGES_DIR", "/var/lib/training-console/images"))
# How many jobs one Celery worker process runs at once. A run holds one thread from preparation to
# teardown (it mostly waits on SSH) and up to three database connections (the task thread's, its run's
# and its log writer's): a site with more concurrent jobs starts more worker processes rather than
# raising this far (bench/many_jobs.py).
WORKER_THREADS = env_int("WORKER_THREADS", 16, minimum=2)
# The threads of the worker process that serves the control queue (dispatch, stops, the reaper, node
# checks, notifications: seconds each, never a run).
CONTROL_THREADS = env_int("CONTROL_THREADS", 4, minimum=1)
# Terminals in jobs' containers: how many may be open at once (the shells worker's threads), how many one user
# may hold, and how long one may sit with nothing typed before it is closed.
# The checkpoints kept of a job (its newest; older rows go as new ones come; the files stay in the store).
CHECKPOINTS_KEPT = env_int("CHECKPOINTS_KEPT", 1000, minimum=1)
SHELL_THREADS = env_int("SHELL_THREADS", 8, minimum=1)
SHELLS_PER_USER = env_int("SHELLS_PER_USER", 4, minimum=1)
SHELL_IDLE_SECONDS = env_int("SHELL_IDLE_SECONDS", 1800, minimum=10)
# A terminal no shells worker took within this long is said to have none (its page stops waiting).
SHELL_START_SECONDS = env_int("SHELL_START_SECONDS", 30, minimum=1)
# How long one minute of a failed job's hold for debugging lasts (debug_hold_minutes; the admin maximum is in
# minutes all the same): 60, but for the tests, which hold a job for seconds.
DEBUG_HOLD_MINUTE_SECONDS = env_int("DEBUG_HOLD_MINUTE_SECONDS", 60, minimum=1)
# How long a run waits for a failed or hung job's evidence (ranks' stacks, last lines) before its containers end.
EVIDENCE_WAIT_SECONDS = env_int("EVIDENCE_WAIT_SECONDS", 30, minimum=1)
CELERY_WORKER_CONCURRENCY = WORKER_THREADS  # what `celery worker` reads, however it is started
# How many jobs the console runs at once: the threads of all its worker processes (`make run` starts one).
# A job past it stays queued with its nodes free, rather than holding nodes while its run waits for a
# thread (and being taken for lost after NEVER_STARTED_STALE_SECONDS).
RUN_SLOTS = env_int("RUN_SLOTS", WORKER_THREADS, minimum=1)
# A run's heartbeat silent this long means its console process is gone: another takes the job up.
RUN_STALE_SECONDS = env_int("RUN_STALE_SECONDS", 30, minimum=5)
# While a job runs, each worker's container is looked at this often; a node silent for NODE_LOST_SECONDS
# (or a container gone) fails the job, long before Open MPI's own timeout would.
WORKER_PROBE_SECONDS = float(env_int("WORKER_PROBE_SECONDS", 5, minimum=1))
NODE_LOST_SECONDS = float(env_int("NODE_LOST_SECONDS", 30, minimum=5))
# The free disk a node keeps for itself (its logs, Podman, the teardown): a job whose node falls under it is
# ended, whatever its own disk limit (the spec's disk_gb), as one past that limit is, at the same look.
NODE_DISK_RESERVE_GB = env_int("NODE_DISK_RESERVE_GB", 5, minimum=0)
# What each node keeps of the object-store inputs it fetched, for reruns (least recently used go first).
NODE_CACHE_GB = env_int("NODE_CACHE_GB", 20, minimum=0)
# While a job runs, what it wrote under its train_url's local folder is uploaded this often (and once more
# when it ends, whichever way).
OUTPUT_SYNC_SECONDS = env_int("OUTPUT_SYNC_SECONDS", 60, minimum=1)
# A file of the output larger than this goes to the store in parts of this size (a multipart upload: one PUT takes
# at most 5 GiB), grown where a file would need more than 10,000 of them. S3's smallest part is 5 MiB.
OUTPUT_PART_BYTES = env_int("OUTPUT_PART_BYTES", 64 * 1024 * 1024, minimum=5 * 1024 * 1024)
# The most a stop waits for that last upload before it ends the containers.
OUTPUT_FINAL_SYNC_SECONDS = env_int("OUTPUT_FINAL_SYNC_SECONDS", 300, minimum=5)
# A rank that ended on its own, not as 0, while the others go on (a rank that raised while the others wait in
# a collective) is said on the job's page at once; if the job has not ended this many seconds later, its
# containers are ended and it fails with that rank's card (0: never).
RANK_EXIT_GRACE_SECONDS = float(env_int("RANK_EXIT_GRACE_SECONDS", 60, minimum=0))
# Engine images brought to the nodes before a job needs them: when the console starts, a version is added or a
# node is added or enabled (jobs.runtime.image_prefetch). Off where something else gives the nodes their
# images: the tests' and benchmarks' clusters load what they use themselves.
IMAGE_PREFETCH = env_bool("IMAGE_PREFETCH", True)
# The console's image registry (jobs.images.registry), read-only on this host's loopback at this port: a node
# that lacks an engine image pulls the layers it lacks from it through a port its SSH server forwards back
# (0, or no registry answering: the node gets the image's whole archive over SFTP).
IMAGE_REGISTRY_PORT = env_int("IMAGE_REGISTRY_PORT", 5077, minimum=0)
# How often worker-0's container is asked whether the program wrote a new checkpoint manifest (one that did
# is uploaded and recorded at once: a lost worker then loses no more than the program's own interval).
CHECKPOINT_LOOK_SECONDS = float(env_int("CHECKPOINT_LOOK_SECONDS", 5, minimum=1))
# How often each worker's CPU, memory and GPU use is kept for the job's resource charts.
RESOURCE_SAMPLE_SECONDS = float(env_int("RESOURCE_SAMPLE_SECONDS", 15, minimum=1))
JOB_USER = env_str("JOB_USER", "ma-user")
JOB_USER_PREFERRED_UID = env_int("JOB_USER_PREFERRED_UID", 1000, minimum=1)
# Log lines are written in batches so a chatty job costs one transaction per batch, not per line (a batch
# also goes at 4 MB of text, jobs.logs.sink.BATCH_MAX_CHARS, so long lines hold no more memory for it).
LOG_FLUSH_INTERVAL_SECONDS = float(env_int("LOG_FLUSH_INTERVAL_MS", 250, minimum=10)) / 1000
LOG_FLUSH_MAX_LINES = env_int("LOG_FLUSH_MAX_LINES", 2000, minimum=1)
LOG_LINE_MAX_BYTES = env_int("LOG_LINE_MAX_BYTES", 16384, minimum=256)
# Uploaded code directories (jobs.code_dirs): the reference platform allows 5 GB and 1,000 files each.
CODE_DIR_MAX_UPLOAD_BYTES = env_int("CODE_DIR_MAX_UPLOAD_BYTES", 5 * 1024**3, minimum=1)
# CODE_DIR_MAX_BYTES is the variable's old name, still read.
CODE_DIR_MAX_UNPACKED_BYTES = env_int("CODE_DIR_MAX_UNPACKED_BYTES", env_int("CODE_DIR_MAX_BYTES", 5 * 1024**3, minimum=1),
                                      minimum=1)
CODE_DIR_MAX_FILES = env_int("CODE_DIR_MAX_FILES", 1000, minimum=1)
CODE_DIR_MAX_FOLDERS = env_int("CODE_DIR_MAX_FOLDERS", 1000, minimum=1)
CODE_DIR_MAX_DEPTH = env_int("CODE_DIR_MAX_DEPTH", 32, minimum=1)
# An archive that unpacks to more than this many times its own size (past 64 MiB) is taken for a bomb.
CODE_DIR_MAX_COMPRESSION_RATIO = env_int("CODE_DIR_MAX_COMPRESSION_RATIO", 100, minimum=1)
# A console running as root unpacks as this account, which must not be root (and is best used by nothing else).
CODE_DIR_UNPACK_USER = env_str("CODE_DIR_UNPACK_USER", "nobody")
CODE_DIR_UNPACK_TIMEOUT_SECONDS = env_int("CODE_DIR_UNPACK_TIMEOUT_SECONDS", 300, minimum=1)

# Telling users that their jobs ended (jobs.notifications). CONSOLE_PUBLIC_URL is where they reach the console,
# for the links in what is sent. Webhooks are never called at loopback, private, link-local or reserved
# addresses (the console's own Redis and nodes are there) unless WEBHOOK_ALLOW_PRIVATE; a call that times out,
# cannot connect or gets a 5xx is tried WEBHOOK_RETRIES more times, waiting 1, 2, 4... x the backoff between.
CONSOLE_PUBLIC_URL = env_str("CONSOLE_PUBLIC_URL", "http://localhost:8000").rstrip("/")
WEBHOOK_ALLOW_PRIVATE = env_bool("WEBHOOK_ALLOW_PRIVATE", False)
WEBHOOK_TIMEOUT_SECONDS = env_int("WEBHOOK_TIMEOUT_SECONDS", 5, minimum=1)
WEBHOOK_RETRIES = env_int("WEBHOOK_RETRIES", 3, minimum=0)
WEBHOOK_RETRY_BACKOFF_SECONDS = env_int("WEBHOOK_RETRY_BACKOFF_MS", 1000, minimum=0) / 1000
# E-mail is off until EMAIL_HOST names an SMTP server.
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be on")
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "training-console@localhost")

# The local cluster `make run` and the tests bring up (namespaces on a private bridge).
# Outside the checkout on purpose: sshd refuses keys reached through a group- or world-writable
# directory, and a checkout may sit under one (/tmp).
LOCALCLUSTER_STATE_DIR = Path(env_str("LOCALCLUSTER_STATE_DIR", "/var/lib/training-console/localcluster"))
LOCALCLUSTER_SUBNET = env_str("LOCALCLUSTER_SUBNET", "10.77.0.0/24")
LOCALCLUSTER_BRIDGE = env_str("LOCALCLUSTER_BRIDGE", "tcbr0", pattern=r"[A-Za-z][A-Za-z0-9_.-]{0,14}",
                              says="a network interface's name: a letter, then letters, digits, _ . -, 15 at most")
# Node i is named <prefix><i>: a prefix ending in a digit would make two nodes' names one.
LOCALCLUSTER_PREFIX = env_str("LOCALCLUSTER_PREFIX", "tcnode", pattern=r"[A-Za-z]([A-Za-z0-9_-]*[A-Za-z_-])?",
                              says="letters, digits, _ and -, beginning with a letter and not ending in a digit")
# A job of a Slurm pool with a time limit (auto stop) is stopped this much, its checkpoint grace and
# OUTPUT_FINAL_SYNC_SECONDS before Slurm's limit: time for the teardown, so the console ends the job (its ranks given
# their notice, its last upload made) before Slurm kills it at the limit.
SLURM_NOTICE_MARGIN_SECONDS = env_int("SLURM_NOTICE_MARGIN_SECONDS", 120, minimum=0)
# Where the jobs' folders go on the nodes of a Slurm pool without root ({user}: its Slurm user): a disk of the node's
# own (rootless Podman gives the job's files to the user's subordinate ids, which a network file system refuses);
# the console makes the folder as that user (mode 0711) and uses it only while it is that user's and no link.
SLURM_WORK_ROOT = env_str("SLURM_WORK_ROOT", "/var/tmp/training-console-{user}", pattern=r"/[A-Za-z0-9_./-]*\{user\}[A-Za-z0-9_./-]*",
                          says="an absolute path naming {user} once (letters, digits, _ . / -)")
# The local Slurm (`manage.py localslurm up`, `make run SLURM=1`): its daemons' folder, the subnet, bridge and
# namespace prefix of its own nodes (apart from the local cluster's, so that the console's allocator and Slurm
# never share a node), the first of its four ports (slurmctld, slurmd, slurmdbd, slurmrestd), and the user
# jobs are submitted as.
# Where an administrator may register shared file systems (jobs.models.SharedPath): below these only.
SHARED_PATH_ROOTS = env_list("SHARED_PATH_ROOTS", ["/mnt", "/data", "/datasets", "/lustre", "/gpfs", "/nfs",
                                                   "/scratch", "/shared"])
# The console's own object store (SeaweedFS), started by `make run` unless an administrator's store is
# registered: its data and keys, and its ports (S3 gateway; master, volume and filer on the next three).
LOCALSTORE_STATE_DIR = Path(env_str("LOCALSTORE_STATE_DIR", str(VAR_DIR / "objectstore")))
LOCALSTORE_BASE_PORT = env_int("LOCALSTORE_BASE_PORT", 8333, minimum=1024)
LOCALSLURM_STATE_DIR = Path(env_str("LOCALSLURM_STATE_DIR", "/var/lib/training-console/localslurm"))
LOCALSLURM_SUBNET = env_str("LOCALSLURM_SUBNET", "10.76.0.0/24")
# The cluster's name is also its accounting database's (slurm_<name>) on the shared MariaDB.
LOCALSLURM_CLUSTER = env_str("LOCALSLURM_CLUSTER", "console")
LOCALSLURM_BRIDGE = env_str("LOCALSLURM_BRIDGE", "tcslbr0")
LOCALSLURM_PREFIX = env_str("LOCALSLURM_PREFIX", "tcslnode")
LOCALSLURM_BASE_PORT = env_int("LOCALSLURM_BASE_PORT", 6817, minimum=1024)
LOCALSLURM_USER = env_str("LOCALSLURM_USER", "ma-user")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"task_id": {"()": "console.log_context.TaskIdFilter"},
                "mask_secrets": {"()": "console.log_context.MaskSecretsFilter"}},
    "formatters": {"with_task": {"format": "%(asctime)s %(levelname)s [task %(task_id)s] %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["task_id", "mask_secrets"],
                             "formatter": "with_task"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

VAR_DIR.mkdir(parents=True, exist_ok=True)
