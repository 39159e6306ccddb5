"""Golden text of Megatron's tensor parallelism, alone and with data: the plan table and the rewritten rank graphs (built in
this process: the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_megatron.py`` and read the diff.
"""
import expecttest

from golden_helpers import _plan_and_graph
from examples.factories import mlp, transformer


class TestGoldenMegatron(expecttest.TestCase):
    def test_mlp_tensor(self):
        table, code = _plan_and_graph(mlp, 2, {"tensor": 2})
        self.assertExpectedInline(table, """\
autopar plan: MLP on 2 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 8 (forced)
mesh: data=1 x tensor=2   (rank = data*2 + tensor; tensor ranks adjacent)
predicted step 0.755 ms: compute 0.031 ms, data comm 0.000 ms, tensor comm 0.724 ms; memory per rank 0.07 MiB
model: 4.086e+05 FLOP per step -> 2.707e+08 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 8 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region               kind          strategy   compute ms  comm tensor ms  comm data ms  memory MiB  alternatives ms
-------------------  ------------  ---------  ----------  --------------  ------------  ----------  ---------------
linear_chain:body    linear_chain  megatron   0.012       0.362           0.000         0.03        replicate 0.013
linear_chain:body#1  linear_chain  megatron   0.012       0.362           0.000         0.03        replicate 0.013
(outside regions)    -             replicate  0.007       0.000           0.000         0.00        -

the step on every rank, ms per step:
    0.024  regions (the rows above, a folded row N times): compute
    0.724  regions (the rows above, a folded row N times): communication over tensor
    0.007  nodes outside regions: compute
  = 0.755  predicted step
memory on every rank, MiB:
    0.02  parameters: 4456 elements on the rank, fp32 (4 B each)
    0.02  gradients (4 B each)
    0.03  optimizer state (AdamW's two moments, 8 B each)
    0.01  activations saved for backward (the batch of 8 row(s))
  = 0.07  predicted memory per rank

meshes weighed:
 * data=1 x tensor=2: step 0.755 ms, memory 0.07 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 2 (data=0, tensor=0); built by passes: analysis -> tensor_parallel -> data_parallel
def forward(self, input_0, target):
    copy_to_tensor_region = autopar_runtime_collectives_copy_to_tensor_region(input_0, 'tensor');  input_0 = None
    model_body_0 = getattr(self.model.body, "0")(copy_to_tensor_region);  copy_to_tensor_region = None
    model_body_1 = getattr(self.model.body, "1")(model_body_0);  model_body_0 = None
    model_body_2_weight = getattr(self.model.body, "2").weight
    linear = torch._C._nn.linear(model_body_1, model_body_2_weight);  model_body_1 = model_body_2_weight = None
    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(linear, 'tensor');  linear = None
    model_body_2_bias = getattr(self.model.body, "2").bias
    add = reduce_from_tensor_region + model_body_2_bias;  reduce_from_tensor_region = model_body_2_bias = None
    copy_to_tensor_region_1 = autopar_runtime_collectives_copy_to_tensor_region(add, 'tensor');  add = None
    model_body_3 = getattr(self.model.body, "3")(copy_to_tensor_region_1);  copy_to_tensor_region_1 = None
    model_body_4 = getattr(self.model.body, "4")(model_body_3);  model_body_3 = None
    model_body_5_weight = getattr(self.model.body, "5").weight
    linear_1 = torch._C._nn.linear(model_body_4, model_body_5_weight);  model_body_4 = model_body_5_weight = None
    reduce_from_tensor_region_1 = autopar_runtime_collectives_reduce_from_tensor_region(linear_1, 'tensor');  linear_1 = None
    model_body_5_bias = getattr(self.model.body, "5").bias
    add_1 = reduce_from_tensor_region_1 + model_body_5_bias;  reduce_from_tensor_region_1 = model_body_5_bias = None
    model_head = self.model.head(add_1);  add_1 = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'mean', label_smoothing = 0.0);  model_head = target = None
    return cross_entropy
    
""")

    def test_mlp_data_tensor(self):
        table, code = _plan_and_graph(mlp, 4, {"data": 2, "tensor": 2})
        self.assertExpectedInline(table, """\
autopar plan: MLP on 4 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 8 (forced)
mesh: data=2 x tensor=2   (rank = data*2 + tensor; tensor ranks adjacent)
predicted step 1.374 ms: compute 0.030 ms, data comm 0.622 ms, tensor comm 0.722 ms; memory per rank 0.07 MiB
model: 4.086e+05 FLOP per step -> 7.435e+07 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 4 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region               kind          strategy   compute ms  comm tensor ms  comm data ms  memory MiB  alternatives ms
-------------------  ------------  ---------  ----------  --------------  ------------  ----------  ---------------
linear_chain:body    linear_chain  megatron   0.012       0.361           0.000         0.03        replicate 0.012
linear_chain:body#1  linear_chain  megatron   0.012       0.361           0.000         0.03        replicate 0.012
(outside regions)    -             replicate  0.007       0.000           0.000         0.00        -

the step on every rank, ms per step:
    0.023  regions (the rows above, a folded row N times): compute
    0.722  regions (the rows above, a folded row N times): communication over tensor
    0.007  nodes outside regions: compute
    0.442  gradient sync over the data ranks, exposed after overlapping the backward
    0.180  the loss's targets counted over the ranks splitting the batch
  = 1.374  predicted step
memory on every rank, MiB:
    0.02  parameters: 4456 elements on the rank, fp32 (4 B each)
    0.02  gradients (4 B each)
    0.03  optimizer state (AdamW's two moments, 8 B each)
    0.00  activations saved for backward (the batch of 4 row(s))
  = 0.07  predicted memory per rank

meshes weighed:
 * data=2 x tensor=2: step 1.374 ms, memory 0.07 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 4 (data=0, tensor=0); built by passes: analysis -> tensor_parallel -> data_parallel
def forward(self, input_0, target):
    copy_to_tensor_region = autopar_runtime_collectives_copy_to_tensor_region(input_0, 'tensor');  input_0 = None
    model_body_0 = getattr(self.model.body, "0")(copy_to_tensor_region);  copy_to_tensor_region = None
    model_body_1 = getattr(self.model.body, "1")(model_body_0);  model_body_0 = None
    model_body_2_weight = getattr(self.model.body, "2").weight
    linear = torch._C._nn.linear(model_body_1, model_body_2_weight);  model_body_1 = model_body_2_weight = None
    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(linear, 'tensor');  linear = None
    model_body_2_bias = getattr(self.model.body, "2").bias
    add = reduce_from_tensor_region + model_body_2_bias;  reduce_from_tensor_region = model_body_2_bias = None
    copy_to_tensor_region_1 = autopar_runtime_collectives_copy_to_tensor_region(add, 'tensor');  add = None
    model_body_3 = getattr(self.model.body, "3")(copy_to_tensor_region_1);  copy_to_tensor_region_1 = None
    model_body_4 = getattr(self.model.body, "4")(model_body_3);  model_body_3 = None
    model_body_5_weight = getattr(self.model.body, "5").weight
    linear_1 = torch._C._nn.linear(model_body_4, model_body_5_weight);  model_body_4 = model_body_5_weight = None
    reduce_from_tensor_region_1 = autopar_runtime_collectives_reduce_from_tensor_region(linear_1, 'tensor');  linear_1 = None
    model_body_5_bias = getattr(self.model.body, "5").bias
    add_1 = reduce_from_tensor_region_1 + model_body_5_bias;  reduce_from_tensor_region_1 = model_body_5_bias = None
    model_head = self.model.head(add_1);  add_1 = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  model_head = target = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")

    def test_transformer_tensor(self):
        table, code = _plan_and_graph(transformer, 2, {"tensor": 2})
        self.assertExpectedInline(table, """\
autopar plan: TinyTransformer on 2 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 4 (forced)
mesh: data=1 x tensor=2   (rank = data*2 + tensor; tensor ranks adjacent)
predicted step 2.079 ms: compute 0.197 ms, data comm 0.000 ms, tensor comm 1.882 ms; memory per rank 0.43 MiB
model: 1.121e+07 FLOP per step -> 2.696e+09 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 4 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region                   kind          strategy   compute ms  comm tensor ms  comm data ms  memory MiB  alternatives ms
-----------------------  ------------  ---------  ----------  --------------  ------------  ----------  ---------------
vocab:tok                vocab         megatron   0.010       0.376           0.000         0.02        replicate 0.013
attention:blocks.0.attn  attention     megatron   0.038       0.376           0.000         0.06        replicate 0.051
attention:blocks.1.attn  attention     megatron   0.038       0.376           0.000         0.06        replicate 0.051
linear_chain:blocks.0    linear_chain  megatron   0.023       0.376           0.000         0.09        replicate 0.036
linear_chain:blocks.1    linear_chain  megatron   0.023       0.376           0.000         0.09        replicate 0.036
(outside regions)        -             replicate  0.064       0.000           0.000         0.11        -

the step on every rank, ms per step:
    0.133  regions (the rows above, a folded row N times): compute
    1.882  regions (the rows above, a folded row N times): communication over tensor
    0.064  nodes outside regions: compute
  = 2.079  predicted step
memory on every rank, MiB:
    0.06  parameters: 1.443e+04 elements on the rank, fp32 (4 B each)
    0.06  gradients (4 B each)
    0.11  optimizer state (AdamW's two moments, 8 B each)
    0.21  activations saved for backward (the batch of 4 row(s))
  = 0.43  predicted memory per rank

meshes weighed:
 * data=1 x tensor=2: step 2.079 ms, memory 0.43 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 2 (data=0, tensor=0); built by passes: analysis -> tensor_parallel -> data_parallel
torch.fx._symbolic_trace.wrap("math_sqrt")

def forward(self, input_0, target):
    size = input_0.size(1)
    getattr_1 = input_0.device
    arange = torch.arange(size, device = getattr_1);  size = getattr_1 = None
    model_tok_weight = self.model.tok.weight
    vocab_parallel_embedding = autopar_runtime_collectives_vocab_parallel_embedding(input_0, model_tok_weight, 0, 'tensor', None);  input_0 = model_tok_weight = None
    model_pos = self.model.pos(arange);  arange = None
    add = vocab_parallel_embedding + model_pos;  vocab_parallel_embedding = model_pos = None
    model_blocks_0_ln1 = getattr(self.model.blocks, "0").ln1(add)
    copy_to_tensor_region = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_0_ln1, 'tensor')
    size_1 = model_blocks_0_ln1.size()
    getitem = size_1[0]
    getitem_1 = size_1[1]
    getitem_2 = size_1[2];  size_1 = None
    model_blocks_0_attn_qkv = getattr(self.model.blocks, "0").attn.qkv(copy_to_tensor_region);  copy_to_tensor_region = None
    split = model_blocks_0_attn_qkv.split(16, dim = 2);  model_blocks_0_attn_qkv = None
    getitem_3 = split[0]
    getitem_4 = split[1]
    getitem_5 = split[2];  split = None
    floordiv = getitem_2 // 4
    view = getitem_3.view(getitem, getitem_1, 2, floordiv);  getitem_3 = floordiv = None
    transpose = view.transpose(1, 2);  view = None
    floordiv_1 = getitem_2 // 4
    view_1 = getitem_4.view(getitem, getitem_1, 2, floordiv_1);  getitem_4 = floordiv_1 = None
    transpose_1 = view_1.transpose(1, 2);  view_1 = None
    floordiv_2 = getitem_2 // 4
    view_2 = getitem_5.view(getitem, getitem_1, 2, floordiv_2);  getitem_5 = floordiv_2 = None
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
    floordiv_6 = getitem_2 // 2;  getitem_2 = None
    view_3 = contiguous.view(getitem, getitem_1, floordiv_6);  contiguous = getitem = getitem_1 = floordiv_6 = None
    model_blocks_0_attn_proj_weight = getattr(self.model.blocks, "0").attn.proj.weight
    linear = torch._C._nn.linear(view_3, model_blocks_0_attn_proj_weight);  view_3 = model_blocks_0_attn_proj_weight = None
    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(linear, 'tensor');  linear = None
    model_blocks_0_attn_proj_bias = getattr(self.model.blocks, "0").attn.proj.bias
    add_5 = reduce_from_tensor_region + model_blocks_0_attn_proj_bias;  reduce_from_tensor_region = model_blocks_0_attn_proj_bias = None
    add_1 = add + add_5;  add = add_5 = None
    model_blocks_0_ln2 = getattr(self.model.blocks, "0").ln2(add_1)
    copy_to_tensor_region_1 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_0_ln2, 'tensor');  model_blocks_0_ln2 = None
    model_blocks_0_fc = getattr(self.model.blocks, "0").fc(copy_to_tensor_region_1);  copy_to_tensor_region_1 = None
    gelu = torch._C._nn.gelu(model_blocks_0_fc);  model_blocks_0_fc = None
    model_blocks_0_proj_weight = getattr(self.model.blocks, "0").proj.weight
    linear_1 = torch._C._nn.linear(gelu, model_blocks_0_proj_weight);  gelu = model_blocks_0_proj_weight = None
    reduce_from_tensor_region_1 = autopar_runtime_collectives_reduce_from_tensor_region(linear_1, 'tensor');  linear_1 = None
    model_blocks_0_proj_bias = getattr(self.model.blocks, "0").proj.bias
    add_6 = reduce_from_tensor_region_1 + model_blocks_0_proj_bias;  reduce_from_tensor_region_1 = model_blocks_0_proj_bias = None
    add_2 = add_1 + add_6;  add_1 = add_6 = None
    model_blocks_1_ln1 = getattr(self.model.blocks, "1").ln1(add_2)
    copy_to_tensor_region_2 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_1_ln1, 'tensor')
    size_3 = model_blocks_1_ln1.size()
    getitem_6 = size_3[0]
    getitem_7 = size_3[1]
    getitem_8 = size_3[2];  size_3 = None
    model_blocks_1_attn_qkv = getattr(self.model.blocks, "1").attn.qkv(copy_to_tensor_region_2);  copy_to_tensor_region_2 = None
    split_1 = model_blocks_1_attn_qkv.split(16, dim = 2);  model_blocks_1_attn_qkv = None
    getitem_9 = split_1[0]
    getitem_10 = split_1[1]
    getitem_11 = split_1[2];  split_1 = None
    floordiv_3 = getitem_8 // 4
    view_4 = getitem_9.view(getitem_6, getitem_7, 2, floordiv_3);  getitem_9 = floordiv_3 = None
    transpose_5 = view_4.transpose(1, 2);  view_4 = None
    floordiv_4 = getitem_8 // 4
    view_5 = getitem_10.view(getitem_6, getitem_7, 2, floordiv_4);  getitem_10 = floordiv_4 = None
    transpose_6 = view_5.transpose(1, 2);  view_5 = None
    floordiv_5 = getitem_8 // 4
    view_6 = getitem_11.view(getitem_6, getitem_7, 2, floordiv_5);  getitem_11 = floordiv_5 = None
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
    floordiv_7 = getitem_8 // 2;  getitem_8 = None
    view_7 = contiguous_1.view(getitem_6, getitem_7, floordiv_7);  contiguous_1 = getitem_6 = getitem_7 = floordiv_7 = None
    model_blocks_1_attn_proj_weight = getattr(self.model.blocks, "1").attn.proj.weight
    linear_2 = torch._C._nn.linear(view_7, model_blocks_1_attn_proj_weight);  view_7 = model_blocks_1_attn_proj_weight = None
    reduce_from_tensor_region_2 = autopar_runtime_collectives_reduce_from_tensor_region(linear_2, 'tensor');  linear_2 = None
    model_blocks_1_attn_proj_bias = getattr(self.model.blocks, "1").attn.proj.bias
    add_7 = reduce_from_tensor_region_2 + model_blocks_1_attn_proj_bias;  reduce_from_tensor_region_2 = model_blocks_1_attn_proj_bias = None
    add_3 = add_2 + add_7;  add_2 = add_7 = None
    model_blocks_1_ln2 = getattr(self.model.blocks, "1").ln2(add_3)
    copy_to_tensor_region_3 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_1_ln2, 'tensor');  model_blocks_1_ln2 = None
    model_blocks_1_fc = getattr(self.model.blocks, "1").fc(copy_to_tensor_region_3);  copy_to_tensor_region_3 = None
    gelu_1 = torch._C._nn.gelu(model_blocks_1_fc);  model_blocks_1_fc = None
    model_blocks_1_proj_weight = getattr(self.model.blocks, "1").proj.weight
    linear_3 = torch._C._nn.linear(gelu_1, model_blocks_1_proj_weight);  gelu_1 = model_blocks_1_proj_weight = None
    reduce_from_tensor_region_3 = autopar_runtime_collectives_reduce_from_tensor_region(linear_3, 'tensor');  linear_3 = None
    model_blocks_1_proj_bias = getattr(self.model.blocks, "1").proj.bias
    add_8 = reduce_from_tensor_region_3 + model_blocks_1_proj_bias;  reduce_from_tensor_region_3 = model_blocks_1_proj_bias = None
    add_4 = add_3 + add_8;  add_3 = add_8 = None
    model_ln_f = self.model.ln_f(add_4);  add_4 = None
    copy_to_tensor_region_4 = autopar_runtime_collectives_copy_to_tensor_region(model_ln_f, 'tensor');  model_ln_f = None
    model_lm_head = self.model.lm_head(copy_to_tensor_region_4);  copy_to_tensor_region_4 = None
    flatten = model_lm_head.flatten(0, 1);  model_lm_head = None
    flatten_1 = target.flatten();  target = None
    vocab_parallel_cross_entropy = autopar_runtime_collectives_vocab_parallel_cross_entropy(flatten, flatten_1, 0, 'tensor', -100, 'mean');  flatten = flatten_1 = None
    return vocab_parallel_cross_entropy
    
""")

    def test_transformer_data_tensor(self):
        table, code = _plan_and_graph(transformer, 4, {"data": 2, "tensor": 2})
        self.assertExpectedInline(table, """\
autopar plan: TinyTransformer on 4 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 4 (forced)
mesh: data=2 x tensor=2   (rank = data*2 + tensor; tensor ranks adjacent)
predicted step 2.712 ms: compute 0.155 ms, data comm 0.716 ms, tensor comm 1.841 ms; memory per rank 0.32 MiB
model: 1.121e+07 FLOP per step -> 1.033e+09 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 2 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region                   kind          strategy   compute ms  comm tensor ms  comm data ms  memory MiB  alternatives ms
-----------------------  ------------  ---------  ----------  --------------  ------------  ----------  ---------------
vocab:tok                vocab         megatron   0.008       0.368           0.000         0.02        replicate 0.010
attention:blocks.0.attn  attention     megatron   0.032       0.368           0.000         0.04        replicate 0.038
attention:blocks.1.attn  attention     megatron   0.032       0.368           0.000         0.04        replicate 0.038
linear_chain:blocks.0    linear_chain  megatron   0.017       0.368           0.000         0.08        replicate 0.023
linear_chain:blocks.1    linear_chain  megatron   0.017       0.368           0.000         0.08        replicate 0.023
(outside regions)        -             replicate  0.048       0.000           0.000         0.06        -

the step on every rank, ms per step:
    0.107  regions (the rows above, a folded row N times): compute
    1.841  regions (the rows above, a folded row N times): communication over tensor
    0.048  nodes outside regions: compute
    0.536  gradient sync over the data ranks, exposed after overlapping the backward
    0.180  the loss's targets counted over the ranks splitting the batch
  = 2.712  predicted step
memory on every rank, MiB:
    0.06  parameters: 1.443e+04 elements on the rank, fp32 (4 B each)
    0.06  gradients (4 B each)
    0.11  optimizer state (AdamW's two moments, 8 B each)
    0.10  activations saved for backward (the batch of 2 row(s))
  = 0.32  predicted memory per rank

meshes weighed:
 * data=2 x tensor=2: step 2.712 ms, memory 0.32 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 4 (data=0, tensor=0); built by passes: analysis -> tensor_parallel -> data_parallel
torch.fx._symbolic_trace.wrap("math_sqrt")

def forward(self, input_0, target):
    size = input_0.size(1)
    getattr_1 = input_0.device
    arange = torch.arange(size, device = getattr_1);  size = getattr_1 = None
    model_tok_weight = self.model.tok.weight
    vocab_parallel_embedding = autopar_runtime_collectives_vocab_parallel_embedding(input_0, model_tok_weight, 0, 'tensor', None);  input_0 = model_tok_weight = None
    model_pos = self.model.pos(arange);  arange = None
    add = vocab_parallel_embedding + model_pos;  vocab_parallel_embedding = model_pos = None
    model_blocks_0_ln1 = getattr(self.model.blocks, "0").ln1(add)
    copy_to_tensor_region = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_0_ln1, 'tensor')
    size_1 = model_blocks_0_ln1.size()
    getitem = size_1[0]
    getitem_1 = size_1[1]
    getitem_2 = size_1[2];  size_1 = None
    model_blocks_0_attn_qkv = getattr(self.model.blocks, "0").attn.qkv(copy_to_tensor_region);  copy_to_tensor_region = None
    split = model_blocks_0_attn_qkv.split(16, dim = 2);  model_blocks_0_attn_qkv = None
    getitem_3 = split[0]
    getitem_4 = split[1]
    getitem_5 = split[2];  split = None
    floordiv = getitem_2 // 4
    view = getitem_3.view(getitem, getitem_1, 2, floordiv);  getitem_3 = floordiv = None
    transpose = view.transpose(1, 2);  view = None
    floordiv_1 = getitem_2 // 4
    view_1 = getitem_4.view(getitem, getitem_1, 2, floordiv_1);  getitem_4 = floordiv_1 = None
    transpose_1 = view_1.transpose(1, 2);  view_1 = None
    floordiv_2 = getitem_2 // 4
    view_2 = getitem_5.view(getitem, getitem_1, 2, floordiv_2);  getitem_5 = floordiv_2 = None
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
    floordiv_6 = getitem_2 // 2;  getitem_2 = None
    view_3 = contiguous.view(getitem, getitem_1, floordiv_6);  contiguous = getitem = getitem_1 = floordiv_6 = None
    model_blocks_0_attn_proj_weight = getattr(self.model.blocks, "0").attn.proj.weight
    linear = torch._C._nn.linear(view_3, model_blocks_0_attn_proj_weight);  view_3 = model_blocks_0_attn_proj_weight = None
    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(linear, 'tensor');  linear = None
    model_blocks_0_attn_proj_bias = getattr(self.model.blocks, "0").attn.proj.bias
    add_5 = reduce_from_tensor_region + model_blocks_0_attn_proj_bias;  reduce_from_tensor_region = model_blocks_0_attn_proj_bias = None
    add_1 = add + add_5;  add = add_5 = None
    model_blocks_0_ln2 = getattr(self.model.blocks, "0").ln2(add_1)
    copy_to_tensor_region_1 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_0_ln2, 'tensor');  model_blocks_0_ln2 = None
    model_blocks_0_fc = getattr(self.model.blocks, "0").fc(copy_to_tensor_region_1);  copy_to_tensor_region_1 = None
    gelu = torch._C._nn.gelu(model_blocks_0_fc);  model_blocks_0_fc = None
    model_blocks_0_proj_weight = getattr(self.model.blocks, "0").proj.weight
    linear_1 = torch._C._nn.linear(gelu, model_blocks_0_proj_weight);  gelu = model_blocks_0_proj_weight = None
    reduce_from_tensor_region_1 = autopar_runtime_collectives_reduce_from_tensor_region(linear_1, 'tensor');  linear_1 = None
    model_blocks_0_proj_bias = getattr(self.model.blocks, "0").proj.bias
    add_6 = reduce_from_tensor_region_1 + model_blocks_0_proj_bias;  reduce_from_tensor_region_1 = model_blocks_0_proj_bias = None
    add_2 = add_1 + add_6;  add_1 = add_6 = None
    model_blocks_1_ln1 = getattr(self.model.blocks, "1").ln1(add_2)
    copy_to_tensor_region_2 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_1_ln1, 'tensor')
    size_3 = model_blocks_1_ln1.size()
    getitem_6 = size_3[0]
    getitem_7 = size_3[1]
    getitem_8 = size_3[2];  size_3 = None
    model_blocks_1_attn_qkv = getattr(self.model.blocks, "1").attn.qkv(copy_to_tensor_region_2);  copy_to_tensor_region_2 = None
    split_1 = model_blocks_1_attn_qkv.split(16, dim = 2);  model_blocks_1_attn_qkv = None
    getitem_9 = split_1[0]
    getitem_10 = split_1[1]
    getitem_11 = split_1[2];  split_1 = None
    floordiv_3 = getitem_8 // 4
    view_4 = getitem_9.view(getitem_6, getitem_7, 2, floordiv_3);  getitem_9 = floordiv_3 = None
    transpose_5 = view_4.transpose(1, 2);  view_4 = None
    floordiv_4 = getitem_8 // 4
    view_5 = getitem_10.view(getitem_6, getitem_7, 2, floordiv_4);  getitem_10 = floordiv_4 = None
    transpose_6 = view_5.transpose(1, 2);  view_5 = None
    floordiv_5 = getitem_8 // 4
    view_6 = getitem_11.view(getitem_6, getitem_7, 2, floordiv_5);  getitem_11 = floordiv_5 = None
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
    floordiv_7 = getitem_8 // 2;  getitem_8 = None
    view_7 = contiguous_1.view(getitem_6, getitem_7, floordiv_7);  contiguous_1 = getitem_6 = getitem_7 = floordiv_7 = None
    model_blocks_1_attn_proj_weight = getattr(self.model.blocks, "1").attn.proj.weight
    linear_2 = torch._C._nn.linear(view_7, model_blocks_1_attn_proj_weight);  view_7 = model_blocks_1_attn_proj_weight = None
    reduce_from_tensor_region_2 = autopar_runtime_collectives_reduce_from_tensor_region(linear_2, 'tensor');  linear_2 = None
    model_blocks_1_attn_proj_bias = getattr(self.model.blocks, "1").attn.proj.bias
    add_7 = reduce_from_tensor_region_2 + model_blocks_1_attn_proj_bias;  reduce_from_tensor_region_2 = model_blocks_1_attn_proj_bias = None
    add_3 = add_2 + add_7;  add_2 = add_7 = None
    model_blocks_1_ln2 = getattr(self.model.blocks, "1").ln2(add_3)
    copy_to_tensor_region_3 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_1_ln2, 'tensor');  model_blocks_1_ln2 = None
    model_blocks_1_fc = getattr(self.model.blocks, "1").fc(copy_to_tensor_region_3);  copy_to_tensor_region_3 = None
    gelu_1 = torch._C._nn.gelu(model_blocks_1_fc);  model_blocks_1_fc = None
    model_blocks_1_proj_weight = getattr(self.model.blocks, "1").proj.weight
    linear_3 = torch._C._nn.linear(gelu_1, model_blocks_1_proj_weight);  gelu_1 = model_blocks_1_proj_weight = None
    reduce_from_tensor_region_3 = autopar_runtime_collectives_reduce_from_tensor_region(linear_3, 'tensor');  linear_3 = None
    model_blocks_1_proj_bias = getattr(self.model.blocks, "1").proj.bias
    add_8 = reduce_from_tensor_region_3 + model_blocks_1_proj_bias;  reduce_from_tensor_region_3 = model_blocks_1_proj_bias = None
    add_4 = add_3 + add_8;  add_3 = add_8 = None
    model_ln_f = self.model.ln_f(add_4);  add_4 = None
    copy_to_tensor_region_4 = autopar_runtime_collectives_copy_to_tensor_region(model_ln_f, 'tensor');  model_ln_f = None
    model_lm_head = self.model.lm_head(copy_to_tensor_region_4);  copy_to_tensor_region_4 = None
    flatten = model_lm_head.flatten(0, 1);  model_lm_head = None
    flatten_1 = target.flatten();  target = None
    vocab_parallel_cross_entropy = autopar_runtime_collectives_vocab_parallel_cross_entropy(flatten, flatten_1, 0, 'tensor', -100, 'sum');  flatten = flatten_1 = None
    global_mean = autopar_runtime_target_count_global_mean(vocab_parallel_cross_entropy);  vocab_parallel_cross_entropy = None
    return global_mean
    
""")
