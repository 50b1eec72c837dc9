"""nn.DataParallel's forward taken apart: scatter, replicate, parallel_apply, gather (notebooks 01 and 02)."""
