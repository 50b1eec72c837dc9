"""Communicating less: PowerSGD as a DDP hook, local SGD and DiLoCo (notebook 10), Streaming DiLoCo (notebook 11)."""
