"""Refinement: a raw table's Change Data Feed made into refined tables equal to the source.

Stages, each importing only the ones before it (tests/test_layers.py holds them to it):

1. :mod:`refine.records`: Kafka records decoded into typed changes;
2. :mod:`refine.quality`: the quarantine and expectations;
3. :mod:`refine.apply`: changes written to the refined, history, child and side tables;
4. :mod:`refine.mongo`: MongoDB topics refined as documents;
5. this package's own modules: a job's configuration (:mod:`refine.config`), a batch's schemas and parsing
   (:mod:`refine.batch_schemas`, :mod:`refine.parse_batch`), the batch (:mod:`refine.batch`), the rebuild
   (:mod:`refine.rebuild`) and the job (:mod:`refine.job`, :mod:`refine.progress`).
"""
