"""Model work across streams: the ModelPort, the executor that batches every stream's work under SLOs, the pure
scheduler, breaker and faults. Knows nothing of sessions."""
