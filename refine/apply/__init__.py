"""Stage 3, apply: typed changes written to the refined tables (reads, MERGEs and rewrites at its edges).

The latest change per key (:mod:`~refine.apply.latest`), the MERGE (:mod:`~refine.apply.merge`), history
(:mod:`~refine.apply.history`), primary-key changes (:mod:`~refine.apply.rekey`), deleted keys
(:mod:`~refine.apply.deleted`), keyed and keyless tables (:mod:`~refine.apply.keyed`,
:mod:`~refine.apply.keyless`), child tables (:mod:`~refine.apply.flatten`), a table's rules and features
(:mod:`~refine.apply.rules`) and source schema changes (:mod:`~refine.apply.schema_changes`). Imports the
records and quality stages.
"""
