"""Offline replay: trace readers, the replayer, the report, its HTML page and shard merging."""
