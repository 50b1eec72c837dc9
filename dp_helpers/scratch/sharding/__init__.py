"""Sharded data parallelism: what a rank holds, ZeRO-1/2/3 as one line of code, FSDP2, HSDP and DCP (notebooks 08, 10)."""
