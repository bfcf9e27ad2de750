"""Raw landing: Kafka topics as-is into append-only Delta tables, exactly once."""
