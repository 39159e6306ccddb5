"""Device functions the generated kernels call (``th.gelu(x)``), written once, by hand.

Each has its derivative beside it, so a generated backward reads ``th.gelu_grad(x) * g``.
``tanh`` comes from libdevice on a GPU; Triton's interpreter (``TRITON_INTERPRET=1``, how
the kernels run on the CPU in tests) has no libdevice, so there it is computed from
``exp`` with a series near zero, where ``1 - exp(-2|x|)`` would lose relative accuracy.
"""
import triton
import triton.language as tl

from autopar.passes.fusion import interpreting

if interpreting():
    @triton.jit
    def round_bf16(x):
        """x rounded to the nearest bfloat16 (ties to even), as fp32. The interpreter's own
        fp32 -> bf16 conversion truncates; GPUs round to nearest even, as PyTorch does."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def tanh(x):
        a = tl.abs(x)
        e = tl.exp(-2.0 * a)
        far = (1.0 - e) / (1.0 + e)
        x2 = a * a
        near = a * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (-0.05396825396825397
                                                                                         + x2 * 0.021869488536155203))))
        t = tl.where(a < 0.25, near, far)
        return tl.where(x < 0, -t, t)
else:
    from triton.language.extra import libdevice

    @triton.jit
    def round_bf16(x):
        """x rounded to the nearest bfloat16 (ties to even), as fp32."""
        return x.to(tl.bfloat16).to(tl.float32)

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)


@triton.jit
def gelu(x):
    """Exact GeLU: x·Φ(x) = ½x(1 + erf(x/√2))."""
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def gelu_grad(x):
    """d/dx ½x(1 + erf(x/√2)) = Φ(x) + x·φ(x)."""
    return 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476)) + x * 0.3989422804014327 * tl.exp(-0.5 * x * x)


@triton.jit
def gelu_tanh(x):
    """GeLU's tanh approximation (GPT-2's ``gelu_new``, ``F.gelu(approximate="tanh")``)."""
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@triton.jit
def gelu_tanh_grad(x):
    t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x)


@triton.jit
def silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def silu_grad(x):
    s = tl.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


@triton.jit
def dropout_keep(seed, offsets, threshold):
    """Philox word of element ``offsets`` under ``seed``, kept iff its top 24 bits reach
    ``threshold`` = round(p·2^24): the rule of :func:`autopar.runtime.philox.keep_mask`."""
    word = tl.randint(seed, offsets)
    return (word >> 8).to(tl.int32) >= threshold
