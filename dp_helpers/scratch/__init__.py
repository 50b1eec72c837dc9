"""Data parallelism built from scratch, one folder per concept: what a learner reads (README.md maps the notebooks)."""
