"""Stage 2, quality: what is kept out of the refined tables, and why. The quarantine of undecodable records
(:mod:`~refine.quality.quarantine`) and the expectations rows must meet (:mod:`~refine.quality.expectations`).
Imports the records stage at most.
"""
