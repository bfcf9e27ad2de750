"""Stage 1, records: Kafka records of Debezium's topics read into typed changes (pure DataFrame -> DataFrame).

The envelope's fields and ops (:mod:`~refine.records.envelope`), Debezium's encodings decoded to Spark types
(:mod:`~refine.records.decode`), declared and inferred columns, JSON values parsed with the schemas they carry
(:mod:`~refine.records.parse`), rows flattened by a transform (:mod:`~refine.records.flattened`), and TOAST
placeholders told apart (:mod:`~refine.records.toast`). Imports nothing else of ``refine``.
"""
