"""Training that keeps going: a per-step quorum, healing from a live peer (notebook 11)."""
