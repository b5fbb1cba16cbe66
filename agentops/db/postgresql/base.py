"""Django's PostgreSQL backend whose connection pool checks a connection only after it sat idle.

Django's pool (``OPTIONS["pool"]`` with ``CONN_HEALTH_CHECKS``) runs an empty query on every
connection it hands out. A threads worker takes a connection several times a model call (it gives
it back before every wait: ``workflows.connections``), so each call paid several such round
trips, each a hand-off of the interpreter between threads (0.2 ms a call at 50 threads in one
process, bench/HISTORY.md, "CPU per call: where a threads worker's extra CPU goes"; under load within
the bench's scatter). This backend checks only a connection that has sat in the pool for
``POOL_CHECK_IDLE_SECONDS`` or more (``workflows.connections.pool_check_if_idle``): one given back
a moment ago was working then.
Django offers no way to pass another check (it passes its own to psycopg_pool), so ``pool``
builds the pool as Django's does, with that check (``ReturnStampedPool``: a pool that notes when
each connection came back, without psycopg_pool's ``reset``, which would send every return
through the pool's worker thread). The settings use this backend when
``AGENTOPS_DB_POOL_SIZE`` turns the pool on.
"""
from __future__ import annotations

from typing import Any

from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base

from workflows.connections import ReturnStampedPool, pool_check_if_idle

# django-stubs know nothing of the pool (``pool``, ``_connection_pools``, ``_configure_connection``).
PostgreSQLWrapper: Any = base.DatabaseWrapper


class DatabaseWrapper(PostgreSQLWrapper):
    @property
    def pool(self) -> Any:
        options = self.settings_dict["OPTIONS"].get("pool")
        if (self.alias in self._connection_pools or not options or not self.settings_dict["CONN_HEALTH_CHECKS"]
                or self.alias == NO_DB_ALIAS or self.settings_dict.get("CONN_MAX_AGE", 0) != 0):
            return super().pool  # built already, no pool, no checks asked for, or Django's refusal
        params = self.get_connection_params()
        params["autocommit"] = True  # as Django's: it sets autocommit itself later on
        pool = ReturnStampedPool(kwargs=params, open=False, configure=self._configure_connection,
                                 check=pool_check_if_idle, **({} if options is True else options))
        # As Django's: threads racing at start each build one, the first set wins; none is open yet.
        self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]
