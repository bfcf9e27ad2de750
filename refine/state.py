"""What a refine job knows of one table between its micro-batches (:class:`TableState`).

A job owns one per table it refines and hands it to that table's batches; nothing of it is kept by
module or process, so one process can refine many tables, two jobs of one table (a rebuild's staging
run beside the live one) know nothing of each other, and a new job starts from the tables themselves.
Each piece is a hint or a copy of what the tables hold: a job that starts with none reads them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refine.apply.merge import TableSettings
from refine.mongo.unwrapped_documents import UnwrappedMark
from refine.records.envelope import ConnectSchema

# Wrapper schemas remembered per column: a hint, most batches hold one or two.
KNOWN_SCHEMAS_KEPT = 16


@dataclass
class TableState:
    """One refined table as its job knows it.

    Example::

        state = TableState.of("/data/warehouse/refined/customers", TableSettings(TableFeatures()))
        batch = RefineBatch(config, state=state)  # a second run of the table may take it on
    """

    settings: TableSettings
    """What the job declares for the table and the tables beside it, and which it has checked."""
    unwrapped: UnwrappedMark
    """Whether the table was refined from ExtractNewDocumentState's rows (its mark, read once)."""
    seen_schemas: dict[str, list[str]] = field(default_factory=dict)
    """The wrapper schemas the raw table's records showed, by column (``value``, ``key``), newest first:
    where the next batch's search for its own starts (a hint: only those found are used)."""
    last_schemas: dict[str, list[str]] | None = None
    """The wrapper schemas, by column, of the last batch (the newest, when it held several): the guess the
    next batch is parsed with. None: not known, or the last batch held none the guess can use."""
    last_schemas_known: bool = False
    """Whether :attr:`last_schemas` was set (by a batch, or from the raw table's first record)."""
    flattened_schema: ConnectSchema | None = None
    """The row schema this job last kept on the table (flattened topics), so it is written only on a change."""

    @classmethod
    def of(cls, refined: str, settings: TableSettings) -> TableState:
        """A job's state of the ``refined`` table before its first batch."""
        return cls(settings=settings, unwrapped=UnwrappedMark(refined))

    def saw_schemas(self, found: dict[str, list[str]]) -> None:
        """Remember the wrapper schemas a batch held, by column, newest first."""
        for column, texts in found.items():
            kept = dict.fromkeys([*texts, *self.seen_schemas.get(column, ())])
            self.seen_schemas[column] = list(kept)[:KNOWN_SCHEMAS_KEPT]
