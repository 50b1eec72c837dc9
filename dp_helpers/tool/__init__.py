"""The train | bench | doctor tool: the request checked before anything starts, the launcher, runs, metrics, plots."""
