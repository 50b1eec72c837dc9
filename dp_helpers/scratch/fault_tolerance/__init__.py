"""Training that keeps going: a per-step quorum, healing from a live peer (its notebook is still to be written)."""
