"""GPU checks, behind the ``gpu`` marker: they run on a machine with CUDA
(``make test-gpu``, which sets ``TRITON_INTERPRET=0`` so that the generated kernels compile
for the GPU) and are skipped elsewhere. They have not been run on a GPU
(docs/benchmarks.md §13 lists what remains to run on one).

* the fused kernels (GPT's and Llama's chains) against the unfused ops on CUDA, fp32 and
  bf16, forward and backward;
* every family's numerics with the model and inputs on CUDA against the single device:
  the ranks share GPU 0 under gloo (what one GPU allows; NCCL refuses two ranks on one
  GPU), and under NCCL with a GPU each where the machine has several;
* the health board under NCCL: a rank that raises is named by every other rank.
"""
import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
COMPILED_KERNELS = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") == "1",
                                      reason="generated kernels run interpreted in this process: `make test-gpu` "
                                             "runs this module with TRITON_INTERPRET=0")


class BiasGelu(nn.Module):
    def __init__(self, n=64):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return F.gelu(self.fc(x))


class ScaleMaskSoftmax(nn.Module):
    def forward(self, scores):
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        return F.softmax((scores * 0.125).masked_fill(~causal, float("-inf")), dim=-1)


class AddRMSNorm(nn.Module):
    def __init__(self, n=64):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(n))

    def forward(self, x, residual):
        h = x + residual
        hidden = h.to(torch.float32)
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h, self.weight * hidden.to(h.dtype)


class SwiGLU(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up


class Rotary(nn.Module):
    def forward(self, q, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin


def _case(name):
    torch.manual_seed(0)
    if name == "bias_gelu":
        return BiasGelu(), (torch.randn(32, 64),)
    if name == "scale_mask_softmax":
        return ScaleMaskSoftmax(), (torch.randn(2, 4, 64, 64),)
    if name == "add_rms_norm":
        return AddRMSNorm(), (torch.randn(32, 64), torch.randn(32, 64))
    if name == "swiglu":
        return SwiGLU(), (torch.randn(32, 96), torch.randn(32, 96))
    angles = torch.randn(2, 16, 32)
    return Rotary(), (torch.randn(2, 4, 16, 64), torch.cat((angles, angles), -1).cos(),
                      torch.cat((angles, angles), -1).sin())


@COMPILED_KERNELS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["bias_gelu", "scale_mask_softmax", "add_rms_norm", "swiglu", "rotary"])
def test_fused_kernels_match_unfused_on_cuda(name, dtype):
    from autopar.trace.capture import capture
    from autopar.passes.fusion.rewrite import FUSION, fusion_pass
    device = torch.device("cuda")
    model, inputs = _case(name)
    model = model.to(device=device, dtype=dtype)
    inputs = tuple(x.to(device=device, dtype=dtype) for x in inputs)
    gm = fusion_pass(capture(copy.deepcopy(model), inputs))
    assert any(kernel.startswith(name) for kernel, _ in gm.meta[FUSION].uses), gm.meta[FUSION].summary()
    rtol = 1e-4 if dtype == torch.float32 else 2e-2
    leaves = [x.clone().requires_grad_() for x in inputs]
    ref_leaves = [x.clone().requires_grad_() for x in inputs]
    out, ref = gm(*leaves), model(*ref_leaves)
    outs, refs = (out if isinstance(out, tuple) else (out,)), (ref if isinstance(ref, tuple) else (ref,))
    weights = [torch.randn(r.shape, device=device, dtype=torch.float32) for r in refs]
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype and torch.allclose(o.float(), r.float(), rtol=rtol, atol=rtol * r.abs().max().item())
    grads = torch.autograd.grad(sum((o.float() * w).sum() for o, w in zip(outs, weights)), leaves)
    ref_grads = torch.autograd.grad(sum((r.float() * w).sum() for r, w in zip(refs, weights)), ref_leaves)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g.float(), r.float(), rtol=rtol, atol=rtol * r.abs().max().item())


FAMILIES_2 = [("transformer", {"data": 2}), ("transformer", {"tensor": 2}),
              ("transformer", {"pipeline": 2, "microbatches": 2}), ("transformer", {"data": 2, "zero": 1}),
              ("transformer", {"data": 2, "subgrids": 2, "csub": True}), ("mlp", {"x": 2, "y": 1, "z": 1}),
              ("gpt2", "auto")]


def _on_cuda(cases):
    from autopar.testing import equivalence_job
    return equivalence_job([(model, strategy, {"dtype": "float64", "device": "cuda"}) for model, strategy in cases])


def _check(reports):
    for rank_reports in reports:
        for report in rank_reports:
            assert report["output"][1] < 1e-12 and report["loss"][1] < 1e-12, report
            assert report["grad"][1] < 1e-12 and report["param"][0] < 1e-12, report


@pytest.mark.multiprocess
def test_every_family_on_one_gpu_shared_by_two_gloo_ranks():
    from autopar.runtime.launcher import launch
    _check(launch(_on_cuda, 2, (FAMILIES_2,), backend="gloo", timeout_s=600))


@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_every_family_under_nccl():
    from autopar.runtime.launcher import launch
    _check(launch(_on_cuda, 2, (FAMILIES_2,), backend="nccl", timeout_s=600))


def _bad_target_on_rank_1():
    import autopar
    from examples.factories import training_case
    factory, inputs, target, loss_fn = training_case("mlp")
    device = torch.device("cuda", dist.get_rank())
    inputs, target = tuple(x.to(device) for x in inputs), target.to(device)
    torch.manual_seed(0)
    pm = autopar.compile(factory().to(device), None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         strategy={"data": 2})
    pm.step(*inputs, target=target)
    if dist.get_rank() == 1:
        target = torch.zeros(8, 3, dtype=torch.long, device=device)  # cross-entropy wants one class per row
    pm.step(*inputs, target=target)
    return "finished"


@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_the_health_board_names_a_failing_rank_under_nccl():
    from autopar.runtime.launcher import RankFailure, launch
    results = launch(_bad_target_on_rank_1, 2, backend="nccl", timeout_s=120, return_exceptions=True)
    assert isinstance(results[1], RankFailure) and "Error" in results[1].error, results[1]
    assert isinstance(results[0], RankFailure), results[0]
    assert results[0].error.startswith("RankFailureError: rank 1 raised in step() #2"), results[0]
