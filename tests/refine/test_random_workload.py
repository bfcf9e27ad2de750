"""Randomized differential test: seeded random transactions through the real connector, refined in
batches of random sizes, compared with Postgres read back with psycopg (cdc/stack/random_workload.py).

Each run takes a fresh seed, printed (and named in a failure's message); ``CDC_RANDOM_SEED=<seed>``
replays one. The transactions are refined all in one batch first, then after one transaction, then
after the connector is re-created (a few transactions while none streams, then a new snapshot of every
row into the same topics), then after random numbers of them; before each batch after the first, a
random suffix of each topic is delivered again (as a restarted Kafka Connect task does). The refined
tables, the history's current versions and the child table must equal Postgres after every batch, in
the Spark types their Postgres types refine to, and again after a rerun. Every run adds, renames, drops
and widens columns at random points (refined with the rename declared).
"""

import os
import random

import psycopg
import pytest

from cdc.core.config import validate
from cdc.raw.config import RawJobConfig
from cdc.raw.job import run_raw_job
from cdc.stack.random_workload import RENAMES, RandomTables, RandomWorkload, compare, wait_for_marks

TRANSACTIONS = int(os.environ.get("CDC_RANDOM_TRANSACTIONS", "24"))


@pytest.mark.timeout(2400)  # about ten refine runs: a few minutes alone, far longer on a shared, loaded machine
def test_random_transactions_refine_equal_to_postgres(
    spark, kafka, stack_config, postgres_connector, recreate_postgres_connector, tmp_path, unique_name, refine
):
    seed = int(os.environ.get("CDC_RANDOM_SEED") or random.randrange(2**32))
    print(f"random workload: CDC_RANDOM_SEED={seed}")
    rng = random.Random(seed)
    dsn, warehouse, prefix = stack_config.postgres.dsn(), str(tmp_path), postgres_connector.topic_prefix
    tables = RandomTables(f"r{unique_name}")
    topics = [tables.topic(prefix, table) for table in tables.names]
    settings = {
        tables.keyed: {"history": True, "explode": ["tags"], "renames": RENAMES},
        tables.pair: {"history": True, "renames": RENAMES},
        tables.bag: {"renames": RENAMES},
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables.create(conn, publication=postgres_connector.name)
    workload = RandomWorkload(dsn, tables, rng, schema_changes_by=TRANSACTIONS - 2)
    replays, replayed = random.Random(seed + 1), 0  # apart, so the seed's statements do not depend on them
    # Where each topic's records may be delivered again from: a task restarted sends again what its own
    # connector sent, never what a connector before a new snapshot did (a keyless table could not tell).
    replay_from = dict.fromkeys(topics, 0)
    batches, snapshotted = 0, False

    def refine_and_compare() -> None:
        nonlocal batches, replayed, snapshotted
        batches += 1
        wait_for_marks(kafka.bootstrap_servers, topics, workload.mark())
        for topic in topics:
            records = kafka.records(topic)
            if snapshotted:  # the batch holding the new snapshot: from now on, only what follows it
                replay_from[topic] = len(records)
            elif batches > 1 and len(records) > replay_from[topic]:  # Kafka Connect delivers at least once
                again = records[replays.randrange(replay_from[topic], len(records)) :]
                kafka.produce_again(topic, again)
                replayed += len(again)
        snapshotted = False
        raw = {
            "topics": {"kind": "topics", "topics": topics},
            "warehouse": warehouse,
            "trigger": {"kind": "available_now"},
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        }
        run_raw_job(spark, validate(RawJobConfig, raw, "raw job"), say=lambda line: None)
        for table, topic in zip(tables.names, topics, strict=False):
            refine(warehouse, topic, **settings[table])
        print(f"random workload: refine run {batches} after {workload.counts.transactions} transactions", flush=True)
        mismatched = [
            result
            for result in compare(spark, dsn, tables, warehouse, dict(zip(tables.names, topics, strict=False)))
            if result.mismatches
        ]
        assert not mismatched, (
            f"CDC_RANDOM_SEED={seed}, refine run {batches} after {workload.counts.transactions} "
            "transactions:\n" + "\n".join(result.describe() for result in mismatched)
        )

    try:
        for _ in range(TRANSACTIONS // 3):  # all in one batch
            workload.transaction()
        refine_and_compare()
        workload.transaction()  # a batch of one transaction
        refine_and_compare()

        def while_away() -> None:  # changes no connector streams: the new one's snapshot reads their result
            for _ in range(3):
                workload.transaction()
            while workload.held_for:  # a replication slot is made only once no transaction is open
                workload.transaction()
            # A marker row in each table (a truncate while away may have emptied one): a snapshot of an empty
            # table sends no read to tell it from a table the snapshot left out, so the rows deleted while
            # away would stay (a limit docs/concepts/guarantees-and-limits.md states).
            workload.mark()

        recreate_postgres_connector(while_away)  # snapshot reads of every row, into the same topics
        snapshotted = True
        refine_and_compare()
        while workload.counts.transactions < TRANSACTIONS:  # batches of random sizes
            for _ in range(rng.randint(4, 12)):
                workload.transaction()
            refine_and_compare()
        while workload.held_for or workload.schema_changes_pending:  # the held transaction commits
            workload.transaction()
        refine_and_compare()
        refine_and_compare()  # a rerun changes nothing
        print(f"random workload: {workload.counts}, {replayed} records delivered twice")
        assert replayed, "no record was delivered twice"
        done = workload.counts.statements
        at_least = {"add column": 3, "rename column": 1, "drop column": 1, "widen column": 2}
        assert all(done[kind] >= count for kind, count in at_least.items()), done
    finally:
        workload.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            tables.drop(conn)
