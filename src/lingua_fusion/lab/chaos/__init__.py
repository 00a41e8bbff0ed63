"""Fault and degradation injection (shared by the evaluation's degradation study and chaos experiments)."""
