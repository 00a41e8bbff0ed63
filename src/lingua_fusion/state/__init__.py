"""Durable state: API keys (hashed) and glossaries today; stream snapshots + WAL build on the same store."""
