"""Collectives built from point-to-point messages: the ring all-reduce and the naive ring it improves on (notebook 03)."""
