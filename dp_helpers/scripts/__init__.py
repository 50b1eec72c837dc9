"""Entry points run under torchrun, one process per rank (launched with dp_helpers.tool.launch.run_ddp)."""
