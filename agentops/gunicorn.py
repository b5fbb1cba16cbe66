"""gunicorn's configuration for the web tier: ``gunicorn -c python:agentops.gunicorn agentops.wsgi``.

The ``gthread`` worker class: each of AGENTOPS_WEB_WORKERS processes serves requests on a fixed pool
of AGENTOPS_WEB_THREADS threads. Threads, not processes, because a live stream (server-sent events)
holds its thread for as long as the client listens, and a thread costs kilobytes where a process
costs ~90 MB. The pool is fixed, so the database connections are bounded: each thread keeps at most
one (CONN_MAX_AGE, health-checked before reuse), at most workers × threads per web host
(docs/operators.md, "Sizing"). ``runserver`` makes a thread per request, each with a connection of
its own that outlives it: it is for the demo only.
"""
from agentops import settings

wsgi_app = "agentops.wsgi:application"
bind = [settings.AGENTOPS_WEB_BIND]
worker_class = "gthread"
workers = settings.AGENTOPS_WEB_WORKERS
threads = settings.AGENTOPS_WEB_THREADS
# gthread: how long a worker may go without telling the arbiter it lives (not a per-request limit,
# so a stream may stay open longer).
timeout = settings.AGENTOPS_WEB_TIMEOUT_SECONDS
graceful_timeout = settings.AGENTOPS_WEB_GRACEFUL_SECONDS
keepalive = 5
# Connections waiting for a free thread; beyond them clients are refused at once, not queued forever.
backlog = 256
accesslog = "-"
errorlog = "-"
# The request id (X-Request-Id, set by workflows/api/middleware.py) on each access line.
access_log_format = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms rid=%({x-request-id}o)s'
# Preloaded: the app and its settings load once, before the fork; a broken setting stops the start.
preload_app = True
# gunicorn 27's control socket (gunicornc) is not used; off, so that hosts running several do not share one.
control_socket_disable = True


def post_fork(server: object, worker: object) -> None:
    """A connection the app opened while loading is the arbiter's: a worker opens its own."""
    from django.db import connections

    connections.close_all()
