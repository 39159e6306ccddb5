"""Running generated kernels: load the source, launch, and differentiate through autograd.

A rank graph calls a fused chain as ``fused_kernel("bias_gelu_3f2a1c9d0e", x, b)``: the
name keys :data:`KERNELS`, filled by the fusion pass in the process that builds the
graph. The source is written to a cache directory and imported from there (Triton's
``jit`` reads a kernel's source from its file), and compiled by Triton at the first
launch. Triton is imported only then: without it, graphs are still built and dumped.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from autopar.passes.fusion import codegen
from autopar.passes.fusion import interpreting
from autopar.passes.fusion.chain import TORCH_DTYPES, Chain



def cache_dir() -> str:
    """Where generated modules are written: ``$AUTOPAR_KERNEL_CACHE`` or a per-user temp dir."""
    path = os.environ.get("AUTOPAR_KERNEL_CACHE") or os.path.join(tempfile.gettempdir(),
                                                                   f"autopar-kernels-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    return path


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass
class FusedKernel:
    """One chain's generated module and how to launch it."""
    name: str
    chain: Chain
    source: str
    _module: Any = field(default=None, repr=False)

    @property
    def module(self):
        if self._module is None:
            path = os.path.join(cache_dir(), f"{self.name}.py")
            if not os.path.exists(path) or open(path).read() != self.source:
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(self.source)
                os.replace(tmp, path)   # atomic: ranks on one machine may write the same file
            spec = importlib.util.spec_from_file_location(f"autopar_generated_{self.name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._module = module
        return self._module

    def launch_sizes(self, tensors) -> tuple[tuple, dict]:
        """(grid, sizes and meta-parameters) for the iteration space of ``tensors`` (the
        local sizes: a full input has the shape of the values that read it)."""
        chain = self.chain
        full = tensors[self.full_input]
        numel = full.numel()
        if numel >= codegen.MAX_NUMEL:
            raise ValueError(f"fused kernel {self.name}: {numel} elements; generated kernels index with int32")
        for i, t in zip(chain.tensors, tensors):
            if (i.kind == "full" and t.numel() != numel) or (i.kind == "trailing" and numel % max(1, t.numel())) \
                    or (i.kind == "broadcast" and not _broadcasts(t.shape, self.output_shape(i.reader, tensors))):
                raise ValueError(f"fused kernel {self.name}: input {i.name} ({i.kind}) has shape {list(t.shape)}, "
                                 f"the iteration space {numel} elements; the graph's shapes changed after fusion")
        if chain.rows:
            n_cols = full.shape[-1]
            n_rows = numel // n_cols
            block = max(16, _next_pow2(n_cols))
            rows = max(1, min(32, 4096 // block))
            warps = 4 if block * rows <= 2048 else (8 if block * rows <= 8192 else 16)
            sizes = {"n_rows": n_rows, "n_cols": n_cols, "ROWS": rows, "BLOCK": block, "num_warps": warps}
            grid = ((n_rows + rows - 1) // rows,)
        else:
            block = min(1024, max(16, _next_pow2(numel)))
            sizes = {"numel": numel, "BLOCK": block, "num_warps": 4}
            grid = ((numel + block - 1) // block,)
        for i, t in zip(chain.tensors, tensors):
            if i.kind == "trailing":
                sizes[f"{i.name}_numel"] = t.numel()
            if i.kind == "broadcast":   # per reader dimension: divisor, size, the input's stride (0: broadcast)
                reader = self.output_shape(i.reader, tensors)
                shape = (1,) * (len(reader) - t.dim()) + tuple(t.shape)
                stride, divisor = 1, 1
                for d in reversed(range(len(reader))):
                    sizes[f"{i.name}_d{d}"], sizes[f"{i.name}_z{d}"] = divisor, reader[d]
                    sizes[f"{i.name}_t{d}"] = stride if shape[d] == reader[d] else 0
                    divisor *= reader[d]
                    stride *= shape[d]
        return grid, sizes

    @property
    def full_input(self) -> int:
        return next(k for k, i in enumerate(self.chain.tensors) if i.kind == "full")

    def output_shape(self, rule: tuple, tensors) -> tuple:
        if rule[0] == "input":
            return tuple(tensors[rule[1]].shape)
        numel = tensors[self.full_input].numel()
        target = list(rule[1])
        if -1 in target:
            known = 1
            for d in target:
                known *= d if d != -1 else 1
            target[target.index(-1)] = numel // known
        return tuple(target)

    def __call__(self, *args):
        """``args``: the tensor inputs, then the scalars, then the dropout seeds."""
        n, k = len(self.chain.tensors), len(self.chain.scalars)
        tensors = args[:n]
        values = tuple(float(v) for v in args[n:n + k]) + tuple(int(s) for s in args[n + k:])
        return tuple(_FusedFunction.apply(self, values, *tensors))


def _broadcasts(shape, reader) -> bool:
    return len(shape) <= len(reader) and all(a in (1, b) for a, b in zip(reversed(shape), reversed(reader)))


def _launch(function, grid, *args, **sizes) -> None:
    if interpreting():
        import numpy
        # the interpreter runs the rows past the end too (masked): their inf - inf is not an error
        with numpy.errstate(all="ignore"):
            function[grid](*args, **sizes)
    else:
        function[grid](*args, **sizes)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1)


class _FusedFunction(torch.autograd.Function):
    """Forward: one launch of the generated forward kernel. Backward: one launch of the
    generated backward kernel on the saved inputs (the recompute rule), then the sums
    over broadcast dimensions for trailing inputs. ``seeds``: the scalar arguments and
    dropout seeds, in the kernel's order."""

    @staticmethod
    def forward(ctx, kernel: FusedKernel, seeds: tuple, *tensors):
        chain = kernel.chain
        flat = [_flat(t) for t in tensors]
        device = flat[0].device
        grid, sizes = kernel.launch_sizes(tensors)
        numel = tensors[kernel.full_input].numel()
        outs = [torch.empty(numel, dtype=TORCH_DTYPES[o.dtype], device=device) for o in chain.outputs]
        _launch(getattr(kernel.module, f"{kernel.name}_fwd"), grid, *flat, *outs, *seeds, **sizes)
        ctx.kernel, ctx.seeds, ctx.grid, ctx.sizes = kernel, seeds, grid, sizes
        ctx.save_for_backward(*flat)
        ctx.shapes = [t.shape for t in tensors]
        ctx.readers = [kernel.output_shape(i.reader, tensors) if i.kind == "broadcast" else None
                       for i in chain.tensors]
        return tuple(o.view(kernel.output_shape(out.shape_rule, tensors)) for o, out in zip(outs, chain.outputs))

    @staticmethod
    def backward(ctx, *grad_outputs):
        kernel: FusedKernel = ctx.kernel
        chain = kernel.chain
        flat = ctx.saved_tensors
        if torch.is_grad_enabled() and any(t.requires_grad for t in flat):
            # create_graph=True: the generated backward is not itself differentiable
            raise RuntimeError(f"fused kernel {kernel.name}: higher-order gradients (create_graph=True) through "
                               f"generated kernels are not supported; compile with fusion=False for them")
        device = flat[0].device
        numel = flat[kernel.full_input].numel()
        gouts = [_flat(g) if g is not None else torch.zeros(numel, device=device) for g in grad_outputs]
        diff = [(k, i) for k, i in enumerate(chain.tensors) if i.differentiable]
        buffers = [torch.empty(numel, device=device,
                               dtype=TORCH_DTYPES[i.dtype] if i.kind == "full" else torch.float32) for _, i in diff]
        _launch(getattr(kernel.module, f"{kernel.name}_bwd"), ctx.grid, *flat, *gouts, *buffers, *ctx.seeds,
                **ctx.sizes)
        grads: list[torch.Tensor | None] = [None] * len(flat)
        for (k, i), buf in zip(diff, buffers):
            if not ctx.needs_input_grad[2 + k]:
                continue
            shape = ctx.shapes[k]
            if i.kind == "trailing":
                numel = max(1, flat[k].numel())
                buf = buf.view(-1, numel).sum(0).to(TORCH_DTYPES[i.dtype])
            if i.kind == "broadcast":   # summed over the dimensions it was broadcast along
                buf = buf.view(ctx.readers[k]).sum_to_size(shape).to(TORCH_DTYPES[i.dtype])
            grads[k] = buf.view(shape)
        return (None, None, *grads)


KERNELS: dict[str, FusedKernel] = {}
"""Generated kernels of this process by name (``<pattern>_<hash of the source>``)."""


def register(chain: Chain) -> FusedKernel:
    """Generate ``chain``'s module (once per distinct source, output shapes and broadcast
    readers: identical blocks share one kernel) and return its kernel."""
    draft = codegen.module_source(chain, "KERNEL") + repr([o.shape_rule for o in chain.outputs]) + repr(
        [i.reader for i in chain.tensors])   # a broadcast input's index reads its reader's shape
    name = f"{chain.pattern}_{hashlib.sha1(draft.encode()).hexdigest()[:10]}"
    kernel = KERNELS.get(name)
    if kernel is None:
        kernel = KERNELS[name] = FusedKernel(name, chain, codegen.module_source(chain, name))
    return kernel


def fused_kernel(name: str, *args):
    """A fused chain in a rank graph: the outputs of kernel ``name`` on ``args`` (tensors,
    then scalars, then dropout seeds), as a tuple."""
    kernel = KERNELS.get(name)
    if kernel is None:
        raise RuntimeError(f"fused kernel {name} is not registered in this process: the graph was built by another "
                           f"process; rebuild it here (the fusion pass registers its kernels)")
    return kernel(*args)


torch.fx.wrap("fused_kernel")
