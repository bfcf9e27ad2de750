"""A seeded random workload on three tables of its own, and their comparison with the refined tables.

Used by the randomized differential test (tests/refine/test_random_workload.py) and the soak
(bench/soak.py). The tables, in ``shop`` (which the shipped connector captures), with TOASTed
columns (``STORAGE EXTERNAL``: every large value is out of line, so an update that leaves it alone
makes Debezium send its placeholder):

- ``<prefix>_keyed`` (``id`` primary key; ``tags``, a text array, is the child table's array);
- ``<prefix>_pair`` (composite primary key ``a, b``);
- ``<prefix>_bag`` (no primary key, ``REPLICA IDENTITY FULL``: a multiset, equal rows included).

Each transaction is a few random statements: inserts, updates that leave the TOASTed columns alone,
updates of them, primary-key changes (chains of them too, with updates between), deletes and
re-inserts of the same key, and rarely a truncate or an ``ADD COLUMN``. A second connection
sometimes holds a transaction open (inserting and updating rows of its own) while others commit.
Given ``schema_changes_by``, every run also changes each table's schema at random points before that
transaction (:data:`RENAMES` is the refinement's ``renames`` then): a column added to each table, then
renamed at one table, dropped at another and widened (``integer -> bigint``, with values beyond
``integer`` after) at the third, and ``n`` widened at one. The same seed gives the same statements, so a
failure is replayed by its seed.

The oracle is Postgres itself: :func:`compare` reads each table back with psycopg and compares it,
normalised, with the refined table, the history's current versions and the child table.
"""

from __future__ import annotations

import random
import string
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from cdc.stack.postgres import add_to_publication

SCHEMA = "shop"
MARK = "mark-"  # the notes of the marker rows that tell when a table's changes are all in Kafka
ADDED = "s_col"  # the column each table gains mid-stream, then renamed, dropped or widened
RENAMES = {ADDED: "s_renamed"}  # the renames refinement is told of
BEYOND_INTEGER = 3_000_000_000


@dataclass
class RandomTables:
    """The workload's tables, named from ``prefix``."""

    prefix: str

    @property
    def keyed(self) -> str:
        return f"{self.prefix}_keyed"

    @property
    def pair(self) -> str:
        return f"{self.prefix}_pair"

    @property
    def bag(self) -> str:
        return f"{self.prefix}_bag"

    @property
    def names(self) -> tuple[str, str, str]:
        return self.keyed, self.pair, self.bag

    def topic(self, topic_prefix: str, table: str) -> str:
        return f"{topic_prefix}.{SCHEMA}.{table}"

    def create(self, conn: psycopg.Connection, publication: str | None = None) -> None:
        """Create the tables (and add them to a connector's ``publication``, when it exists already)."""
        conn.execute(f"CREATE TABLE {SCHEMA}.{self.keyed} (id int PRIMARY KEY, n int, notes text, tags text[])")
        conn.execute(f"CREATE TABLE {SCHEMA}.{self.pair} (a int, b text, n int, notes text, PRIMARY KEY (a, b))")
        conn.execute(f"CREATE TABLE {SCHEMA}.{self.bag} (a int, n int, notes text)")
        conn.execute(f"ALTER TABLE {SCHEMA}.{self.bag} REPLICA IDENTITY FULL")
        conn.execute(
            f"ALTER TABLE {SCHEMA}.{self.keyed} ALTER COLUMN notes SET STORAGE EXTERNAL, "
            "ALTER COLUMN tags SET STORAGE EXTERNAL"
        )
        for table in (self.pair, self.bag):
            conn.execute(f"ALTER TABLE {SCHEMA}.{table} ALTER COLUMN notes SET STORAGE EXTERNAL")
        if publication is not None:
            for table in self.names:
                add_to_publication(conn, publication, f"{SCHEMA}.{table}")

    def drop(self, conn: psycopg.Connection) -> None:
        for table in self.names:
            conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{table}")


@dataclass
class WorkloadCounts:
    """What a run did: statements by kind, transactions, the changes Debezium sends for them."""

    statements: Counter[str] = field(default_factory=Counter)
    transactions: int = 0
    changes: int = 0  # rows changed (each row of an update, delete or insert; a truncate counts one)


class RandomWorkload:
    """Random transactions on ``tables`` through two connections (one may hold a transaction open)."""

    def __init__(
        self, dsn: str, tables: RandomTables, rng: random.Random, schema_changes_by: int | None = None
    ) -> None:
        self.tables, self.rng = tables, rng
        self.conn = psycopg.connect(dsn)
        self.held = psycopg.connect(dsn)  # the connection whose transaction stays open while others commit
        self.held_for = 0  # transactions of the main connection still to commit before the held one does
        self.next_key = 1
        self.deleted: dict[str, list[tuple]] = {table: [] for table in tables.names}  # keys to insert again
        self.added: dict[str, list[str]] = {table: [] for table in tables.names}  # columns added mid-stream
        self.counts = WorkloadCounts()
        self.marks = 0
        self.wide: set[tuple[str, str]] = set()  # (table, column) widened to bigint: values beyond integer
        self.schema_changes: list[tuple[int, str, str]] = []  # (before transaction, kind, table), in order
        if schema_changes_by is not None:
            adds = [("add", table) for table in rng.sample(tables.names, 3)]
            follow_ups = list(zip(["rename", "drop", "widen"], rng.sample(tables.names, 3), strict=True))
            kinds = [*adds, ("widen n", rng.choice(tables.names)), *rng.sample(follow_ups, 3)]
            at = sorted(rng.choices(range(1, max(schema_changes_by, 2)), k=len(kinds)))  # a few may share one
            self.schema_changes = [(when, kind, table) for when, (kind, table) in zip(at, kinds, strict=True)]

    def close(self) -> None:
        for conn in (self.conn, self.held):
            conn.rollback()
            conn.close()

    # -- values

    def _key(self) -> int:
        self.next_key += 1
        return self.next_key

    def _notes(self) -> str | None:
        kind = self.rng.random()
        if kind < 0.1:
            return None
        if kind < 0.3:
            return "".join(self.rng.choices(string.ascii_lowercase, k=self.rng.randint(0, 12)))
        # Large: TOASTed (out of line from ~2 KB).
        return "".join(self.rng.choices(string.ascii_letters + string.digits, k=self.rng.randint(2500, 20000)))

    def _tags(self) -> list[str] | None:
        kind = self.rng.random()
        if kind < 0.15:
            return None
        size = self.rng.randint(0, 4) if kind < 0.7 else self.rng.randint(60, 150)  # large: TOASTed
        return ["".join(self.rng.choices(string.ascii_lowercase, k=self.rng.randint(1, 40))) for _ in range(size)]

    # -- statements

    def _run(self, conn: psycopg.Connection, kind: str, sql: str, params: tuple = (), rows: int | None = None) -> None:
        cursor = conn.execute(sql, params)
        self.counts.statements[kind] += 1
        self.counts.changes += cursor.rowcount if rows is None else rows

    def _existing(self, conn: psycopg.Connection, table: str, columns: str) -> list[tuple]:
        return conn.execute(
            f"SELECT {columns} FROM {SCHEMA}.{table} WHERE notes IS DISTINCT FROM "
            f"'{MARK}' || n::text ORDER BY {columns}"
        ).fetchall()

    def _value(self, table: str, column: str) -> int:
        """A value of ``column``: small, or beyond integer once the column is a bigint."""
        small = self.rng.randint(-5, 5) if column != "n" else self.rng.randint(0, 1000)
        return small + BEYOND_INTEGER if (table, column) in self.wide and self.rng.random() < 0.5 else small

    def _extra(self, table: str) -> tuple[str, tuple]:
        """``, col = %s`` for each added column, and their values."""
        columns = self.added[table]
        return "".join(f", {c} = %s" for c in columns), tuple(self._value(table, c) for c in columns)

    def _insert(self, conn: psycopg.Connection, table: str, key: tuple | None = None) -> tuple:
        t, columns = self.tables, self.added[table]
        extra_values = tuple(self._value(table, c) for c in columns)
        names = "".join(f", {c}" for c in columns)
        marks = ", %s" * len(columns)
        n = self._value(table, "n")
        if table == t.keyed:
            key = key or (self._key(),)
            self._run(
                conn,
                "insert",
                f"INSERT INTO {SCHEMA}.{table} (id, n, notes, tags{names}) VALUES (%s, %s, %s, %s{marks})",
                (*key, n, self._notes(), self._tags(), *extra_values),
            )
        elif table == t.pair:
            key = key or (self._key(), self.rng.choice("xyz"))
            self._run(
                conn,
                "insert",
                f"INSERT INTO {SCHEMA}.{table} (a, b, n, notes{names}) VALUES (%s, %s, %s, %s{marks})",
                (*key, n, self._notes(), *extra_values),
            )
        else:
            self._run(
                conn,
                "insert",
                f"INSERT INTO {SCHEMA}.{table} (a, n, notes{names}) VALUES (%s, %s, %s{marks})",
                (self.rng.randint(0, 3), n, self._notes(), *extra_values),
            )
        return key or ()

    def _statement(self, conn: psycopg.Connection, held: bool) -> None:
        """One random statement (``held``: in the held transaction, which touches only rows it inserts)."""
        t, rng = self.tables, self.rng
        table = rng.choice(t.names)
        if held:
            key = self._insert(conn, table)
            if rng.random() < 0.5 and table != t.bag:  # and update it, leaving its TOASTed values alone
                where, params = ("id = %s", key) if table == t.keyed else ("a = %s AND b = %s", key)
                self._run(conn, "update", f"UPDATE {SCHEMA}.{table} SET n = n + 1 WHERE {where}", params)
            return
        key_columns = {t.keyed: "id", t.pair: "a, b", t.bag: "ctid"}[table]
        rows = self._existing(conn, table, key_columns)
        choice = rng.random()
        if not rows or choice < 0.25:
            deleted = self.deleted[table]
            if deleted and rng.random() < 0.4:  # the same key again
                self._insert(conn, table, deleted.pop(rng.randrange(len(deleted))))
            elif table == t.bag and rows and rng.random() < 0.3:  # an equal row: a duplicate
                self._run(
                    conn,
                    "insert duplicate",
                    f"INSERT INTO {SCHEMA}.{table} SELECT * FROM {SCHEMA}.{table} WHERE ctid = %s",
                    (rng.choice(rows)[0],),
                )
            else:
                self._insert(conn, table)
            return
        row = rng.choice(rows)
        where = {t.keyed: "id = %s", t.pair: "a = %s AND b = %s", t.bag: "ctid = %s"}[table]
        extra, extra_values = self._extra(table)
        if choice < 0.5:  # leaves the TOASTed columns alone
            self._run(
                conn, "update", f"UPDATE {SCHEMA}.{table} SET n = n + 1{extra} WHERE {where}", (*extra_values, *row)
            )
        elif choice < 0.6:
            column, value = (
                ("tags", self._tags()) if table == t.keyed and rng.random() < 0.5 else ("notes", self._notes())
            )
            self._run(conn, "update toasted", f"UPDATE {SCHEMA}.{table} SET {column} = %s WHERE {where}", (value, *row))
        elif choice < 0.8 and table != t.bag:  # a chain of primary-key changes, updates between
            for _ in range(rng.choice([1, 1, 2, 3])):
                new = (self._key(),) if table == t.keyed else (self._key(), rng.choice("xyz"))
                sets = "id = %s" if table == t.keyed else "a = %s, b = %s"
                self._run(conn, "key change", f"UPDATE {SCHEMA}.{table} SET {sets} WHERE {where}", (*new, *row), rows=2)
                row = new
                if rng.random() < 0.4:
                    self._run(conn, "update", f"UPDATE {SCHEMA}.{table} SET n = n + 1 WHERE {where}", row)
        elif choice < 0.97:
            self._run(conn, "delete", f"DELETE FROM {SCHEMA}.{table} WHERE {where}", row)
            if table != t.bag:
                self.deleted[table].append(row)
        elif self.held_for == 0 and rng.random() < 0.5:  # (a truncate or ALTER would wait for the held transaction)
            self._run(conn, "truncate", f"TRUNCATE {SCHEMA}.{table}", rows=1)
            self.deleted[table].clear()
        elif self.held_for == 0 and sum(c.startswith("extra") for c in self.added[table]) < 2:
            column = f"extra{sum(c.startswith('extra') for c in self.added[table]) + 1}"  # never a name taken
            self._run(conn, "add column", f"ALTER TABLE {SCHEMA}.{table} ADD COLUMN {column} int", rows=0)
            self.added[table].append(column)

    def _schema_change(self, kind: str, table: str) -> None:
        """ALTER ``table`` as ``kind`` says, in a transaction of its own, and write a row that needs the new
        shape."""
        conn, name = self.conn, f"{SCHEMA}.{table}"
        if kind == "add":
            self._run(conn, "add column", f"ALTER TABLE {name} ADD COLUMN {ADDED} int", rows=0)
            self.added[table].append(ADDED)
        elif kind == "rename":
            self._run(conn, "rename column", f"ALTER TABLE {name} RENAME COLUMN {ADDED} TO {RENAMES[ADDED]}", rows=0)
            self.added[table] = [RENAMES[ADDED] if c == ADDED else c for c in self.added[table]]
        elif kind == "drop":
            self._run(conn, "drop column", f"ALTER TABLE {name} DROP COLUMN {ADDED}", rows=0)
            self.added[table].remove(ADDED)
        else:
            column = "n" if kind == "widen n" else ADDED
            self._run(conn, "widen column", f"ALTER TABLE {name} ALTER COLUMN {column} TYPE bigint", rows=0)
            self.wide.add((table, column))
        self._insert(conn, table)
        conn.commit()

    @property
    def schema_changes_pending(self) -> bool:
        return bool(self.schema_changes)

    def transaction(self) -> None:
        """One random transaction of the main connection; the held one may begin or commit around it. A
        schema change due comes first, when no transaction is held (it would wait for the held one's locks)."""
        while self.held_for == 0 and self.schema_changes and self.schema_changes[0][0] <= self.counts.transactions:
            _, kind, table = self.schema_changes.pop(0)
            self._schema_change(kind, table)
        if self.held_for == 0 and self.rng.random() < 0.12:
            for _ in range(self.rng.randint(1, 3)):
                self._statement(self.held, held=True)
            self.held_for = self.rng.randint(1, 5)
        for _ in range(self.rng.randint(1, 4)):
            self._statement(self.conn, held=False)
        self.conn.commit()
        self.counts.transactions += 1
        if self.held_for:
            self.held_for -= 1
            if self.held_for == 0:
                self.held.commit()
                self.counts.transactions += 1

    def mark(self) -> int:
        """Write a new marker row to each table, in a transaction of its own: once each topic's last
        record is its marker, every change committed before is in Kafka. Returns the marker's number."""
        self.marks += 1
        number, t = self.marks, self.tables
        with self.conn.transaction():
            self.conn.execute(
                f"INSERT INTO {SCHEMA}.{t.keyed} (id, n, notes) VALUES (-1, %s, %s) ON CONFLICT (id) DO "
                "UPDATE SET n = EXCLUDED.n, notes = EXCLUDED.notes",
                (number, f"{MARK}{number}"),
            )
            self.conn.execute(
                f"INSERT INTO {SCHEMA}.{t.pair} (a, b, n, notes) VALUES (-1, 'm', %s, %s) ON CONFLICT (a, b) "
                "DO UPDATE SET n = EXCLUDED.n, notes = EXCLUDED.notes",
                (number, f"{MARK}{number}"),
            )
            self.conn.execute(f"DELETE FROM {SCHEMA}.{t.bag} WHERE notes LIKE '{MARK}%%'")
            self.conn.execute(
                f"INSERT INTO {SCHEMA}.{t.bag} (a, n, notes) VALUES (-1, %s, %s)", (number, f"{MARK}{number}")
            )
        self.conn.commit()
        return number


def wait_for_marks(bootstrap_servers: str, topics: list[str], number: int, timeout_s: float = 120) -> None:
    """Wait until the last record of each topic is marker ``number``'s (see :meth:`RandomWorkload.mark`)."""
    from kafka import KafkaConsumer, TopicPartition

    wanted = f'"notes":"{MARK}{number}"'.encode()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + timeout_s
        waiting = list(topics)
        while waiting:
            topic = waiting[0]
            partition = TopicPartition(topic, 0)
            end = consumer.end_offsets([partition])[partition] if consumer.partitions_for_topic(topic) else 0
            last = None
            if end:
                consumer.assign([partition])
                consumer.seek(partition, end - 1)
                records = consumer.poll(timeout_ms=2000).get(partition, [])
                last = records[-1].value if records else None
            if last is not None and wanted in last:
                waiting.pop(0)
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"marker {number} did not reach {topic} within {timeout_s:.0f} s")
            time.sleep(0.3)
    finally:
        consumer.close()


@dataclass
class Comparison:
    """One refined table (or history, or child table) against its source rows."""

    name: str
    rows: int  # rows in Postgres
    missing: list  # rows of Postgres not in the refined table (a sample)
    extra: list  # rows of the refined table not in Postgres (a sample)
    mismatches: int  # rows missing plus rows extra

    def describe(self) -> str:
        def short(row) -> str:
            return str(
                tuple(value[:30] + "..." if isinstance(value, str) and len(value) > 30 else value for value in row)
            )

        lines = [f"{self.name}: {self.rows} rows, {self.mismatches} mismatched"]
        lines += [f"  only in Postgres: {short(row)}" for row in self.missing]
        lines += [f"  only refined:     {short(row)}" for row in self.extra]
        return "\n".join(lines)


def compare(
    spark, dsn: str, tables: RandomTables, warehouse: str, refined_names: dict[str, str], samples: int = 5
) -> list[Comparison]:
    """Each refined table (named by ``refined_names``, by source table), the keyed tables' history
    current versions (and the shape of all their versions) and the child table of ``tags``, against Postgres
    read with psycopg (a column the refined table lacks counts as NULLs: no change since it was added). A
    refined column whose Spark type is not the one its Postgres type refines to is a mismatch of its own
    (``<table> types``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DataType, IntegerType, LongType, StringType, StructField, StructType

    from refine.apply.flatten import child_table_name
    from refine.apply.rules import history_table_name
    from refine.config import refined_table_location

    spark_types = {  # by information_schema's data_type
        "integer": IntegerType(),
        "bigint": LongType(),
        "text": StringType(),
        "ARRAY": ArrayType(StringType()),  # text[] is the only array here
    }

    def source(query: str, columns: dict[str, DataType]):
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(query).fetchall()
        schema = StructType([StructField(name, data_type) for name, data_type in columns.items()])
        return spark.createDataFrame(rows, schema), len(rows)

    def refined(name: str, columns: dict[str, DataType], current_only: bool = False):
        """The table's ``columns`` as ``columns`` types them, and a Comparison of the types it holds them in."""
        table = spark.read.format("delta").load(refined_table_location(warehouse, name))
        if current_only:
            table = table.where("_cdc_is_current")
        held = {field.name: field.dataType for field in table.schema}
        wrong = {c: held[c] for c, data_type in columns.items() if c in held and held[c] != data_type}
        types = Comparison(
            f"{name} types",
            len(columns),
            [(c, columns[c].simpleString()) for c in wrong],
            [(c, data_type.simpleString()) for c, data_type in wrong.items()],
            len(wrong),
        )
        values = table.select(
            *[(F.col(c) if c in held else F.lit(None)).cast(data_type).alias(c) for c, data_type in columns.items()]
        )
        return values, types

    def columns_of(table: str) -> dict[str, DataType]:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                (SCHEMA, table),
            ).fetchall()
        return {name: spark_types[data_type] for name, data_type in rows}

    def diff(name: str, expected, actual) -> Comparison:
        """One query: each distinct row with its count in Postgres minus its count refined (multisets)."""
        (expected, rows), columns = expected, actual.columns
        counted = expected.withColumn("_side", F.lit(1)).unionByName(actual.withColumn("_side", F.lit(-1)))
        differing = counted.groupBy(*columns).agg(F.sum("_side").alias("_surplus")).where("_surplus != 0").collect()
        missing = [row[:-1] for row in differing if row["_surplus"] > 0]
        extra = [row[:-1] for row in differing if row["_surplus"] < 0]
        mismatches = sum(abs(row["_surplus"]) for row in differing)
        return Comparison(name, rows, missing[:samples], extra[:samples], mismatches)

    results = []

    def compared(name: str, expected, actual) -> None:
        values, types = actual
        results.extend([diff(name, expected, values), types])

    def history_chain(name: str, key: list[str]) -> Comparison:
        """Versions that break the history's shape: a change held twice (same key, LSN, op and kind: one
        delivered again), a validity that does not end where the key's next version starts (a delete's where it
        starts), a current flag on any but a key's last version, unless that is a delete."""
        history = spark.read.format("delta").load(refined_table_location(warehouse, name))
        order = Window.partitionBy(*key).orderBy("_cdc_lsn", "_cdc_offset")
        last = F.lead("_cdc_valid_from").over(order)
        is_last = F.lead(F.lit(True)).over(order).isNull()
        held_twice = F.count(F.lit(1)).over(Window.partitionBy(*key, "_cdc_lsn", "_cdc_op", "_cdc_is_deleted")) > 1
        wrong = (
            history.withColumn("_twice", held_twice)
            .withColumn("_to", F.when(F.col("_cdc_is_deleted"), F.col("_cdc_valid_from")).otherwise(last))
            .withColumn("_current", is_last & ~F.col("_cdc_is_deleted"))
            .where("_twice OR NOT _cdc_valid_to <=> _to OR _cdc_is_current != _current")
            .select(*key, "_cdc_lsn", "_cdc_offset", "_cdc_is_deleted", "_cdc_valid_to", "_to", "_twice")
        )
        count = wrong.count()
        return Comparison(f"{name} versions", history.count(), [], [tuple(r) for r in wrong.take(samples)], count)

    for table in tables.names:
        topic, columns = refined_names[table], columns_of(table)
        rows = source(f"SELECT {', '.join(columns)} FROM {SCHEMA}.{table}", columns)
        compared(table, rows, refined(topic, columns))
        if table != tables.bag:
            compared(f"{table} history", rows, refined(history_table_name(topic), columns, current_only=True))
            results.append(history_chain(history_table_name(topic), ["id"] if table == tables.keyed else ["a", "b"]))
    child_columns: dict[str, DataType] = {"id": IntegerType(), "pos": IntegerType(), "value": StringType()}
    children = source(
        f"SELECT k.id, t.ord::int - 1, t.v FROM {SCHEMA}.{tables.keyed} k, unnest(k.tags) WITH ORDINALITY AS t(v, ord)",
        child_columns,
    )
    child = child_table_name(refined_names[tables.keyed], "tags")
    compared(f"{tables.keyed} tags", children, refined(child, child_columns))
    return results
