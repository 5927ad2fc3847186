"""The summary floor under the store and the statistics: the log grid, per-minute rollups of
records, compacted blocks, engine-sample aggregates and compaction. Pure; no I/O."""
