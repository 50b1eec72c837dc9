"""nn.DataParallel's forward as four steps: scatter, replicate, parallel_apply, gather (taught in notebook 02).

With CUDA devices these call the real `torch.nn.parallel` primitives. With CPU "devices" they
emulate them with the same semantics: replicas whose parameters are autograd copies of the
original (so gradients sum back into it), `chunk` along dim 0 (uneven and fewer chunks than
devices included), tuples, lists, dicts and keyword arguments scattered recursively, one thread
per replica, and outputs concatenated onto the output device.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch
from torch import nn


def cpu_devices(n: int) -> list[torch.device]:
    """n emulated devices: every replica runs on the CPU, in its own thread (real GPUs: tool.env.gpu_devices())."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of devices must be >= 1, got {n!r}.")
    return [torch.device("cpu")] * n


def is_real(devices) -> bool:
    """True when the devices are CUDA GPUs, so the real torch.nn.parallel primitives run."""
    return len(devices) > 0 and all(torch.device(d).type != "cpu" for d in devices)


def _copy_module_tree(module: nn.Module) -> list[nn.Module]:
    """Shallow replicas of every submodule, wired to each other like the original tree."""
    modules = list(module.modules())
    index = {id(m): i for i, m in enumerate(modules)}
    copies = [m._replicate_for_data_parallel() for m in modules]
    for m, replica in zip(modules, copies, strict=True):
        for key, child in m._modules.items():
            replica._modules[key] = None if child is None else copies[index[id(child)]]
    return list(zip(modules, copies, strict=True))


def _replicate_emulated(module: nn.Module, on_first_device: bool) -> nn.Module:
    """One CPU replica: parameters become autograd copies (non-leaf); buffers are copied, except on device 0."""
    pairs = _copy_module_tree(module)
    for original, replica in pairs:
        for key, param in original._parameters.items():
            # both keep the graph, so a replica's gradient flows back into the original parameter;
            # the replica on device 0 shares storage with the original, as DataParallel guarantees
            copy = None if param is None else (param.view_as(param) if on_first_device else param.clone())
            setattr(replica, key, copy)
        for key, buf in original._buffers.items():
            shared = buf is None or on_first_device
            replica._buffers[key] = buf if shared else buf.detach().clone()
    return pairs[0][1]


def replicate(module: nn.Module, devices) -> list[nn.Module]:
    """One replica per device; in-place buffer updates survive only on device 0's replica, as in DataParallel."""
    if is_real(devices):
        from torch.nn.parallel import replicate as real_replicate

        return real_replicate(module, devices)
    return [_replicate_emulated(module, on_first_device=(i == 0)) for i in range(len(devices))]


def _scatter_map(obj, n: int, dim: int) -> list:
    """Split one object into at most n pieces, the way DataParallel's scatter does."""
    if isinstance(obj, torch.Tensor):
        return list(obj.chunk(n, dim))  # chunk: ceil(rows / n) rows each, so maybe fewer than n pieces
    if isinstance(obj, tuple) and obj:
        return list(zip(*(_scatter_map(o, n, dim) for o in obj), strict=False))
    if isinstance(obj, list) and obj:
        return [list(i) for i in zip(*(_scatter_map(o, n, dim) for o in obj), strict=False)]
    if isinstance(obj, dict) and obj:
        return [type(obj)(i) for i in zip(*(_scatter_map(kv, n, dim) for kv in obj.items()), strict=False)]
    return [obj for _ in range(n)]  # anything else is shared by reference


def scatter(inputs, devices, dim: int = 0) -> list:
    """Split `inputs` (tensors, tuples, lists, dicts) into one piece per device along dim."""
    if is_real(devices):
        from torch.nn.parallel.scatter_gather import scatter as real_scatter

        return real_scatter(inputs, devices, dim)
    return _scatter_map(inputs, len(devices), dim)


def scatter_kwargs(inputs: tuple, kwargs: dict | None, devices, dim: int = 0) -> tuple[tuple, tuple]:
    """Scatter positional and keyword arguments and pad them to the same number of pieces."""
    pieces = scatter(inputs, devices, dim) if inputs else []
    kw_pieces = scatter(kwargs, devices, dim) if kwargs else []
    n = max(len(pieces), len(kw_pieces))
    pieces += [() for _ in range(n - len(pieces))]
    kw_pieces += [{} for _ in range(n - len(kw_pieces))]
    return tuple(pieces), tuple(kw_pieces)


def _run_replicas(replicas, inputs, kwargs) -> list:
    """One thread per replica, with the caller's grad mode; a replica's exception is re-raised naming it."""
    grad_enabled, results = torch.is_grad_enabled(), [None] * len(replicas)

    def work(i: int) -> None:
        """Run replica i; keep its output or its exception."""
        torch.set_grad_enabled(grad_enabled)  # grad mode is per thread
        try:
            args = inputs[i] if isinstance(inputs[i], (list, tuple)) else (inputs[i],)
            results[i] = replicas[i](*args, **kwargs[i])
        except Exception as exc:  # noqa: BLE001 - handed to the caller below
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, res in enumerate(results):
        if isinstance(res, Exception):
            raise type(res)(f"Caught {type(res).__name__} in replica {i}: {res}") from res
    return results


def parallel_apply(replicas, inputs, kwargs=None, devices=None) -> list:
    """Run replica i on inputs[i] (and kwargs[i]) concurrently; returns the outputs in order."""
    if len(replicas) != len(inputs):
        raise ValueError(f"got {len(replicas)} replicas but {len(inputs)} input pieces.")
    kwargs = kwargs or tuple({} for _ in replicas)
    if devices is not None and is_real(devices):
        from torch.nn.parallel import parallel_apply as real_parallel_apply

        return real_parallel_apply(replicas, inputs, kwargs, devices[:len(replicas)])
    return _run_replicas(replicas, inputs, kwargs)


def _gather_map(outputs: list, device, dim: int):
    """Concatenate matching pieces of the replicas' outputs onto `device`."""
    out = outputs[0]
    if isinstance(out, torch.Tensor):
        if out.dim() == 0:
            warnings.warn("gathering scalars along dim 0: they are unsqueezed into a vector, "
                          "as DataParallel does.", stacklevel=3)
            outputs = [o.unsqueeze(0) for o in outputs]
        return torch.cat([o.to(device) for o in outputs], dim)
    if out is None:
        return None
    if isinstance(out, dict):
        if not all(d.keys() == out.keys() for d in outputs):
            raise ValueError("every replica must return a dict with the same keys.")
        return type(out)((k, _gather_map([d[k] for d in outputs], device, dim)) for k in out)
    if isinstance(out, (tuple, list)):
        gathered = [_gather_map(list(parts), device, dim) for parts in zip(*outputs, strict=True)]
        return type(out)._make(gathered) if hasattr(out, "_fields") else type(out)(gathered)
    raise TypeError(f"cannot gather outputs of type {type(out).__name__}.")


def gather(outputs: list, output_device, dim: int = 0):
    """Concatenate the replicas' outputs (tensors, tuples, dicts) onto output_device along dim."""
    if torch.device(output_device).type != "cpu":
        from torch.nn.parallel.scatter_gather import gather as real_gather

        return real_gather(outputs, output_device, dim)
    return _gather_map(outputs, torch.device(output_device), dim)


def data_parallel(module: nn.Module, inputs, devices, output_device=None, dim: int = 0, **kwargs):
    """DataParallel's forward written out: scatter, replicate onto as many devices as pieces, apply, gather."""
    if not devices:
        raise ValueError("data_parallel needs at least one device.")
    output_device = devices[0] if output_device is None else output_device
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    pieces, kw_pieces = scatter_kwargs(inputs, kwargs, devices, dim)
    replicas = replicate(module, devices[:len(pieces)])  # fewer pieces than devices: fewer replicas
    outputs = parallel_apply(replicas, pieces, kw_pieces, devices)
    return gather(outputs, output_device, dim)


class DataParallelModule(nn.Module):
    """nn.DataParallel's interface over data_parallel, so emulated CPU devices can train like real ones (bench)."""

    def __init__(self, module: nn.Module, devices):
        super().__init__()
        if not devices:
            raise ValueError("DataParallelModule needs at least one device.")
        self.module, self.devices = module, list(devices)

    def forward(self, *inputs, **kwargs):
        """Scatter, replicate, apply, gather: one call of data_parallel."""
        return data_parallel(self.module, inputs, self.devices, **kwargs)


class LossInForward(nn.Module):
    """Wraps a sigmoid model so each replica returns its shard's summed BCE loss: only scalars reach device 0."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The sum (not the mean) of the losses, shape (1,), so shards of any size add up to the batch's total."""
        out = self.model(inputs)
        return nn.functional.binary_cross_entropy(out, targets.reshape(out.shape), reduction="sum").reshape(1)


def tensor_bytes(obj: Any) -> int:
    """Bytes held by every tensor inside obj (nested tuples, lists and dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def replication_bytes(module: nn.Module, n_devices: int) -> int:
    """Bytes DataParallel copies every forward to put the weights and buffers on the other n-1 devices."""
    state = list(module.parameters()) + list(module.buffers())
    return tensor_bytes(state) * (n_devices - 1)
