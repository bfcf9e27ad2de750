"""A refined table shaped as its user declares it (:class:`TableShape`): which source columns it keeps,
columns computed from the row, the rows it holds (``where``), masked columns, soft deletes, updates
whose NULLs keep the stored value, which columns start a new history version, and the table's layout
(clustering or partitions).

Order, on each change's row as the refined table would store it: computed columns (from the source
row), then ``where`` (a row that does not match becomes a delete of its key), then the column
selection, then masking; the MERGE then writes it (soft deletes and ``ignore_null_updates`` are MERGE
clauses, :func:`refine.apply.merge.merge_changes`). The stages here are pure DataFrame functions.

Example::

    shape = TableShape(except_columns=["notes"], mask={"email": MaskMethod.SHA256}, where="is_active")
    rows = shaped_rows(refined_rows(latest, columns), shape, key_columns=["id"])
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

from pydantic import Field, model_validator
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType, StructType, TimestampType

from cdc.core.config import _Strict
from cdc.core.errors import ConfigError
from refine.apply.latest import POSITION_COLUMNS
from refine.apply.merge import DELETED_AT
from refine.records.envelope import Op
from refine.records.toast import TOAST_PLACEHOLDER, placeholder_test

REDACTED = "[redacted]"
_OP = "_cdc_op"
# HMAC-SHA256 (RFC 2104) on SHA-256's 64-byte blocks.
_BLOCK = 64


class MaskMethod(str, Enum):
    """How a masked column's values are written: hashes keep joins (the same value, the same hash)."""

    SHA256 = "sha256"  # hex SHA-256 of the value's text: reversible by a dictionary for guessable values
    HMAC_SHA256 = "hmac_sha256"  # hex HMAC-SHA256 of the value's text under `mask_key`
    REDACT = "redact"  # the text [redacted] (NULL stays NULL)
    NULLIFY = "nullify"  # NULL


class DeleteMode(str, Enum):
    """What a delete at the source does to the refined row."""

    HARD = "hard"  # the row goes
    SOFT = "soft"  # the row stays, with `_cdc_deleted_at`; a re-insert revives it


class MaskKey(_Strict):
    """Where the key of ``hmac_sha256`` masking is read (never printed, never stored): one of the two."""

    env: str | None = Field(default=None, description="An environment variable holding the key.")
    file: Path | None = Field(
        default=None,
        description="A file holding the key (its bytes, a final newline dropped); in a pipeline file, a relative "
        "path is relative to it.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> MaskKey:
        if (self.env is None) == (self.file is None):
            raise ValueError("give one of `env` or `file`")
        return self

    def read(self) -> bytes:
        """The key's bytes; ConfigError naming where it was looked for (not its value) when absent or empty."""
        if self.env is not None:
            key = os.environ.get(self.env, "").encode()
            where = f"environment variable {self.env}"
        else:
            assert self.file is not None
            try:
                key = self.file.expanduser().read_bytes().removesuffix(b"\n")
            except OSError as error:
                raise ConfigError(
                    f"mask_key: cannot read the key file: {error.strerror}", file=str(self.file)
                ) from None
            where = f"file {self.file}"
        if not key:
            raise ConfigError(f"mask_key: the {where} holds no key")
        return key


class TableShape(_Strict):
    """How a refined table (and its history and child tables) is shaped; the default keeps every source
    column, as the source has it, and deletes rows deleted at the source."""

    columns: list[str] | None = Field(
        default=None, description="The source columns kept (the primary key among them); default all."
    )
    except_columns: list[str] = Field(default_factory=list, description="Source columns left out (not with `columns`).")
    mask: dict[str, MaskMethod] = Field(
        default_factory=dict,
        description="Columns masked before anything is written: sha256, hmac_sha256 (with `mask_key`), redact or "
        "nullify. A hash is of the value's text, hex; a masked key column joins (the same value, the same hash).",
    )
    mask_key: MaskKey | None = Field(
        default=None, description="The hmac_sha256 key: `{env: NAME}` or `{file: path}`; never printed."
    )
    computed: dict[str, str] = Field(
        default_factory=dict,
        description="Columns computed from the source row: name -> Spark SQL expression over its columns "
        "(e.g. `year(signed_up_at)`).",
    )
    where: str | None = Field(
        default=None,
        description="A Spark SQL condition over the source row and computed columns: a row that stops matching "
        "leaves the table as a delete does (its history version closes, its child rows go).",
    )
    deletes: DeleteMode = Field(
        default=DeleteMode.HARD,
        description="hard: a deleted row goes; soft: it stays with `_cdc_deleted_at` (a re-insert revives it).",
    )
    ignore_null_updates: bool | list[str] = Field(
        default=False,
        description="A change to a row the table holds leaves a column it sets to NULL as it was: true for every "
        "non-key column, or a list of columns. Departs from the source on purpose.",
    )
    track_history_columns: list[str] | None = Field(
        default=None,
        description="scd 2: the columns whose change starts a new history version; a change of none of them "
        "updates the current version in place. Default all.",
    )
    track_history_except_columns: list[str] = Field(
        default_factory=list, description="scd 2: columns whose change alone starts no new history version."
    )
    cluster_by: list[str] = Field(
        default_factory=list, description="Liquid clustering columns of the refined and history tables, at creation."
    )
    partition_by: list[str] = Field(
        default_factory=list, description="Partition columns of the refined and history tables, at creation."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TableShape:
        pairs = [
            ("columns", self.columns is not None, "except_columns", bool(self.except_columns)),
            (
                "track_history_columns",
                self.track_history_columns is not None,
                "track_history_except_columns",
                bool(self.track_history_except_columns),
            ),
            ("cluster_by", bool(self.cluster_by), "partition_by", bool(self.partition_by)),
        ]
        for first, has_first, second, has_second in pairs:
            if has_first and has_second:
                raise ValueError(f"`{first}` and `{second}` exclude each other: give one")
        hmac = [name for name, method in self.mask.items() if method is MaskMethod.HMAC_SHA256]
        if hmac and self.mask_key is None:
            raise ValueError(
                f"mask: {hmac[0]} is hmac_sha256, which needs `mask_key` ({{env: NAME}} or {{file: path}})"
            )
        if self.mask_key is not None and not hmac:
            raise ValueError("`mask_key` is set but no column is masked with hmac_sha256")
        for name in self.computed:
            if name.startswith("_cdc_"):
                raise ValueError(f"computed: {name}: names starting with _cdc_ are reserved")
        layout = self.cluster_by or self.partition_by
        left_out = [c for c in layout if not self.keeps(c)]
        if left_out:
            raise ValueError(
                f"{'cluster_by' if self.cluster_by else 'partition_by'}: {left_out[0]} is left out of the table"
            )
        left_out_masked = [c for c in self.mask if c not in self.computed and not self.keeps(c)]
        if left_out_masked:
            raise ValueError(f"mask: {left_out_masked[0]} is left out of the table (columns/except_columns)")
        for key, names in (
            ("track_history_columns", self.track_history_columns or []),
            ("track_history_except_columns", self.track_history_except_columns),
        ):
            if left_out := [c for c in names if not self.keeps(c)]:
                raise ValueError(f"{key}: {left_out[0]} is left out of the table (columns/except_columns)")
        masked_layout = [c for c in layout if c in self.mask]
        if masked_layout:
            raise ValueError(f"{masked_layout[0]} is masked: a masked column cannot lay out the table")
        return self

    @property
    def declared(self) -> bool:
        """Whether anything differs from the default shape."""
        return self != TableShape()

    def keeps(self, column: str) -> bool:
        """Whether the table keeps the source (or computed) ``column``."""
        if column in self.computed:
            return True
        if self.columns is not None:
            return column in self.columns
        return column not in self.except_columns

    def fingerprint(self, mask_key: bytes | None) -> str | None:
        """What identifies the rows this shape makes (None for the default shape): a SHA-256 of its
        settings and, for hmac_sha256, of an HMAC under the key (which changes with the key and does
        not reveal it)."""
        if not self.declared:
            return None
        settings = self.model_dump_json(exclude={"mask_key"})
        keyed = hmac.new(mask_key, b"cdc.shape", hashlib.sha256).hexdigest() if mask_key is not None else ""
        return hashlib.sha256(f"{settings}|{keyed}".encode()).hexdigest()

    @property
    def tracks_all(self) -> bool:
        """Whether every column's change starts a new history version (the default)."""
        return self.track_history_columns is None and not self.track_history_except_columns

    def tracked(self, column: str) -> bool:
        """Whether a change of ``column`` starts a new history version."""
        if self.track_history_columns is not None:
            return column in self.track_history_columns
        return column not in self.track_history_except_columns

    def ignored_nulls(self, columns: list[str], key_columns: list[str]) -> list[str]:
        """The columns whose NULL in an update keeps the stored value."""
        if self.ignore_null_updates is True:
            return [c for c in columns if c not in key_columns]
        if self.ignore_null_updates is False:
            return []
        return [c for c in self.ignore_null_updates if c in columns]

    def check_keys(self, key_columns: list[str], table: str) -> None:
        """ConfigError where the shape would lose or collide the primary key (known once a batch is read)."""
        for key in key_columns:
            if not self.keeps(key):
                raise ConfigError(
                    f"the primary-key column {key} cannot be left out (columns/except_columns)", table=table
                )
            if self.mask.get(key) in (MaskMethod.REDACT, MaskMethod.NULLIFY):
                raise ConfigError(
                    f"mask: the primary-key column {key} can only be hashed (sha256, hmac_sha256): "
                    f"{self.mask[key].value} would make rows of different keys one",
                    table=table,
                )


def _hmac_sha256(value: Column, key: bytes) -> Column:
    """Hex HMAC-SHA256 of ``value`` (binary) under ``key``, in Spark expressions (RFC 2104)."""
    key = hashlib.sha256(key).digest() if len(key) > _BLOCK else key
    key = key.ljust(_BLOCK, b"\0")
    inner = bytes(b ^ 0x36 for b in key)
    outer = bytes(b ^ 0x5C for b in key)
    inner_digest = F.unhex(F.sha2(F.concat(F.lit(inner), value), 256))
    return F.sha2(F.concat(F.lit(outer), inner_digest), 256)


def masked(column: Column, method: MaskMethod, key: bytes | None, data_type: DataType) -> Column:
    """``column``'s values masked by ``method``; a TOAST placeholder passes unmasked (the MERGE keeps the
    stored, already masked, value for it)."""
    text = column.cast(StringType())
    if method is MaskMethod.SHA256:
        value = F.sha2(F.encode(text, "UTF-8"), 256)
    elif method is MaskMethod.HMAC_SHA256:
        assert key is not None
        value = _hmac_sha256(F.encode(text, "UTF-8"), key)
    elif method is MaskMethod.REDACT:
        value = F.when(column.isNotNull(), F.lit(REDACTED))
    else:
        return F.lit(None).cast(data_type)
    is_placeholder = placeholder_test(data_type)
    if is_placeholder is not None:  # the masked column is text: its placeholder is the text one
        value = F.when(is_placeholder(column), F.lit(TOAST_PLACEHOLDER)).otherwise(value)
    return value


def _expression(text: str, key: str, table: str) -> Column:
    try:
        return F.expr(text)
    except (ParseException, AnalysisException) as error:
        raise ConfigError(f"{key}: not a Spark SQL expression: {str(error).splitlines()[0]}", table=table) from None


def with_masked_keys(
    changes: DataFrame, shape: TableShape, key_columns: list[str], mask_key: bytes | None
) -> DataFrame:
    """Parsed ``changes`` with their masked primary-key columns hashed in ``key``, ``before`` and ``after``,
    before anything compares keys: the MERGE, the deleted keys, primary-key changes and resets then all
    match hashes with hashes (:func:`shaped_rows` leaves key columns as they come)."""
    masked_keys = [k for k in key_columns if k in shape.mask]
    if not masked_keys:
        return changes
    images = {}
    for image in ("key", "before", "after"):
        struct = changes.schema[image].dataType
        assert isinstance(struct, StructType)
        column = F.col(image)
        for key in masked_keys:
            if key in struct.fieldNames():
                value = masked(F.col(f"{image}.`{key}`"), shape.mask[key], mask_key, struct[key].dataType)
                column = column.withField(f"`{key}`", value)
        images[image] = column  # a null image stays null
    return changes.withColumns(images)


def _computed(rows: DataFrame, shape: TableShape, table: str) -> tuple[DataFrame, Column | None]:
    """``rows`` with the shape's computed columns, and whether each matches ``where`` (None without one)."""
    rows = rows.withColumns({name: _expression(sql, f"computed.{name}", table) for name, sql in shape.computed.items()})
    if shape.where is None:
        return rows, None
    return rows, F.coalesce(_expression(shape.where, "where", table).cast("boolean"), F.lit(False))


@contextmanager
def _naming_expression_errors(shape: TableShape, table: str) -> Iterator[None]:
    """Spark's analysis of the computed columns and ``where`` (a wrong column name) failing with the key named."""
    try:
        yield
    except AnalysisException as error:
        keys = "computed/where" if shape.computed and shape.where else ("where" if shape.where else "computed")
        raise ConfigError(f"{keys}: {str(error).splitlines()[0]}", table=table) from None


def _selected_and_masked(
    rows: DataFrame, shape: TableShape, source: list[str], key_columns: list[str], table: str, mask_key: bytes | None
) -> DataFrame:
    """``rows`` with the columns the shape keeps (of the ``source`` columns; the others, metadata and computed,
    all), masked; ConfigError for a named column the rows lack."""
    named = {
        "columns": shape.columns or [],
        "except_columns": shape.except_columns,
        "mask": list(shape.mask),
        "track_history_columns": shape.track_history_columns or [],
        "track_history_except_columns": shape.track_history_except_columns,
        "ignore_null_updates": shape.ignore_null_updates if isinstance(shape.ignore_null_updates, list) else [],
    }
    for key, names in named.items():
        if missing := [name for name in names if name not in rows.columns]:
            raise ConfigError(f"{key}: the table has no column {missing[0]}", table=table)
    kept = [c for c in rows.columns if c.startswith("_cdc_") or shape.keeps(c) or c not in source]
    return masked_values(rows.select(*[F.col(f"`{c}`") for c in kept]), shape, mask_key, key_columns)


def shaped_rows(
    rows: DataFrame, shape: TableShape, key_columns: list[str], table: str, mask_key: bytes | None = None
) -> DataFrame:
    """Refined ``rows`` (source columns and ``_cdc_*`` metadata, ``_cdc_op`` among them) shaped: computed
    columns, ``where`` (a non-delete row that does not match becomes a delete, ``_cdc_op`` ``d``), the
    column selection, masks. ConfigError naming the key for an expression Spark cannot read or a column
    the row lacks."""
    if not shape.declared:
        return rows
    source = [c for c in rows.columns if not c.startswith("_cdc_")]
    with _naming_expression_errors(shape, table):
        rows, matches = _computed(rows, shape, table)
        rows = _soft_deleted_and_unmatched(rows, shape, matches)
        _ = rows.schema  # analysed here
    return _selected_and_masked(rows, shape, source, key_columns, table, mask_key)


def _soft_deleted_and_unmatched(rows: DataFrame, shape: TableShape, matches: Column | None) -> DataFrame:
    """Refined rows with ``_cdc_deleted_at`` under soft deletes, and a row that does not match ``where`` a delete."""
    # A source delete whose row the table would have held: kept as a soft-deleted row even where
    # the table never held it (created and deleted within a batch, or a rebuild's one batch).
    deleted_row = F.col(_OP) == Op.DELETE.value
    if matches is not None:
        deleted_row = deleted_row & matches
    if shape.deletes is DeleteMode.SOFT:
        at = F.coalesce(F.col("_cdc_committed_at"), F.current_timestamp())
        rows = rows.withColumn(DELETED_AT, F.when(deleted_row, at).otherwise(F.lit(None).cast(TimestampType())))
    if matches is not None:
        rows = rows.withColumn(
            _OP, F.when((F.col(_OP) != Op.DELETE.value) & ~matches, F.lit(Op.DELETE.value)).otherwise(F.col(_OP))
        )
    return rows


def masked_values(
    rows: DataFrame, shape: TableShape, mask_key: bytes | None, key_columns: Sequence[str] = ()
) -> DataFrame:
    """``rows`` with the masked columns among theirs masked (but ``key_columns``, which come masked:
    :func:`with_masked_keys`)."""
    types = {f.name: f.dataType for f in rows.schema}
    return rows.withColumns(
        {
            name: masked(F.col(f"`{name}`"), method, mask_key, types[name])
            for name, method in shape.mask.items()
            if name in types and name not in key_columns
        }
    )


def shaped_images(
    images: DataFrame, image: str, shape: TableShape, table: str, mask_key: bytes | None = None
) -> DataFrame:
    """Rows holding a row image (the struct column ``image``, beside ``_cdc_*`` columns) with the image
    shaped: computed columns, the column selection, masks; a row whose image does not match ``where`` is
    left out. How a table without a primary key is shaped: it holds row images, not keys."""
    if not shape.declared:
        return images
    row_type = images.schema[image].dataType
    assert isinstance(row_type, StructType)  # a row
    source = row_type.fieldNames()
    others = [c for c in images.columns if c != image]
    with _naming_expression_errors(shape, table):
        rows, matches = _computed(images.select(*others, f"{image}.*"), shape, table)
        if matches is not None:
            rows = rows.where(matches)
        _ = rows.schema  # analysed here
    rows = _selected_and_masked(rows, shape, source, [], table, mask_key)
    shaped = [c for c in rows.columns if c not in others]
    return rows.select(*others, F.struct(*[F.col(f"`{c}`") for c in shaped]).alias(image))


def fill_ignored_nulls(changes: DataFrame, key_columns: list[str], columns: list[str]) -> DataFrame:
    """Parsed changes whose ``after`` NULLs in ``columns`` hold the key's last non-NULL value among its
    earlier changes of the batch since its last delete (``ignore_null_updates`` within a batch; across
    batches the MERGE keeps the stored value)."""
    if not columns:
        return changes
    key = [F.col(f"key.`{k}`") for k in key_columns]
    order = [F.col(c) for c in POSITION_COLUMNS]
    lives = Window.partitionBy(*key).orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    changes = changes.withColumn("_life", F.sum(F.when(F.col("op") == Op.DELETE.value, 1).otherwise(0)).over(lives))
    so_far = Window.partitionBy(*key, F.col("_life")).orderBy(*order).rowsBetween(Window.unboundedPreceding, 0)
    after = changes.schema["after"].dataType
    assert isinstance(after, StructType)
    fields = [
        (
            F.last(F.col(f"after.`{f.name}`"), ignorenulls=True).over(so_far)
            if f.name in columns
            else F.col(f"after.`{f.name}`")
        ).alias(f.name)
        for f in after.fields
    ]
    filled = F.when(F.col("after").isNull(), F.col("after")).otherwise(F.struct(*fields))
    return changes.withColumn("after", filled).drop("_life")


MASKED_VALUE = "[masked]"


def masked_reason(reason: Column, shape: TableShape) -> Column:
    """A quarantine reason with the decoded values of masked columns replaced by ``[masked]``: the reasons
    that quote a value (a value that cannot be read as its type, a key that is not the row's, a value
    that no longer fits its column) name its field first. The raw value stays in the quarantine's
    ``raw_value``, as in the raw table."""
    for name in shape.mask:
        field = rf"(?:key\.|before\.|after\.)?{re.escape(name)}"
        patterns = [
            # The Connect type: `int32`, or a named one, `io.debezium.time.Date (int32)`.
            (rf"^(field {field}: cannot read ).*( as [^ ]+(?: \([a-z0-9]+\))?)$", rf"$1{MASKED_VALUE}$2"),
            (
                rf"^(field key\.{re.escape(name)}: ).*( is not the row's {field}, ).*$",
                rf"$1{MASKED_VALUE}$2{MASKED_VALUE}",
            ),
            (rf"^(field {field}: ).*( does not fit the refined column's type .*)$", rf"$1{MASKED_VALUE}$2"),
        ]
        for pattern, replacement in patterns:
            reason = F.regexp_replace(reason, pattern, replacement)
    return reason
