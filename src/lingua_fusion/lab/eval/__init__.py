"""Quality and latency evaluation."""
