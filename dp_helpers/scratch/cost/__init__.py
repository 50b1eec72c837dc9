"""The cost model: a step's time from its compute and the ring's alpha-beta time (notebooks 04 and 09)."""
