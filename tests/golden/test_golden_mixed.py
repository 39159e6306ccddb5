"""Golden text of a mixed plan: the plan table and the rewritten rank graphs (built in
this process: the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_mixed.py`` and read the diff.
"""
import expecttest

from golden_helpers import _plan_and_graph
from examples.factories import stem_trunk


class TestGoldenMixed(expecttest.TestCase):
    def test_mixed_stem_trunk(self):
        """A mixed plan (docs/mixed_plans.md): D&SP on the stem, Megatron attention, 3D MLPs
        over one tensor group of 4; rank 1 runs branch b2 only."""
        table, code = _plan_and_graph(stem_trunk, 4, {"data": 1, "tensor": 4, "regions": {
            "kind:fork_join": "dsp", "kind:attention": "megatron", "kind:linear_chain": {"tensor3d": {"x": 2, "y": 2}}}},
            rank=1)
        self.assertExpectedInline(table, """\
autopar plan: StemTrunk on 4 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 8 (forced)
mesh: data=1 x tensor=4   (rank = data*4 + tensor; tensor ranks adjacent); mixed: each region its own family over the tensor group, 3D regions on it as Gx=2 x Gy=2 (tensor = y*Gx + x)
predicted step 10.504 ms: compute 0.257 ms, data comm 0.000 ms, tensor comm 6.730 ms, x comm 0.753 ms, y comm 2.764 ms, z comm 0.000 ms; memory per rank 0.45 MiB
model: 2.227e+07 FLOP per step -> 5.301e+08 FLOP/s per device predicted
best single-family plan: none weighed (the mixed plan was forced)

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 8 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region                   kind          strategy   compute ms  comm tensor ms  comm data ms  comm x ms  comm y ms  comm z ms  memory MiB  alternatives ms
-----------------------  ------------  ---------  ----------  --------------  ------------  ---------  ---------  ---------  ----------  -------------------------------
fork_join:b1             fork_join     dsp        0.021       1.820           0.000         0.000      0.000      0.000      0.02        replicate 0.049
attention:blocks.0.attn  attention     megatron   0.038       2.455           0.000         0.000      0.000      0.000      0.04        replicate 0.076, tensor3d 1.733
linear_chain:blocks.0    linear_chain  tensor3d   0.028       0.000           0.000         0.376      1.382      0.000      0.09        megatron 2.478, replicate 0.060
attention:blocks.1.attn  attention     megatron   0.038       2.455           0.000         0.000      0.000      0.000      0.04        replicate 0.076, tensor3d 1.733
linear_chain:blocks.1    linear_chain  tensor3d   0.028       0.000           0.000         0.376      1.382      0.000      0.09        megatron 2.478, replicate 0.060
(outside regions)        -             replicate  0.104       0.000           0.000         0.000      0.000      0.000      0.17        -

the step on every rank, ms per step:
     0.153  regions (the rows above, a folded row N times): compute
     6.730  regions (the rows above, a folded row N times): communication over tensor
     0.753  regions (the rows above, a folded row N times): communication over x
     2.764  regions (the rows above, a folded row N times): communication over y
     0.104  nodes outside regions: compute
  = 10.504  predicted step
memory on every rank, MiB:
    0.03  parameters: 8433 elements on the rank, fp32 (4 B each)
    0.03  gradients (4 B each)
    0.06  optimizer state (AdamW's two moments, 8 B each)
    0.33  activations saved for backward (the batch of 8 row(s))
  = 0.45  predicted memory per rank

boundaries (the conversions from and to the activation replicated over the tensor group; the region's communication per step):
  fork_join:b1: fork (identity; backward all-reduce over tensor), join (all-gather of the branches' columns over tensor; backward the own columns): tensor 1.820 ms
  attention:blocks.0.attn: entry f (identity; backward all-reduce over tensor), exit g (all-reduce over tensor; backward identity): tensor 2.455 ms
  linear_chain:blocks.0: input cut to y blocks (backward all-gather over y), output all-gathered over y: x 0.376 ms, y 1.382 ms
  attention:blocks.1.attn: entry f (identity; backward all-reduce over tensor), exit g (all-reduce over tensor; backward identity): tensor 2.455 ms
  linear_chain:blocks.1: input cut to y blocks (backward all-gather over y), output all-gathered over y: x 0.376 ms, y 1.382 ms

branches on sub-grids:
  fork_join:b1: pinned by 'kind:fork_join': D&SP: branches over the 4 tensor ranks (t0:[2], t1:[1], t2:[3], t3:[0])

3D layers (orientation by data flow; Algorithm 1: all-gather W over z, all-reduce the output over the in axis; backward: all-reduce dI over the out axis, reduce-scatter dW over z):
  linear_chain:blocks.0: model_blocks_0_fc plain (in y, out x); model_blocks_0_proj transposed (in x, out y)
    boundary: input cut to y blocks (backward all-gather over y), output all-gathered over y
  linear_chain:blocks.1: model_blocks_1_fc plain (in y, out x); model_blocks_1_proj transposed (in x, out y)
    boundary: input cut to y blocks (backward all-gather over y), output all-gathered over y

meshes weighed:
 * data=1 x tensor=4, mixed tensor3d 2x2: step 10.504 ms, memory 0.45 MiB""")
        self.assertExpectedInline(code, """\
# rank 1 of 4 (data=0, tensor=1); built by passes: analysis -> dsp -> tensor_parallel -> tensor3d -> data_parallel
torch.fx._symbolic_trace.wrap("math_sqrt")

def forward(self, input_0, target):
    model_stem = self.model.stem(input_0);  input_0 = None
    relu = torch.nn.functional.relu(model_stem, inplace = False);  model_stem = None
    copy_to_tensor_region = autopar_runtime_collectives_copy_to_tensor_region(relu, 'tensor');  relu = None
    model_b2_0 = getattr(self.model.b2, "0")(copy_to_tensor_region);  copy_to_tensor_region = None
    model_b2_1 = getattr(self.model.b2, "1")(model_b2_0);  model_b2_0 = None
    model_b2_2 = getattr(self.model.b2, "2")(model_b2_1);  model_b2_1 = None
    branch_all_gather = autopar_strategies_dsp_collectives_branch_all_gather(model_b2_2, 1, [8, 8, 8, 8], 'tensor');  model_b2_2 = None
    split_2 = torch.functional.split(branch_all_gather, [8, 8, 8, 8], 1);  branch_all_gather = None
    getitem_12 = split_2[0]
    getitem_13 = split_2[1]
    getitem_14 = split_2[2]
    getitem_15 = split_2[3];  split_2 = None
    cat_1 = torch.cat([getitem_15, getitem_13, getitem_12, getitem_14], 1);  getitem_15 = getitem_13 = getitem_12 = getitem_14 = None
    flatten = cat_1.flatten(2);  cat_1 = None
    transpose = flatten.transpose(1, 2);  flatten = None
    model_pos = self.model.pos
    add = transpose + model_pos;  transpose = model_pos = None
    model_blocks_0_ln1 = getattr(self.model.blocks, "0").ln1(add)
    copy_to_tensor_region_1 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_0_ln1, 'tensor')
    size = model_blocks_0_ln1.size()
    getitem = size[0]
    getitem_1 = size[1]
    getitem_2 = size[2];  size = None
    model_blocks_0_attn_qkv = getattr(self.model.blocks, "0").attn.qkv(copy_to_tensor_region_1);  copy_to_tensor_region_1 = None
    split = model_blocks_0_attn_qkv.split(8, dim = 2);  model_blocks_0_attn_qkv = None
    getitem_3 = split[0]
    getitem_4 = split[1]
    getitem_5 = split[2];  split = None
    floordiv = getitem_2 // 4
    view = getitem_3.view(getitem, getitem_1, 1, floordiv);  getitem_3 = floordiv = None
    transpose_1 = view.transpose(1, 2);  view = None
    floordiv_1 = getitem_2 // 4
    view_1 = getitem_4.view(getitem, getitem_1, 1, floordiv_1);  getitem_4 = floordiv_1 = None
    transpose_2 = view_1.transpose(1, 2);  view_1 = None
    floordiv_2 = getitem_2 // 4
    view_2 = getitem_5.view(getitem, getitem_1, 1, floordiv_2);  getitem_5 = floordiv_2 = None
    transpose_3 = view_2.transpose(1, 2);  view_2 = None
    transpose_4 = transpose_2.transpose(-2, -1)
    matmul = transpose_1 @ transpose_4;  transpose_1 = transpose_4 = None
    size_1 = transpose_2.size(-1);  transpose_2 = None
    sqrt = math_sqrt(size_1);  size_1 = None
    truediv = 1.0 / sqrt;  sqrt = None
    mul = matmul * truediv;  matmul = truediv = None
    new_ones = model_blocks_0_ln1.new_ones(getitem_1, getitem_1, dtype = torch.bool);  model_blocks_0_ln1 = None
    tril = new_ones.tril();  new_ones = None
    invert = ~tril;  tril = None
    masked_fill = mul.masked_fill(invert, -inf);  mul = invert = None
    softmax = torch.nn.functional.softmax(masked_fill, dim = -1, _stacklevel = 3, dtype = None);  masked_fill = None
    matmul_1 = softmax @ transpose_3;  softmax = transpose_3 = None
    transpose_5 = matmul_1.transpose(1, 2);  matmul_1 = None
    contiguous = transpose_5.contiguous();  transpose_5 = None
    floordiv_6 = getitem_2 // 4;  getitem_2 = None
    view_3 = contiguous.view(getitem, getitem_1, floordiv_6);  contiguous = getitem = getitem_1 = floordiv_6 = None
    model_blocks_0_attn_proj_weight = getattr(self.model.blocks, "0").attn.proj.weight
    linear = torch._C._nn.linear(view_3, model_blocks_0_attn_proj_weight);  view_3 = model_blocks_0_attn_proj_weight = None
    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(linear, 'tensor');  linear = None
    model_blocks_0_attn_proj_bias = getattr(self.model.blocks, "0").attn.proj.bias
    add_5 = reduce_from_tensor_region + model_blocks_0_attn_proj_bias;  reduce_from_tensor_region = model_blocks_0_attn_proj_bias = None
    add_1 = add + add_5;  add = add_5 = None
    model_blocks_0_ln2 = getattr(self.model.blocks, "0").ln2(add_1)
    scatter_to_tensor_region = autopar_runtime_collectives_scatter_to_tensor_region(model_blocks_0_ln2, 2, 'y');  model_blocks_0_ln2 = None
    model_blocks_0_fc_weight = getattr(self.model.blocks, "0").fc.weight
    model_blocks_0_fc_bias = getattr(self.model.blocks, "0").fc.bias
    model_blocks_0_proj_weight_1 = getattr(self.model.blocks, "0").proj.weight
    linear_3d = autopar_strategies_tensor3d_runtime_linear_3d(scatter_to_tensor_region, model_blocks_0_fc_weight, model_blocks_0_fc_bias, (64, 16), 'y', 'x', False, prefetch = model_blocks_0_proj_weight_1, checkpointed = False);  scatter_to_tensor_region = model_blocks_0_fc_weight = model_blocks_0_fc_bias = model_blocks_0_proj_weight_1 = None
    gelu = torch._C._nn.gelu(linear_3d);  linear_3d = None
    model_blocks_0_proj_weight = getattr(self.model.blocks, "0").proj.weight
    model_blocks_0_proj_bias = getattr(self.model.blocks, "0").proj.bias
    model_blocks_1_fc_weight_1 = getattr(self.model.blocks, "1").fc.weight
    linear_3d_1 = autopar_strategies_tensor3d_runtime_linear_3d(gelu, model_blocks_0_proj_weight, model_blocks_0_proj_bias, (16, 64), 'x', 'y', False, prefetch = model_blocks_1_fc_weight_1, checkpointed = False);  gelu = model_blocks_0_proj_weight = model_blocks_0_proj_bias = model_blocks_1_fc_weight_1 = None
    gather_from_tensor_region = autopar_runtime_collectives_gather_from_tensor_region(linear_3d_1, 2, 'y');  linear_3d_1 = None
    add_2 = add_1 + gather_from_tensor_region;  add_1 = gather_from_tensor_region = None
    model_blocks_1_ln1 = getattr(self.model.blocks, "1").ln1(add_2)
    copy_to_tensor_region_2 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_1_ln1, 'tensor')
    size_2 = model_blocks_1_ln1.size()
    getitem_6 = size_2[0]
    getitem_7 = size_2[1]
    getitem_8 = size_2[2];  size_2 = None
    model_blocks_1_attn_qkv = getattr(self.model.blocks, "1").attn.qkv(copy_to_tensor_region_2);  copy_to_tensor_region_2 = None
    split_1 = model_blocks_1_attn_qkv.split(8, dim = 2);  model_blocks_1_attn_qkv = None
    getitem_9 = split_1[0]
    getitem_10 = split_1[1]
    getitem_11 = split_1[2];  split_1 = None
    floordiv_3 = getitem_8 // 4
    view_4 = getitem_9.view(getitem_6, getitem_7, 1, floordiv_3);  getitem_9 = floordiv_3 = None
    transpose_6 = view_4.transpose(1, 2);  view_4 = None
    floordiv_4 = getitem_8 // 4
    view_5 = getitem_10.view(getitem_6, getitem_7, 1, floordiv_4);  getitem_10 = floordiv_4 = None
    transpose_7 = view_5.transpose(1, 2);  view_5 = None
    floordiv_5 = getitem_8 // 4
    view_6 = getitem_11.view(getitem_6, getitem_7, 1, floordiv_5);  getitem_11 = floordiv_5 = None
    transpose_8 = view_6.transpose(1, 2);  view_6 = None
    transpose_9 = transpose_7.transpose(-2, -1)
    matmul_2 = transpose_6 @ transpose_9;  transpose_6 = transpose_9 = None
    size_3 = transpose_7.size(-1);  transpose_7 = None
    sqrt_1 = math_sqrt(size_3);  size_3 = None
    truediv_1 = 1.0 / sqrt_1;  sqrt_1 = None
    mul_1 = matmul_2 * truediv_1;  matmul_2 = truediv_1 = None
    new_ones_1 = model_blocks_1_ln1.new_ones(getitem_7, getitem_7, dtype = torch.bool);  model_blocks_1_ln1 = None
    tril_1 = new_ones_1.tril();  new_ones_1 = None
    invert_1 = ~tril_1;  tril_1 = None
    masked_fill_1 = mul_1.masked_fill(invert_1, -inf);  mul_1 = invert_1 = None
    softmax_1 = torch.nn.functional.softmax(masked_fill_1, dim = -1, _stacklevel = 3, dtype = None);  masked_fill_1 = None
    matmul_3 = softmax_1 @ transpose_8;  softmax_1 = transpose_8 = None
    transpose_10 = matmul_3.transpose(1, 2);  matmul_3 = None
    contiguous_1 = transpose_10.contiguous();  transpose_10 = None
    floordiv_7 = getitem_8 // 4;  getitem_8 = None
    view_7 = contiguous_1.view(getitem_6, getitem_7, floordiv_7);  contiguous_1 = getitem_6 = getitem_7 = floordiv_7 = None
    model_blocks_1_attn_proj_weight = getattr(self.model.blocks, "1").attn.proj.weight
    linear_1 = torch._C._nn.linear(view_7, model_blocks_1_attn_proj_weight);  view_7 = model_blocks_1_attn_proj_weight = None
    reduce_from_tensor_region_1 = autopar_runtime_collectives_reduce_from_tensor_region(linear_1, 'tensor');  linear_1 = None
    model_blocks_1_attn_proj_bias = getattr(self.model.blocks, "1").attn.proj.bias
    add_6 = reduce_from_tensor_region_1 + model_blocks_1_attn_proj_bias;  reduce_from_tensor_region_1 = model_blocks_1_attn_proj_bias = None
    add_3 = add_2 + add_6;  add_2 = add_6 = None
    model_blocks_1_ln2 = getattr(self.model.blocks, "1").ln2(add_3)
    scatter_to_tensor_region_1 = autopar_runtime_collectives_scatter_to_tensor_region(model_blocks_1_ln2, 2, 'y');  model_blocks_1_ln2 = None
    model_blocks_1_fc_weight = getattr(self.model.blocks, "1").fc.weight
    model_blocks_1_fc_bias = getattr(self.model.blocks, "1").fc.bias
    model_blocks_1_proj_weight_1 = getattr(self.model.blocks, "1").proj.weight
    linear_3d_2 = autopar_strategies_tensor3d_runtime_linear_3d(scatter_to_tensor_region_1, model_blocks_1_fc_weight, model_blocks_1_fc_bias, (64, 16), 'y', 'x', False, prefetch = model_blocks_1_proj_weight_1, checkpointed = False);  scatter_to_tensor_region_1 = model_blocks_1_fc_weight = model_blocks_1_fc_bias = model_blocks_1_proj_weight_1 = None
    gelu_1 = torch._C._nn.gelu(linear_3d_2);  linear_3d_2 = None
    model_blocks_1_proj_weight = getattr(self.model.blocks, "1").proj.weight
    model_blocks_1_proj_bias = getattr(self.model.blocks, "1").proj.bias
    linear_3d_3 = autopar_strategies_tensor3d_runtime_linear_3d(gelu_1, model_blocks_1_proj_weight, model_blocks_1_proj_bias, (16, 64), 'x', 'y', False, prefetch = None, checkpointed = False);  gelu_1 = model_blocks_1_proj_weight = model_blocks_1_proj_bias = None
    gather_from_tensor_region_1 = autopar_runtime_collectives_gather_from_tensor_region(linear_3d_3, 2, 'y');  linear_3d_3 = None
    add_4 = add_3 + gather_from_tensor_region_1;  add_3 = gather_from_tensor_region_1 = None
    model_ln_f = self.model.ln_f(add_4);  add_4 = None
    mean = model_ln_f.mean(1);  model_ln_f = None
    model_head = self.model.head(mean);  mean = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'mean', label_smoothing = 0.0);  model_head = target = None
    return cross_entropy
    
""")
