"""Data parallelism in PyTorch, taught by running it: the helpers every notebook and script uses.

Importing the package has no side effects: no threads, no seeding, no global settings.
"""

__version__ = "0.1.0"
