"""DistributedDataParallel from scratch: HookAllReduce -> AsyncAllReduce -> MiniDDP (notebooks 04 and 05)."""
