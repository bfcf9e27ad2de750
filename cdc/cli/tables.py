"""``cdc status``, ``cdc optimize`` and ``cdc vacuum``: the warehouse's tables, read and kept."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cdc.cli.common import Commands, Options, add_command, lakehouse
from cdc.core.config import Settings
from cdc.core.errors import SourceError


def status(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0, or SourceError's code when Kafka did not answer (the lag it prints is then unknown)."""
    lake = lakehouse(settings)
    if args.html is not None:
        page = lake.status_page(args.html, pipeline=args.pipeline)
        print(f"status page: {page}")
        return 0
    found = lake.status()
    unknown_lag = 0 if found.kafka_error is None else SourceError.exit_code
    if args.json:
        print(json.dumps(found.as_dict(), indent=2))
        return unknown_lag
    print(
        f"{'raw table':<32} {'version':>7} {'rows':>12} {'gaps':>4} {'quarantined':>11}  partitions (consumed/end, lag)"
    )
    for table in found.raw_tables:
        partitions = " ".join(
            f"p{p.partition} {p.consumed}/{'?' if p.end is None else p.end} lag {'?' if p.lag is None else p.lag}"
            for p in table.partitions
        )
        counts = f"{table.version:>7} {table.rows:>12,} {table.recorded_gaps:>4} {table.quarantined:>11,}"
        print(f"{table.topic:<32} {counts}  {partitions}")
    if found.refined_tables:
        print(
            f"\n{'refined table':<32} {'last batch':>10} {'raw version':>11} {'behind':>8} "
            f"{'batch p50/p95 s':>15} {'lag p50/p95 s':>15}  last error"
        )
    for refined in found.refined_tables:
        failure = refined.last_error
        fresh = refined.freshness
        seconds = f"{fresh.batch_p50_s:.1f}/{fresh.batch_p95_s:.1f}" if fresh else "-"
        lag = f"{fresh.lag_p50_s:.1f}/{fresh.lag_p95_s:.1f}" if fresh and fresh.lag_p95_s is not None else "-"
        print(
            f"{refined.name:<32} {_or_none(refined.last_batch):>10} {_or_none(refined.raw_version):>11} "
            f"{_or_none(refined.behind):>8} {seconds:>15} {lag:>15}  "
            + (f"{failure.at} batch {failure.batch}: {failure.error}" if failure else "-")
        )
    # Columns as wide as their longest name.
    width = max([24, *(len(total.expectation) for total in found.expectations)])
    if found.expectations:
        print(f"\n{'table':<40} {'expectation':<{width}} {'action':<6} {'batches':>7} {'passed':>12} {'failed':>10}")
    for total in found.expectations:
        print(
            f"{total.table:<40} {total.expectation:<{width}} {total.action:<6} {total.batches:>7} {total.passed:>12,} "
            f"{total.failed:>10,}"
        )
    if found.kafka_error is not None:
        print(
            f"cdc: warning: the lag is unknown, Kafka's end offsets could not be read: {found.kafka_error}",
            file=sys.stderr,
        )
        return unknown_lag
    return 0


def _or_none(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def optimize(args: argparse.Namespace, settings: Settings) -> int:
    zorder_by = [column.strip() for column in (args.zorder_by or "").split(",") if column.strip()]
    lake = lakehouse(settings)
    result = lake.optimize(args.table, zorder_by=zorder_by)
    if result.files_removed == 0:
        print(f"optimized {result.location}: already compact, no file rewritten")
    else:
        files = "1 file" if result.files_removed == 1 else f"{result.files_removed} files"
        done = f"Z-ordered by {', '.join(zorder_by)} into" if zorder_by else "compacted into"
        print(f"optimized {result.location}: {files} {done} {result.files_added}")
    return 0


def vacuum(args: argparse.Namespace, settings: Settings) -> int:
    result = lakehouse(settings).vacuum(
        args.table,
        retain_hours=args.retain_hours,
        below_safe_minimum=args.i_know_vacuum_below_retention_loses_time_travel,
    )
    deleted = "" if result.deleted is None else f": {result.deleted} files and directories deleted"
    retained = "" if args.retain_hours is None else f" (retained {args.retain_hours:g} hours)"
    print(f"vacuumed {result.location}{deleted}{retained}")
    return 0


def add_commands(commands: Commands, options: Options) -> None:
    showing = add_command(
        commands,
        "status",
        status,
        "list raw tables (Delta version, rows, consumed vs end offsets: lag), refined tables (last batch, "
        "raw changes not refined yet, last error) and expectation totals",
        [options.warehouse, options.kafka, options.as_json],
    )
    showing.add_argument(
        "--html", type=Path, metavar="PAGE", help="write the status as a page: the DAG with these numbers on each node"
    )
    showing.add_argument(
        "--pipeline", type=Path, metavar="FILE", help="with --html: draw this pipeline's DAG (business tables too)"
    )
    table = argparse.ArgumentParser(add_help=False)
    table.add_argument(
        "--table",
        required=True,
        metavar="PATH_OR_NAME",
        help="a Delta table's path or URI, a path under the warehouse (refined/TOPIC), or a catalog name",
    )
    compact = add_command(
        commands,
        "optimize",
        optimize,
        "compact a Delta table's small files, optionally Z-ordered",
        [options.warehouse, table],
    )
    compact.add_argument("--zorder-by", metavar="COLUMN,...", help="cluster the rows by these columns (Z-order)")
    clean = add_command(
        commands,
        "vacuum",
        vacuum,
        "delete files older versions of a Delta table no longer need",
        [options.warehouse, table],
    )
    clean.add_argument(
        "--retain-hours",
        type=float,
        metavar="N",
        help="keep the files that versions of the last N hours need "
        "(default: the table's retention, 168); below 168 is refused unless overridden",
    )
    clean.add_argument(
        "--i-know-vacuum-below-retention-loses-time-travel",
        action="store_true",
        help="allow a retention below 168 hours (never on raw tables)",
    )
