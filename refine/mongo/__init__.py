"""Stage 4, MongoDB: Debezium's MongoDB topics refined as documents. Extended JSON typed
(:mod:`~refine.mongo.extended_json`), update descriptions applied as patches (:mod:`~refine.mongo.patch`),
documents flattened by ExtractNewDocumentState read back (:mod:`~refine.mongo.unwrapped_documents`), and the
per-batch refinement (:mod:`~refine.mongo.documents`). Imports the stages below.
"""
