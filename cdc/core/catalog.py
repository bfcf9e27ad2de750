"""Tables by name: each raw, refined and business table registered in Spark's catalog as an external
Delta table at its path (``CREATE TABLE IF NOT EXISTS <schema>.<name> USING delta LOCATION ...``), so
that ``spark.sql("SELECT * FROM refined.customers")`` works from any session pointed at the catalog.

The session (:func:`catalog_conf`, from :class:`~cdc.core.config.CatalogConfig`) turns Spark's Hive
support on, with an embedded Derby metastore in a folder or an external metastore, and records the
schema of each layer in its own settings (``spark.cdc.catalog.schema.<layer>``): the helpers that create
tables register them (:func:`register_table`) when those are set, and do nothing otherwise.

A table is registered when its job creates it or first meets it (the job remembers that, nothing here
does), never per batch: a Delta table registered by location reads its schema from its log, so added
columns show through the name without registering again. Its name is the table's folder name (a split
table's: ``<table>__<value>``) with every character the Hive metastore refuses (anything but letters,
digits and ``_``) made ``_``, lower-cased as the metastore keeps it: ``raw.demo_shop_customers``. Two
tables whose names meet so, or a name the catalog holds for another location, fail with a TableError
naming both; so does a name longer than the metastore keeps (256 characters).

The embedded metastore is Derby's, which one JVM at a time opens: with Hive support on, every job
process opens it (a path's SQL, ``delta.`<path>```, asks the catalog first), so a second process fails
while one runs. Jobs that run side by side, or readers beside a running job, need an external metastore
(``metastore_uris``).
"""

from __future__ import annotations

import re
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from cdc.core.config import CatalogConfig
from cdc.core.errors import TableError
from cdc.core.storage import normalize_location

LAYERS = ("raw", "refined", "business")
_SCHEMA_SETTING = "spark.cdc.catalog.schema.{layer}"
_NOT_IN_A_NAME = re.compile(r"[^a-z0-9_]")
# The Hive metastore keeps a table's name in a VARCHAR(256) (TBLS.TBL_NAME).
MAX_NAME_LENGTH = 256


def catalog_conf(config: CatalogConfig, metastore_dir: Path) -> dict[str, str]:
    """The session settings of ``config`` (none when it is off): Hive support, the metastore, and each
    layer's schema for :func:`register_table`."""
    if not config.enabled:
        return {}
    folder = metastore_dir.expanduser().absolute()
    conf = {
        "spark.sql.catalogImplementation": "hive",
        # CREATE SCHEMA makes a folder per schema: in the metastore's folder, not the working directory.
        "spark.sql.warehouse.dir": str(folder / "schemas"),
        **{_SCHEMA_SETTING.format(layer=layer): getattr(config, f"{layer}_schema") for layer in LAYERS},
    }
    if config.metastore_uris:
        conf["spark.hadoop.hive.metastore.uris"] = config.metastore_uris
    else:
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true"
        )
    return conf


def derby_log_option(config: CatalogConfig, metastore_dir: Path) -> list[str]:
    """The JVM option that keeps Derby's log file in the metastore's folder (else: the working directory's)."""
    if not config.enabled or config.metastore_uris:
        return []
    return [f"-Dderby.stream.error.file={metastore_dir.expanduser().absolute() / 'derby.log'}"]


def table_name(location: str) -> tuple[str, str] | None:
    """The layer and the catalog name (unqualified) of the table at ``location``: ``<warehouse>/<layer>/<name>``,
    or a split table's ``<warehouse>/refined/<name>/<value>``. None for a location outside the layers (and
    for the tool's own tables under ``_cdc/``)."""
    parts = location.rstrip("/").split("/")
    if "_cdc" in parts:  # the tool's own tables, and a rebuild's staged ones
        return None
    if len(parts) >= 2 and parts[-2] in LAYERS:
        layer, name = parts[-2], parts[-1]
    elif len(parts) >= 3 and parts[-3] == "refined":
        layer, name = "refined", f"{parts[-2]}__{parts[-1]}"
    else:
        return None
    return layer, _NOT_IN_A_NAME.sub("_", name.lower())


def checked_name(name: str, location: str) -> str:
    """``name``, or a TableError naming the table at ``location`` when the metastore cannot keep it."""
    if len(name) > MAX_NAME_LENGTH:
        raise TableError(
            f"the table's catalog name has {len(name)} characters, the metastore keeps {MAX_NAME_LENGTH}: "
            "give the table a shorter name",
            table=location,
        )
    return name


def register_table(spark: SparkSession, location: str) -> str | None:
    """Register the Delta table at ``location`` under its layer's schema; return its qualified name (None
    when the session has no catalog for that layer). Idempotent: a table already registered at this
    location stays; one registered at another location raises TableError. Jobs call it when they create
    a table or first meet it, not per batch (it asks the metastore each time)."""
    named = table_name(location)
    if named is None:
        return None
    layer, name = named
    schema = spark.conf.get(_SCHEMA_SETTING.format(layer=layer), None)
    if not schema:
        return None
    name = checked_name(name, location)
    qualified = f"{schema}.{name}"
    try:
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS `{schema}`")
        quoted = location.replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"CREATE TABLE IF NOT EXISTS `{schema}`.`{name}` USING delta LOCATION '{quoted}'")
        registered_at = _location_of(spark, f"`{schema}`.`{name}`")
    except AnalysisException as error:
        raise TableError(
            f"could not register the table in the catalog as {qualified}: {str(error).splitlines()[0]}",
            table=location,
        ) from None
    if _same_location(registered_at) != _same_location(location):
        raise TableError(
            f"the catalog name {qualified} is taken by the table at {registered_at} (names keep letters, digits "
            "and _, lower-cased: rename one table, or drop the other's registration)",
            table=location,
        )
    return qualified


def registered_location(spark: SparkSession, name: str) -> str | None:
    """The location of the table the session's catalog holds as ``name`` (``refined.customers``); None
    when it holds no table by that name (or ``name`` is no table name at all: a path), or a view."""
    try:
        if spark.catalog.tableExists(name):
            return _location_of(spark, name) or None
    except AnalysisException:  # not a table name
        pass
    return None


def folder_under(location: str, parent: str) -> str | None:
    """The folder name of ``location`` (as the catalog or a job writes it) when it lies right under
    ``parent``, else None."""
    folder, _, name = _same_location(location).rpartition("/")
    return name if folder == _same_location(normalize_location(parent)) else None


def _location_of(spark: SparkSession, name: str) -> str:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    return next((row.data_type for row in rows if row.col_name == "Location"), "")


def _same_location(location: str) -> str:
    """A location as the catalog writes it and as the jobs do compare equal (``file:`` prefix, slashes)."""
    if location.startswith("file:"):
        location = "/" + location[len("file:") :].lstrip("/")
    return location.rstrip("/")
