"""Golden text of pure data parallelism: the plan table and the rewritten rank graphs (built in
this process: the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_data.py`` and read the diff.
"""
import expecttest

from golden_helpers import _plan_and_graph
from examples.factories import mlp, transformer


class TestGoldenData(expecttest.TestCase):
    def test_mlp_data(self):
        table, code = _plan_and_graph(mlp, 2, {"data": 2})
        self.assertExpectedInline(table, """\
autopar plan: MLP on 2 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 8 (forced)
mesh: data=2 x tensor=1   (rank = data*1 + tensor; tensor ranks adjacent)
predicted step 0.430 ms: compute 0.031 ms, data comm 0.399 ms, tensor comm 0.000 ms; memory per rank 0.14 MiB
model: 4.086e+05 FLOP per step -> 4.754e+08 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 4 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region               kind          strategy   compute ms  comm tensor ms  comm data ms  memory MiB  alternatives ms
-------------------  ------------  ---------  ----------  --------------  ------------  ----------  ---------------
linear_chain:body    linear_chain  replicate  0.012       0.000           0.000         0.07        -
linear_chain:body#1  linear_chain  replicate  0.012       0.000           0.000         0.07        -
(outside regions)    -             replicate  0.007       0.000           0.000         0.00        -

the step on every rank, ms per step:
    0.024  regions (the rows above, a folded row N times): compute
    0.007  nodes outside regions: compute
    0.219  gradient sync over the data ranks, exposed after overlapping the backward
    0.180  the loss's targets counted over the ranks splitting the batch
  = 0.430  predicted step
memory on every rank, MiB:
    0.03  parameters: 8648 elements on the rank, fp32 (4 B each)
    0.03  gradients (4 B each)
    0.07  optimizer state (AdamW's two moments, 8 B each)
    0.01  activations saved for backward (the batch of 4 row(s))
  = 0.14  predicted memory per rank

meshes weighed:
 * data=2 x tensor=1: step 0.430 ms, memory 0.14 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 2 (data=0, tensor=0); built by passes: analysis -> tensor_parallel -> data_parallel
def forward(self, input_0, target):
    model_body_0 = getattr(self.model.body, "0")(input_0);  input_0 = None
    model_body_1 = getattr(self.model.body, "1")(model_body_0);  model_body_0 = None
    model_body_2 = getattr(self.model.body, "2")(model_body_1);  model_body_1 = None
    model_body_3 = getattr(self.model.body, "3")(model_body_2);  model_body_2 = None
    model_body_4 = getattr(self.model.body, "4")(model_body_3);  model_body_3 = None
    model_body_5 = getattr(self.model.body, "5")(model_body_4);  model_body_4 = None
    model_head = self.model.head(model_body_5);  model_body_5 = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  model_head = target = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")

    def test_transformer_data(self):
        table, code = _plan_and_graph(transformer, 2, {"data": 2})
        self.assertExpectedInline(table, """\
autopar plan: TinyTransformer on 2 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 4 (forced)
mesh: data=2 x tensor=1   (rank = data*1 + tensor; tensor ranks adjacent)
predicted step 0.669 ms: compute 0.181 ms, data comm 0.487 ms, tensor comm 0.000 ms; memory per rank 0.59 MiB
model: 1.121e+07 FLOP per step -> 8.385e+09 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 2 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region                   kind          strategy   compute ms  comm tensor ms  comm data ms  memory MiB  alternatives ms
-----------------------  ------------  ---------  ----------  --------------  ------------  ----------  ---------------
vocab:tok                vocab         replicate  0.010       0.000           0.000         0.04        -
attention:blocks.0.attn  attention     replicate  0.038       0.000           0.000         0.09        -
attention:blocks.1.attn  attention     replicate  0.038       0.000           0.000         0.09        -
linear_chain:blocks.0    linear_chain  replicate  0.023       0.000           0.000         0.16        -
linear_chain:blocks.1    linear_chain  replicate  0.023       0.000           0.000         0.16        -
(outside regions)        -             replicate  0.048       0.000           0.000         0.06        -

the step on every rank, ms per step:
    0.133  regions (the rows above, a folded row N times): compute
    0.048  nodes outside regions: compute
    0.307  gradient sync over the data ranks, exposed after overlapping the backward
    0.180  the loss's targets counted over the ranks splitting the batch
  = 0.669  predicted step
memory on every rank, MiB:
    0.11  parameters: 2.803e+04 elements on the rank, fp32 (4 B each)
    0.11  gradients (4 B each)
    0.21  optimizer state (AdamW's two moments, 8 B each)
    0.16  activations saved for backward (the batch of 2 row(s))
  = 0.59  predicted memory per rank

meshes weighed:
 * data=2 x tensor=1: step 0.669 ms, memory 0.59 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 2 (data=0, tensor=0); built by passes: analysis -> tensor_parallel -> data_parallel
torch.fx._symbolic_trace.wrap("math_sqrt")

def forward(self, input_0, target):
    size = input_0.size(1)
    getattr_1 = input_0.device
    arange = torch.arange(size, device = getattr_1);  size = getattr_1 = None
    model_tok = self.model.tok(input_0);  input_0 = None
    model_pos = self.model.pos(arange);  arange = None
    add = model_tok + model_pos;  model_tok = model_pos = None
    model_blocks_0_ln1 = getattr(self.model.blocks, "0").ln1(add)
    size_1 = model_blocks_0_ln1.size()
    getitem = size_1[0]
    getitem_1 = size_1[1]
    getitem_2 = size_1[2];  size_1 = None
    model_blocks_0_attn_qkv = getattr(self.model.blocks, "0").attn.qkv(model_blocks_0_ln1)
    split = model_blocks_0_attn_qkv.split(32, dim = 2);  model_blocks_0_attn_qkv = None
    getitem_3 = split[0]
    getitem_4 = split[1]
    getitem_5 = split[2];  split = None
    floordiv = getitem_2 // 4
    view = getitem_3.view(getitem, getitem_1, 4, floordiv);  getitem_3 = floordiv = None
    transpose = view.transpose(1, 2);  view = None
    floordiv_1 = getitem_2 // 4
    view_1 = getitem_4.view(getitem, getitem_1, 4, floordiv_1);  getitem_4 = floordiv_1 = None
    transpose_1 = view_1.transpose(1, 2);  view_1 = None
    floordiv_2 = getitem_2 // 4
    view_2 = getitem_5.view(getitem, getitem_1, 4, floordiv_2);  getitem_5 = floordiv_2 = None
    transpose_2 = view_2.transpose(1, 2);  view_2 = None
    transpose_3 = transpose_1.transpose(-2, -1)
    matmul = transpose @ transpose_3;  transpose = transpose_3 = None
    size_2 = transpose_1.size(-1);  transpose_1 = None
    sqrt = math_sqrt(size_2);  size_2 = None
    truediv = 1.0 / sqrt;  sqrt = None
    mul = matmul * truediv;  matmul = truediv = None
    new_ones = model_blocks_0_ln1.new_ones(getitem_1, getitem_1, dtype = torch.bool);  model_blocks_0_ln1 = None
    tril = new_ones.tril();  new_ones = None
    invert = ~tril;  tril = None
    masked_fill = mul.masked_fill(invert, -inf);  mul = invert = None
    softmax = torch.nn.functional.softmax(masked_fill, dim = -1, _stacklevel = 3, dtype = None);  masked_fill = None
    matmul_1 = softmax @ transpose_2;  softmax = transpose_2 = None
    transpose_4 = matmul_1.transpose(1, 2);  matmul_1 = None
    contiguous = transpose_4.contiguous();  transpose_4 = None
    view_3 = contiguous.view(getitem, getitem_1, getitem_2);  contiguous = getitem = getitem_1 = getitem_2 = None
    model_blocks_0_attn_proj = getattr(self.model.blocks, "0").attn.proj(view_3);  view_3 = None
    add_1 = add + model_blocks_0_attn_proj;  add = model_blocks_0_attn_proj = None
    model_blocks_0_ln2 = getattr(self.model.blocks, "0").ln2(add_1)
    model_blocks_0_fc = getattr(self.model.blocks, "0").fc(model_blocks_0_ln2);  model_blocks_0_ln2 = None
    gelu = torch._C._nn.gelu(model_blocks_0_fc);  model_blocks_0_fc = None
    model_blocks_0_proj = getattr(self.model.blocks, "0").proj(gelu);  gelu = None
    add_2 = add_1 + model_blocks_0_proj;  add_1 = model_blocks_0_proj = None
    model_blocks_1_ln1 = getattr(self.model.blocks, "1").ln1(add_2)
    size_3 = model_blocks_1_ln1.size()
    getitem_6 = size_3[0]
    getitem_7 = size_3[1]
    getitem_8 = size_3[2];  size_3 = None
    model_blocks_1_attn_qkv = getattr(self.model.blocks, "1").attn.qkv(model_blocks_1_ln1)
    split_1 = model_blocks_1_attn_qkv.split(32, dim = 2);  model_blocks_1_attn_qkv = None
    getitem_9 = split_1[0]
    getitem_10 = split_1[1]
    getitem_11 = split_1[2];  split_1 = None
    floordiv_3 = getitem_8 // 4
    view_4 = getitem_9.view(getitem_6, getitem_7, 4, floordiv_3);  getitem_9 = floordiv_3 = None
    transpose_5 = view_4.transpose(1, 2);  view_4 = None
    floordiv_4 = getitem_8 // 4
    view_5 = getitem_10.view(getitem_6, getitem_7, 4, floordiv_4);  getitem_10 = floordiv_4 = None
    transpose_6 = view_5.transpose(1, 2);  view_5 = None
    floordiv_5 = getitem_8 // 4
    view_6 = getitem_11.view(getitem_6, getitem_7, 4, floordiv_5);  getitem_11 = floordiv_5 = None
    transpose_7 = view_6.transpose(1, 2);  view_6 = None
    transpose_8 = transpose_6.transpose(-2, -1)
    matmul_2 = transpose_5 @ transpose_8;  transpose_5 = transpose_8 = None
    size_4 = transpose_6.size(-1);  transpose_6 = None
    sqrt_1 = math_sqrt(size_4);  size_4 = None
    truediv_1 = 1.0 / sqrt_1;  sqrt_1 = None
    mul_1 = matmul_2 * truediv_1;  matmul_2 = truediv_1 = None
    new_ones_1 = model_blocks_1_ln1.new_ones(getitem_7, getitem_7, dtype = torch.bool);  model_blocks_1_ln1 = None
    tril_1 = new_ones_1.tril();  new_ones_1 = None
    invert_1 = ~tril_1;  tril_1 = None
    masked_fill_1 = mul_1.masked_fill(invert_1, -inf);  mul_1 = invert_1 = None
    softmax_1 = torch.nn.functional.softmax(masked_fill_1, dim = -1, _stacklevel = 3, dtype = None);  masked_fill_1 = None
    matmul_3 = softmax_1 @ transpose_7;  softmax_1 = transpose_7 = None
    transpose_9 = matmul_3.transpose(1, 2);  matmul_3 = None
    contiguous_1 = transpose_9.contiguous();  transpose_9 = None
    view_7 = contiguous_1.view(getitem_6, getitem_7, getitem_8);  contiguous_1 = getitem_6 = getitem_7 = getitem_8 = None
    model_blocks_1_attn_proj = getattr(self.model.blocks, "1").attn.proj(view_7);  view_7 = None
    add_3 = add_2 + model_blocks_1_attn_proj;  add_2 = model_blocks_1_attn_proj = None
    model_blocks_1_ln2 = getattr(self.model.blocks, "1").ln2(add_3)
    model_blocks_1_fc = getattr(self.model.blocks, "1").fc(model_blocks_1_ln2);  model_blocks_1_ln2 = None
    gelu_1 = torch._C._nn.gelu(model_blocks_1_fc);  model_blocks_1_fc = None
    model_blocks_1_proj = getattr(self.model.blocks, "1").proj(gelu_1);  gelu_1 = None
    add_4 = add_3 + model_blocks_1_proj;  add_3 = model_blocks_1_proj = None
    model_ln_f = self.model.ln_f(add_4);  add_4 = None
    model_lm_head = self.model.lm_head(model_ln_f);  model_ln_f = None
    flatten = model_lm_head.flatten(0, 1);  model_lm_head = None
    flatten_1 = target.flatten();  target = None
    cross_entropy = torch.nn.functional.cross_entropy(flatten, flatten_1, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  flatten = flatten_1 = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")
