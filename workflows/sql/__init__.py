"""Statements written by hand for what every model call and every step writes and reads.

The ORM spends several times a short statement's own cost building it (bench/README.md, "7.
Agents in flight": 0.30 ms of client CPU for a ``filter().update()`` against 0.08 ms as SQL).
These build the same statements from the model's metadata: tables and columns come from the
model and are quoted by the backend, each value goes through its field's own conversion for the
database (``get_db_prep_save``), and a field not given gets its default, as ``Model.save``
would. Each statement's text is made once per shape and process. They run on PostgreSQL and
SQLite alike.
"""
from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.fields import AutoFieldMixin
from django.db.transaction import TransactionManagementError

# A condition is ``name: value`` (equal), ``name: (value, ...)`` (one of) or ``name__lte: value``
# (at most).
Where = Mapping[str, Any]
AT_MOST = "__lte"
M = TypeVar("M", bound=models.Model)


def concrete_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """A model's field by name, for SQL written by hand: its column and its conversion for the database."""
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field):
        raise TypeError(f"{model.__name__}.{name} is not a concrete field")
    return field


def quoted_column(field: models.Field[Any, Any]) -> str:
    return connection.ops.quote_name(field.column)


def quoted_table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def rows_insert(model: type[models.Model], rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (field name -> value, the same names in each) with one INSERT; the other
    fields (not the automatic primary key) get their defaults."""
    if not rows:
        return
    db = _db()
    names = tuple(rows[0])
    fields = _insert_fields(model, names)
    params = []
    for row in rows:
        params += _row_params(fields, row, db)
    with db.cursor() as cursor:
        cursor.execute(_insert_sql(model, names, len(rows)), params)


@functools.cache
def insert_select_sql(model: type[models.Model], names: tuple[str, ...]) -> str:
    """``INSERT INTO <model's table> (<columns>) SELECT <a value each>`` of ``rows_insert`` for one
    row, for a statement written by hand that adds ``FROM`` and a condition; its parameters are
    ``insert_params``. The INSERT gives each value its column's type, as with ``VALUES`` (a value
    too long for its column is refused, not cut)."""
    fields = _insert_fields(model, names)
    values = ", ".join(["%s"] * len(fields))
    return f"INSERT INTO {quoted_table(model)} ({', '.join(quoted_column(f) for f in fields)}) SELECT {values}"


def insert_params(model: type[models.Model], row: Mapping[str, Any]) -> list[Any]:
    """The values of ``insert_select_sql`` for ``row`` (field name -> value), defaults for the others."""
    return _row_params(_insert_fields(model, tuple(row)), row, _db())


def _row_params(fields: Sequence[models.Field[Any, Any]], row: Mapping[str, Any], db: BaseDatabaseWrapper) -> list[Any]:
    return [_db_value(field, row[field.name] if field.name in row else field.get_default(), db) for field in fields]


def row_insert(instance: models.Model) -> None:
    """``instance.save(force_insert=True)`` for a new row with an automatic primary key: every
    concrete field as the instance holds it; sets the key the database gave. Without what
    ``save`` adds (``pre_save``, ``auto_now``, the save signals): the models it writes have none."""
    model, db = type(instance), _db()
    params = _instance_params(instance, db)
    with db.cursor() as cursor:
        cursor.execute(_insert_returning_sql(model), params)
        row = cursor.fetchone() if db.features.can_return_columns_from_insert else (cursor.lastrowid,)
    assert row is not None
    _inserted(instance, row[0], db)


def _instance_params(instance: models.Model, db: BaseDatabaseWrapper) -> list[Any]:
    """Every concrete field of a new row but its automatic key, as the instance holds it, for its INSERT."""
    return [_db_value(field, getattr(instance, field.attname), db) for field in _fields_but_pk(type(instance))]


def _inserted(instance: models.Model, pk: Any, db: BaseDatabaseWrapper) -> None:
    """The instance is now the row the database gave ``pk``, as after ``save``."""
    instance.pk = pk
    instance._state.adding, instance._state.db = False, db.alias


def row_insert_with(instance: models.Model, model: type[models.Model], row: Mapping[str, Any], *, key: str) -> None:
    """``row_insert(instance)``, then ``rows_insert(model, [row])`` with the foreign key ``key``
    of ``model`` set to the new row (``row`` gives neither that key nor ``model``'s automatic
    primary key): one statement on PostgreSQL (a CTE inserts ``instance``)."""
    db = _db()
    if db.vendor != "postgresql":
        row_insert(instance)
        rows_insert(model, [{**row, key: instance.pk}])
        return
    params = _instance_params(instance, db)
    params += _row_params([field for field in _insert_fields(model, (key,)) if field.name != key], row, db)
    with db.cursor() as cursor:
        cursor.execute(_insert_with_sql(type(instance), model, key), params)
        got = cursor.fetchone()
    assert got is not None
    _inserted(instance, got[0], db)


@functools.cache
def _insert_with_sql(parent: type[models.Model], model: type[models.Model], key: str) -> str:
    foreign, pk = concrete_field(model, key), parent._meta.pk
    assert pk is not None
    fields = _insert_fields(model, (key,))
    values = ", ".join(f"new.{quoted_column(pk)}" if field is foreign else "%s" for field in fields)
    return (f"WITH new AS ({_insert_returning_sql(parent)}) INSERT INTO {quoted_table(model)} "
            f"({', '.join(quoted_column(field) for field in fields)}) SELECT {values} FROM new "
            f"RETURNING {quoted_column(foreign)}")


def row_insert_unless_exists(instance: models.Model, *, unique: str) -> bool:
    """``row_insert`` unless a row with the same ``unique`` field (a column under a unique
    constraint) exists: one ``INSERT … ON CONFLICT DO NOTHING``. True when inserted (the key set),
    False when the other row was there, changing nothing."""
    model, db = type(instance), _db()
    params = _instance_params(instance, db)
    with db.cursor() as cursor:
        cursor.execute(_insert_unless_exists_sql(model, unique), params)
        row = cursor.fetchone()
    if row is None:
        return False
    _inserted(instance, row[0], db)
    return True


def row_update(model: type[models.Model], values: Mapping[str, Any], where: Where) -> int:
    """``model.objects.filter(**where).update(**values)``, for equality and one-of conditions;
    returns the rows updated."""
    return RowWrite(model, values, where).run()


@dataclass(frozen=True)
class RowWrite:
    """``row_update(model, values, where)`` as a value: a write another statement can make too, as
    one of its CTEs (``workflows.services.common.events_append_while``'s ``also``), or ``run`` alone."""

    model: type[models.Model]
    values: Mapping[str, Any]
    where: Where

    def run(self) -> int:
        """Make the write alone; returns the rows updated."""
        with _db().cursor() as cursor:
            cursor.execute(self.sql(), self.params())
            return int(cursor.rowcount)

    def sql(self) -> str:
        """The UPDATE's text (without RETURNING), for a CTE."""
        return _update_sql(self.model, tuple(self.values), where_shape(self.where))

    def params(self) -> list[Any]:
        db = _db()
        return [*(_db_value(concrete_field(self.model, name), value, db) for name, value in self.values.items()),
                *where_params(self.model, self.where, db)]


def row_update_then(first: RowWrite, then: RowWrite) -> int:
    """``first.run()``, then ``then.run()`` when it updated a row; returns the rows ``first``
    updated. One statement on PostgreSQL: ``then`` is a CTE conditioned on ``first``'s rows."""
    db = _db()
    if db.vendor != "postgresql":
        count = first.run()
        if count:
            then.run()
        return count
    with db.cursor() as cursor:
        cursor.execute(_update_then_sql(first.sql(), then.sql()), [*first.params(), *then.params()])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


@functools.cache
def _update_then_sql(first: str, then: str) -> str:
    return (f"WITH moved AS ({first} RETURNING 1), followed AS ({then} AND EXISTS (SELECT 1 FROM moved)) "
            "SELECT count(*) FROM moved")


def row_update_then_select(first: RowWrite, then: RowWrite, names: tuple[str, ...],
                           where: Where) -> list[tuple[Any, ...]] | None:
    """``row_update_then``, then ``rows_select(first.model, names, where)`` as the rows are after
    it; None, reading nothing, when ``first`` updated no row. One statement on PostgreSQL: a
    statement's own reads see the table as it was before it, so the rows ``first`` updated come
    from its ``RETURNING`` and the others from the table, beside a row of the count of those
    updated (the one whose first column is not NULL). What ``then`` writes to the rows read is
    not seen there: give it another table."""
    db = _db()
    if db.vendor != "postgresql":
        return rows_select(first.model, names, where) if row_update_then(first, then) else None
    model, shape = first.model, where_shape(where)
    matching = where_params(model, where, db)
    with db.cursor() as cursor:
        cursor.execute(_update_then_select_sql(first.sql(), then.sql(), model, names, shape),
                       [*first.params(), *then.params(), *matching, *matching])
        rows = cursor.fetchall()
    updated = next(row[0] for row in rows if row[0] is not None)
    return [row[1:] for row in rows if row[0] is None] if updated else None


@functools.cache
def _update_then_select_sql(first: str, then: str, model: type[models.Model], names: tuple[str, ...],
                            shape: WhereShape) -> str:
    pk = quoted_column(model._meta.pk)
    read = [quoted_column(concrete_field(model, name)) for name in names]
    columns = ", ".join(read)
    returned = dict.fromkeys([pk, *read,
                              *(quoted_column(concrete_field(model, name.removesuffix(AT_MOST))) for name, _ in shape)])
    where = where_sql(model, shape)
    return (f"WITH moved AS ({first} RETURNING {', '.join(returned)}), "
            f"followed AS ({then} AND EXISTS (SELECT 1 FROM moved)) "
            f"(SELECT (SELECT count(*) FROM moved), {', '.join(['NULL'] * len(names))}) "
            f"UNION ALL (SELECT NULL, {columns} FROM moved WHERE {where}) "
            f"UNION ALL (SELECT NULL, {columns} FROM {quoted_table(model)} WHERE {where} "
            f"AND {pk} NOT IN (SELECT {pk} FROM moved) AND EXISTS (SELECT 1 FROM moved))")


def row_exists(model: type[models.Model], where: Where) -> bool:
    """``model.objects.filter(**where).exists()``, for equality and one-of conditions."""
    db = _db()
    with db.cursor() as cursor:
        cursor.execute(_exists_sql(model, where_shape(where)), where_params(model, where, db))
        return cursor.fetchone() is not None


def rows_select(model: type[models.Model], names: tuple[str, ...], where: Where) -> list[tuple[Any, ...]]:
    """The columns ``names`` of the rows matching ``where``, as the database driver returns them:
    no field conversion is applied (a JSON column comes back as text; decode it with its field)."""
    db = _db()
    with db.cursor() as cursor:
        cursor.execute(_select_sql(model, names, where_shape(where)), where_params(model, where, db))
        return list(cursor.fetchall())


def row_lock_clause() -> str:
    """How a writer locks a row: FOR NO KEY UPDATE where the database has it. A plain FOR UPDATE
    also blocks the KEY SHARE lock that PostgreSQL's deferred foreign-key checks take at commit
    on the rows referenced: a child workflow whose transaction updated its own row twice checks
    its parent's key at commit, and a parent holding its own row FOR UPDATE while it waits for the
    child's lock (a cancel, a first-of wait) would deadlock with it. No writer changes a key."""
    return "FOR NO KEY UPDATE" if connection.features.has_select_for_no_key_update else "FOR UPDATE"


def row_get(model: type[M], pk: Any, *, lock: bool = False, related: str | None = None) -> M | None:
    """``model.objects.select_for_update(of=("self",)).select_related(related).get(pk=pk)``, or None
    when there is no such row: the instance as the ORM would load it (each column through its
    field's conversion from the database), ``related`` (a foreign key that cannot be null) joined
    and cached on it. ``lock`` locks the row, not the related one, where the database can."""
    got = _row_get(model, pk, lock, related, ())
    return None if got is None else got[0]


def row_get_with(model: type[M], pk: Any, extras: tuple[str, ...], *, lock: bool = False,
                 related: str | None = None) -> tuple[M, tuple[Any, ...]] | None:
    """``row_get``, and in the same statement the values of ``extras``: SQL expressions over the
    row (its table by name, ``quoted_table``), as the driver returns them; None when there is no row."""
    return _row_get(model, pk, lock, related, extras)


def _row_get(model: type[M], pk: Any, lock: bool, related: str | None, extras: tuple[str, ...]
             ) -> tuple[M, tuple[Any, ...]] | None:
    db = _db()
    if lock and db.get_autocommit():
        raise TransactionManagementError("row_get(lock=True) locks a row for a transaction; call it inside one.")
    sql, fields, related_fields = _get_sql(model, lock, related, extras)
    with db.cursor() as cursor:
        cursor.execute(sql, [_db_value(model._meta.pk, pk, db)])
        row = cursor.fetchone()
        if row is None and lock and related is not None:
            # A lock that waited for a transaction which changed the foreign key (a release change
            # moves workflow.release) rechecks the join against the related row it first read, the
            # old one, and returns no row (PostgreSQL's EvalPlanQual recheck under READ COMMITTED).
            # Read again: a new statement takes a new snapshot, which sees the new related row.
            cursor.execute(sql, [_db_value(model._meta.pk, pk, db)])
            row = cursor.fetchone()
    if row is None:
        return None
    instance = _from_row(model, fields, row[:len(fields)], db)
    if related is not None:
        key = model._meta.get_field(related)
        assert isinstance(key, models.ForeignKey) and not isinstance(key.related_model, str)
        key.set_cached_value(instance, _from_row(key.related_model, related_fields,
                                                 row[len(fields):len(fields) + len(related_fields)], db))
    return instance, tuple(row[len(row) - len(extras):])


Converter = tuple["models.Field[Any, Any]", Any, tuple[Any, ...]]  # a field, its column, its conversions


def _from_row(model: type[M], fields: Sequence[Converter], values: Sequence[Any], db: BaseDatabaseWrapper) -> M:
    converted = []
    for (_, col, conversions), value in zip(fields, values, strict=True):
        for convert in conversions:
            value = convert(value, col, db)
        converted.append(value)
    return model.from_db(db.alias, [field.attname for field, _, _ in fields], converted)


def _converters(model: type[models.Model]) -> list[Converter]:
    """Each concrete field of ``model`` with what turns its column's value into the field's, as the
    ORM's compiler finds them (the backend's, then the field's own ``from_db_value``)."""
    out = []
    for field in model._meta.concrete_fields:
        col = field.get_col(model._meta.db_table)
        out.append((field, col, (*connection.ops.get_db_converters(col), *col.get_db_converters(connection))))
    return out


@functools.cache
def _get_sql(model: type[models.Model], lock: bool, related: str | None, extras: tuple[str, ...] = ()
             ) -> tuple[str, list[Converter], list[Converter]]:
    """The statement of ``row_get`` and the conversions of its columns, made once per shape and process."""
    fields = _converters(model)
    table, pk = quoted_table(model), model._meta.pk
    assert pk is not None
    columns = [f"{table}.{quoted_column(field)}" for field, _, _ in fields]
    join, related_fields = "", []
    if related is not None:
        key = concrete_field(model, related)
        if not isinstance(key, models.ForeignKey) or key.null:
            raise TypeError(f"{model.__name__}.{related} is not a foreign key that cannot be null")
        other = key.related_model
        assert not isinstance(other, str)
        other_table, related_fields = quoted_table(other), _converters(other)
        columns += [f"{other_table}.{quoted_column(field)}" for field, _, _ in related_fields]
        join = (f" INNER JOIN {other_table} ON {other_table}.{quoted_column(key.target_field)}"
                f" = {table}.{quoted_column(key)}")
    columns += [f"({extra})" for extra in extras]
    locking = ""
    if lock and connection.features.has_select_for_update:
        locking = f" {row_lock_clause()}" + (f" OF {table}" if connection.features.has_select_for_update_of else "")
    sql = f"SELECT {', '.join(columns)} FROM {table}{join} WHERE {table}.{quoted_column(pk)} = %s{locking}"
    return sql, fields, related_fields


WhereShape = tuple[tuple[str, int], ...]


def where_shape(where: Where) -> WhereShape:
    """The conditions' names, each with how many values it lists (0 for an equality): what the
    text of a condition depends on (``where_sql``), as a key to cache a statement's text by."""
    return tuple((name, len(value) if isinstance(value, tuple) else 0) for name, value in where.items())


def where_params(model: type[models.Model], where: Where, db: BaseDatabaseWrapper | None = None) -> list[Any]:
    """The values of ``where`` as its fields store them, in the order of ``where_sql``'s ``%s``."""
    db = db or _db()
    params: list[Any] = []
    for name, value in where.items():
        field = concrete_field(model, name.removesuffix(AT_MOST))
        params += [_db_value(field, v, db) for v in (value if isinstance(value, tuple) else (value,))]
    return params


def db_value(model: type[models.Model], name: str, value: Any) -> Any:
    """``value`` as ``model``'s field ``name`` stores it: a parameter for SQL written by hand."""
    return _db_value(concrete_field(model, name), value)


def _db() -> BaseDatabaseWrapper:
    """This thread's connection itself: ``django.db.connection`` is a proxy that looks it up on
    every attribute read (2 µs here), and a statement reads it once per value otherwise."""
    return connections[DEFAULT_DB_ALIAS]


def _db_value(field: models.Field[Any, Any], value: Any, db: BaseDatabaseWrapper | None = None) -> Any:
    """``value`` as the field stores it; a choice (an enum member, such as a default) as its value."""
    db = db or _db()
    fast = _fast_paths(field).get(type(value))
    if fast is not None:  # most values of a statement: skip the field's chain of calls
        return fast(field, value, db)
    return field.get_db_prep_save(value.value if isinstance(value, enum.Enum) else value, db)


@functools.cache
def _fast_paths(field: models.Field[Any, Any]) -> dict[type, FastPath]:
    """What ``field.get_db_prep_save`` makes of its commonest values, by their exact type, done
    directly: a string of a text field and a bool of a boolean field stay as they are; an int of
    an integer field and an aware datetime of a date-time field go straight to
    the backend's adaptation, which is the last step of the field's own (a key: its target's);
    None stays None where the field stores it so (not every field does)."""
    paths = _typed_fast_paths(field)
    if field.get_db_prep_save(None, connection) is None:
        paths = {**paths, type(None): _as_is}
    return paths


def _typed_fast_paths(field: models.Field[Any, Any]) -> dict[type, FastPath]:
    if isinstance(field, models.ForeignKey):
        return _typed_fast_paths(field.target_field)
    if isinstance(field, models.CharField | models.TextField):
        return {str: _as_is}
    if isinstance(field, models.BooleanField):
        return {bool: _as_is}
    if isinstance(field, AutoFieldMixin):
        return {int: _automatic_key}
    if isinstance(field, models.IntegerField):
        return {int: _integer}
    if isinstance(field, models.DateTimeField):
        return {datetime: _datetime}
    return {}


FastPath = Callable[["models.Field[Any, Any]", Any, BaseDatabaseWrapper], Any]


def _as_is(field: models.Field[Any, Any], value: Any, db: BaseDatabaseWrapper) -> Any:
    return value


def _automatic_key(field: models.Field[Any, Any], value: int, db: BaseDatabaseWrapper) -> Any:
    return db.ops.validate_autopk_value(value)


def _integer(field: models.Field[Any, Any], value: int, db: BaseDatabaseWrapper) -> Any:
    return db.ops.adapt_integerfield_value(value, field.get_internal_type())


def _datetime(field: models.Field[Any, Any], value: datetime, db: BaseDatabaseWrapper) -> Any:
    if value.utcoffset() is None:  # naive: the field's own way (a warning, made aware)
        return field.get_db_prep_save(value, db)
    return db.ops.adapt_datetimefield_value(value)


def where_sql(model: type[models.Model], shape: WhereShape) -> str:
    """A condition of the shape ``where_shape`` gives, for SQL written by hand."""
    conditions = []
    for name, count in shape:
        column = quoted_column(concrete_field(model, name.removesuffix(AT_MOST)))
        if count:
            conditions.append(f"{column} IN ({', '.join(['%s'] * count)})")
        else:
            conditions.append(f"{column} <= %s" if name.endswith(AT_MOST) else f"{column} = %s")
    return " AND ".join(conditions)


def _insert_fields(model: type[models.Model], names: tuple[str, ...]) -> list[models.Field[Any, Any]]:
    """Every concrete field but an automatic primary key, and that key too when ``names`` gives it."""
    return [field for field in model._meta.concrete_fields
            if not (field.primary_key and isinstance(field, models.AutoField) and field.name not in names)]


@functools.cache
def _insert_sql(model: type[models.Model], names: tuple[str, ...], count: int) -> str:
    fields = _insert_fields(model, names)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    columns = ", ".join(quoted_column(field) for field in fields)
    return f"INSERT INTO {quoted_table(model)} ({columns}) VALUES {', '.join([row] * count)}"


@functools.cache
def _fields_but_pk(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [field for field in model._meta.concrete_fields if field is not model._meta.pk]


@functools.cache
def _insert_returning_sql(model: type[models.Model]) -> str:
    pk = model._meta.pk
    assert pk is not None
    fields = _fields_but_pk(model)
    returning = f" RETURNING {quoted_column(pk)}" if connection.features.can_return_columns_from_insert else ""
    return (f"INSERT INTO {quoted_table(model)} ({', '.join(quoted_column(f) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))}){returning}")


@functools.cache
def _insert_unless_exists_sql(model: type[models.Model], unique: str) -> str:
    pk, field = model._meta.pk, concrete_field(model, unique)
    assert pk is not None
    if not (field.unique and connection.features.can_return_columns_from_insert):
        raise TypeError(f"{model.__name__}.{unique} is not unique, or the database returns no inserted key")
    fields = _fields_but_pk(model)
    return (f"INSERT INTO {quoted_table(model)} ({', '.join(quoted_column(f) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT ({quoted_column(field)}) DO NOTHING "
            f"RETURNING {quoted_column(pk)}")


def set_sql(model: type[models.Model], names: tuple[str, ...]) -> str:
    """``<column> = %s, …`` for the fields ``names``: an UPDATE's SET, for SQL written by hand."""
    return ", ".join(f"{quoted_column(concrete_field(model, name))} = %s" for name in names)


@functools.cache
def _update_sql(model: type[models.Model], names: tuple[str, ...], shape: WhereShape) -> str:
    return f"UPDATE {quoted_table(model)} SET {set_sql(model, names)} WHERE {where_sql(model, shape)}"


@functools.cache
def _select_sql(model: type[models.Model], names: tuple[str, ...], shape: WhereShape) -> str:
    columns = ", ".join(quoted_column(concrete_field(model, name)) for name in names)
    return f"SELECT {columns} FROM {quoted_table(model)} WHERE {where_sql(model, shape)}"


@functools.cache
def _exists_sql(model: type[models.Model], shape: WhereShape) -> str:
    return f"SELECT 1 FROM {quoted_table(model)} WHERE {where_sql(model, shape)} LIMIT 1"
