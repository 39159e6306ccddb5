"""Tier 1: golden text for the plan table and rank 0's rewritten graph.

The MLP and the plain-PyTorch transformer under data, tensor and data × tensor plans,
built in this process (the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/test_golden.py`` and read the diff.
"""
import expecttest
import torch

import autopar
from autopar.runtime.executable import rank_graph_code
from examples.factories import inception, mixtral, mlp, stem_trunk, transformer


def _plan_and_graph(factory, world, strategy, rank=0):
    model, inputs, loss_fn, target = factory()
    plan = autopar.plan(model, world, inputs, loss_fn, strategy, example_target=target)
    gm = autopar.rank_graph(model, plan, rank, inputs, loss_fn, target)
    return plan.explain(), rank_graph_code(gm, plan, rank)


class TestGolden(expecttest.TestCase):
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

    def test_mixtral_experts(self):
        """Expert parallelism (docs/experts.md): the plan, and the lines of rank 3's program
        that run a routed layer (the router kept, the experts one call over the group)."""
        table, code = _plan_and_graph(mixtral, 4, {"data": 4, "experts": 2}, rank=3)
        self.assertExpectedInline(table, """\
autopar plan: MixtralForCausalLM on 4 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 4 (forced)
mesh: data=4 x tensor=1   (rank = data*1 + tensor; tensor ranks adjacent)
predicted step 4.484 ms: compute 0.316 ms, data comm 3.441 ms, experts comm 0.728 ms, tensor comm 0.000 ms; memory per rank 0.52 MiB
model: 5.548e+06 FLOP per step -> 3.093e+08 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 1 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region                                   kind          strategy   compute ms  comm tensor ms  comm data ms  comm experts ms  memory MiB  alternatives ms
---------------------------------------  ------------  ---------  ----------  --------------  ------------  ---------------  ----------  ---------------
vocab:model.embed_tokens                 vocab         replicate  0.007       0.000           0.000         0.000            0.06        -
attention:model.layers.0.self_attn       attention     replicate  0.044       0.000           0.000         0.000            0.05        -
attention:model.layers.1.self_attn       attention     replicate  0.044       0.000           0.000         0.000            0.05        -
linear_chain:model.layers.0.mlp.experts  linear_chain  experts    0.017       0.000           0.000         0.000            0.14        replicate 0.017
linear_chain:model.layers.1.mlp.experts  linear_chain  experts    0.017       0.000           0.000         0.000            0.14        replicate 0.017
experts:model.layers.0.mlp               experts       experts    0.000       0.000           0.000         0.364            0.00        replicate 1.340
experts:model.layers.1.mlp               experts       experts    0.000       0.000           0.000         0.364            0.00        replicate 1.340
(outside regions)                        -             replicate  0.186       0.000           0.000         0.000            0.04        -

the step on every rank, ms per step:
    0.129  regions (the rows above, a folded row N times): compute
    0.728  regions (the rows above, a folded row N times): communication over experts
    0.186  nodes outside regions: compute
    2.241  gradient sync over the data ranks, exposed after overlapping the backward
    1.200  the loss's targets counted over the ranks splitting the batch
  = 4.484  predicted step
memory on every rank, MiB:
    0.11  parameters: 2.909e+04 elements on the rank, fp32 (4 B each)
    0.11  gradients (4 B each)
    0.22  optimizer state (AdamW's two moments, 8 B each)
    0.07  activations saved for backward (the batch of 1 row(s))
  = 0.52  predicted memory per rank

expert parallelism: expert groups of 2 consecutive data ranks (data indices [[0, 1], [2, 3]]); each MoE layer's experts spread over a group, tokens dispatched and combined by all-to-all (dropless), expert gradients reduced over the 2 rank(s) holding the same experts
  experts:model.layers.0.mlp: 4 experts, top-2, 2 per rank (place 0: experts 0..1, place 1: experts 2..3); rows per rank and step predicted 16 (uniform routing); all-to-all of 2.0 KiB per rank, 4 per step: 0.364 ms
  experts:model.layers.1.mlp: 4 experts, top-2, 2 per rank (place 0: experts 0..1, place 1: experts 2..3); rows per rank and step predicted 16 (uniform routing); all-to-all of 2.0 KiB per rank, 4 per step: 0.364 ms

meshes weighed:
 * data=4 x tensor=1, experts 2: step 4.484 ms, memory 0.52 MiB""")
        lines = code.splitlines()
        layer = [line.strip() for line in lines if "expert_parallel_mlp" in line or "topk" in line]
        self.assertExpectedInline("\n".join([lines[0]] + layer), """\
# rank 3 of 4 (data=3, tensor=0); built by passes: analysis -> tensor_parallel -> expert_parallel -> data_parallel
topk = torch.ops.aten.topk.default(softmax, 2);  softmax = None
getitem = topk[0]
getitem_1 = topk[1];  topk = None
expert_parallel_mlp = autopar_strategies_experts_rewrite_expert_parallel_mlp(view_3, getitem_1, div_, model_model_layers_0_mlp_experts_gate_up_proj_1, model_model_layers_0_mlp_experts_down_proj_1, experts = 4, group = 'experts', activation = 'silu', layouts = ('experts_out_in', 'experts_out_in'), tensor = None, layer = 'experts:model.layers.0.mlp');  view_3 = getitem_1 = div_ = model_model_layers_0_mlp_experts_gate_up_proj_1 = model_model_layers_0_mlp_experts_down_proj_1 = None
to_14 = torch.ops.aten.to.dtype(expert_parallel_mlp, torch.float32);  expert_parallel_mlp = None
topk_1 = torch.ops.aten.topk.default(softmax_1, 2);  softmax_1 = None
getitem_6 = topk_1[0]
getitem_7 = topk_1[1];  topk_1 = None
expert_parallel_mlp_1 = autopar_strategies_experts_rewrite_expert_parallel_mlp(view_8, getitem_7, div__1, model_model_layers_1_mlp_experts_gate_up_proj_1, model_model_layers_1_mlp_experts_down_proj_1, experts = 4, group = 'experts', activation = 'silu', layouts = ('experts_out_in', 'experts_out_in'), tensor = None, layer = 'experts:model.layers.1.mlp');  view_8 = getitem_7 = div__1 = model_model_layers_1_mlp_experts_gate_up_proj_1 = model_model_layers_1_mlp_experts_down_proj_1 = None
to_23 = torch.ops.aten.to.dtype(expert_parallel_mlp_1, torch.float32);  expert_parallel_mlp_1 = None""")

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

    def test_inception_dsp(self):
        # D&SP: 3 branches on 2 sub-grids (LPT puts the costliest alone), topology-aware order;
        # rank 0 is sub-grid 0, rank 1 sub-grid 1: they keep different branches
        table, code = _plan_and_graph(inception, 4, {"data": 4, "subgrids": 2})
        self.assertExpectedInline(table, """\
autopar plan: Inception on 4 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 8 (forced)
mesh: data=4 x tensor=1   (rank = data*1 + tensor; tensor ranks adjacent); D&SP: 2 sub-grids of 2 rank(s), topology-aware order
predicted step 3.214 ms: compute 0.035 ms, data comm 2.402 ms, segment comm 0.374 ms, subgrid comm 0.402 ms, tensor comm 0.000 ms; memory per rank 0.02 MiB
model: 1.923e+06 FLOP per step -> 1.496e+08 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 2 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region             kind       strategy   compute ms  comm tensor ms  comm data ms  comm segment ms  comm subgrid ms  memory MiB  alternatives ms
-----------------  ---------  ---------  ----------  --------------  ------------  ---------------  ---------------  ----------  ---------------
fork_join:b1       fork_join  dsp        0.018       0.000           0.000         0.374            0.402            0.00        data 0.033
(outside regions)  -          replicate  0.017       0.000           0.000         0.000            0.000            0.02        -

the step on every rank, ms per step:
    0.018  regions (the rows above, a folded row N times): compute
    0.374  regions (the rows above, a folded row N times): communication over segment
    0.402  regions (the rows above, a folded row N times): communication over subgrid
    0.017  nodes outside regions: compute
    1.202  gradient sync over the data ranks, exposed after overlapping the backward
    1.200  the loss's targets counted over the ranks splitting the batch
  = 3.214  predicted step
memory on every rank, MiB:
    0.00  parameters: 703 elements on the rank, fp32 (4 B each)
    0.00  gradients (4 B each)
    0.01  optimizer state (AdamW's two moments, 8 B each)
    0.01  activations saved for backward (the batch of 2 row(s))
  = 0.02  predicted memory per rank

branches on sub-grids:
  fork_join:b1: D&SP over 2 sub-grids (topology-aware order); branches s0:[1], s1:[0, 2]; messages per split/join 8 intra-node, 0 inter-node (2 per node)

meshes weighed:
 * data=4 x tensor=1, D&SP 2 sub-grids (topology-aware): step 3.214 ms, memory 0.02 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 4 (data=0, tensor=0; sub-grid 0, position 0, batch chunk 0); built by passes: analysis -> subgraph_parallel -> tensor_parallel -> data_parallel
def forward(self, input_0, target):
    model_stem = self.model.stem(input_0);  input_0 = None
    relu = torch.nn.functional.relu(model_stem, inplace = False);  model_stem = None
    segmented_all_gather = autopar_strategies_dsp_collectives_segmented_all_gather(relu, 'segment');  relu = None
    model_b2_0 = getattr(self.model.b2, "0")(segmented_all_gather);  segmented_all_gather = None
    model_b2_1 = getattr(self.model.b2, "1")(model_b2_0);  model_b2_0 = None
    model_b2_2 = getattr(self.model.b2, "2")(model_b2_1);  model_b2_1 = None
    segmented_all_to_all = autopar_strategies_dsp_collectives_segmented_all_to_all(model_b2_2, 1, [6, 6], 'segment');  model_b2_2 = None
    split = torch.functional.split(segmented_all_to_all, [6, 4, 2], 1);  segmented_all_to_all = None
    getitem = split[0]
    getitem_1 = split[1]
    getitem_2 = split[2];  split = None
    cat_1 = torch.cat([getitem_1, getitem, getitem_2], 1);  getitem_1 = getitem = getitem_2 = None
    mean = cat_1.mean((2, 3));  cat_1 = None
    model_head = self.model.head(mean);  mean = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  model_head = target = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")
        model, inputs, loss_fn, target = inception()
        plan = autopar.plan(model, 4, inputs, loss_fn, {"data": 4, "subgrids": 2}, example_target=target)
        other = rank_graph_code(autopar.rank_graph(model, plan, 1, inputs, loss_fn, target), plan, 1)
        self.assertExpectedInline(other, """\
# rank 1 of 4 (data=1, tensor=0; sub-grid 1, position 0, batch chunk 1); built by passes: analysis -> subgraph_parallel -> tensor_parallel -> data_parallel
def forward(self, input_0, target):
    model_stem = self.model.stem(input_0);  input_0 = None
    relu = torch.nn.functional.relu(model_stem, inplace = False);  model_stem = None
    segmented_all_gather = autopar_strategies_dsp_collectives_segmented_all_gather(relu, 'segment');  relu = None
    model_b1 = self.model.b1(segmented_all_gather)
    model_b3_0 = getattr(self.model.b3, "0")(segmented_all_gather);  segmented_all_gather = None
    model_b3_1 = getattr(self.model.b3, "1")(model_b3_0);  model_b3_0 = None
    model_b3_2 = getattr(self.model.b3, "2")(model_b3_1);  model_b3_1 = None
    cat_1 = torch.cat([model_b1, model_b3_2], 1);  model_b1 = model_b3_2 = None
    segmented_all_to_all = autopar_strategies_dsp_collectives_segmented_all_to_all(cat_1, 1, [6, 6], 'segment');  cat_1 = None
    split = torch.functional.split(segmented_all_to_all, [6, 4, 2], 1);  segmented_all_to_all = None
    getitem = split[0]
    getitem_1 = split[1]
    getitem_2 = split[2];  split = None
    cat_2 = torch.cat([getitem_1, getitem, getitem_2], 1);  getitem_1 = getitem = getitem_2 = None
    mean = cat_2.mean((2, 3));  cat_2 = None
    model_head = self.model.head(mean);  mean = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  model_head = target = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")

    def test_transformer_dsp_heads(self):
        # D&SP with attention heads as branches (SUPER Fig. 5): one layer, 4 heads on 2 sub-grids
        # of 2 ranks; q, k and v travel in one bundle, sliced by heads (all-to-all), the context
        # comes back by the conjugate all-to-all. Rank 0 keeps heads 0-1, rank 1 heads 2-3.
        rank0, rank1 = _rank_graphs(_one_layer_transformer, 4, {"data": 4, "subgrids": 2})
        self.assertExpectedInline(rank0, """\
# rank 0 of 4 (data=0, tensor=0; sub-grid 0, position 0, batch chunk 0); built by passes: analysis -> subgraph_parallel -> tensor_parallel -> data_parallel
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
    size_2 = transpose_1.size(-1);  transpose_1 = None
    sqrt = math_sqrt(size_2);  size_2 = None
    truediv = 1.0 / sqrt;  sqrt = None
    new_ones = model_blocks_0_ln1.new_ones(getitem_1, getitem_1, dtype = torch.bool);  model_blocks_0_ln1 = None
    tril = new_ones.tril();  new_ones = None
    invert = ~tril;  tril = None
    flatten_2 = transpose.flatten(2);  transpose = None
    flatten_3 = transpose_3.flatten(2);  transpose_3 = None
    flatten_4 = transpose_2.flatten(2);  transpose_2 = None
    cat = torch.cat([flatten_2, flatten_3, flatten_4], 2);  flatten_2 = flatten_3 = flatten_4 = None
    segmented_all_to_all_slice = autopar_strategies_dsp_collectives_segmented_all_to_all_slice(cat, 1, [2, 2], 'segment');  cat = None
    split_1 = segmented_all_to_all_slice.split([128, 128, 128], 2);  segmented_all_to_all_slice = None
    getitem_6 = split_1[0]
    unflatten = getitem_6.unflatten(2, (16, 8));  getitem_6 = None
    getitem_7 = split_1[1]
    unflatten_1 = getitem_7.unflatten(2, (8, 16));  getitem_7 = None
    getitem_8 = split_1[2];  split_1 = None
    unflatten_2 = getitem_8.unflatten(2, (16, 8));  getitem_8 = None
    matmul = unflatten @ unflatten_1;  unflatten = unflatten_1 = None
    mul = matmul * truediv;  matmul = truediv = None
    masked_fill = mul.masked_fill(invert, -inf);  mul = invert = None
    softmax = torch.nn.functional.softmax(masked_fill, dim = -1, _stacklevel = 3, dtype = None);  masked_fill = None
    matmul_1 = softmax @ unflatten_2;  softmax = unflatten_2 = None
    segmented_all_to_all = autopar_strategies_dsp_collectives_segmented_all_to_all(matmul_1, 1, [2, 2], 'segment');  matmul_1 = None
    transpose_4 = segmented_all_to_all.transpose(1, 2);  segmented_all_to_all = None
    contiguous = transpose_4.contiguous();  transpose_4 = None
    view_3 = contiguous.view(getitem, getitem_1, getitem_2);  contiguous = getitem = getitem_1 = getitem_2 = None
    model_blocks_0_attn_proj = getattr(self.model.blocks, "0").attn.proj(view_3);  view_3 = None
    add_1 = add + model_blocks_0_attn_proj;  add = model_blocks_0_attn_proj = None
    model_blocks_0_ln2 = getattr(self.model.blocks, "0").ln2(add_1)
    model_blocks_0_fc = getattr(self.model.blocks, "0").fc(model_blocks_0_ln2);  model_blocks_0_ln2 = None
    gelu = torch._C._nn.gelu(model_blocks_0_fc);  model_blocks_0_fc = None
    model_blocks_0_proj = getattr(self.model.blocks, "0").proj(gelu);  gelu = None
    add_2 = add_1 + model_blocks_0_proj;  add_1 = model_blocks_0_proj = None
    model_ln_f = self.model.ln_f(add_2);  add_2 = None
    model_lm_head = self.model.lm_head(model_ln_f);  model_ln_f = None
    flatten = model_lm_head.flatten(0, 1);  model_lm_head = None
    flatten_1 = target.flatten();  target = None
    cross_entropy = torch.nn.functional.cross_entropy(flatten, flatten_1, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  flatten = flatten_1 = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")
        # rank 1 runs the same program: the collectives, not the graph, give it heads 2-3
        head1, _, body1 = rank1.partition("\n")
        self.assertEqual(body1, rank0.partition("\n")[2])
        self.assertExpectedInline(head1, """# rank 1 of 4 (data=1, tensor=0; sub-grid 1, position 0, batch chunk 1); built by passes: analysis -> subgraph_parallel -> tensor_parallel -> data_parallel""")

    def test_transformer_csub_heads(self):
        # D&SP-cSub: sub-grid 0 (rank 0) runs the common layers on its half of the batch and
        # scatters the heads; sub-grid 1 (rank 1) runs only heads 2-3, receiving the mask and
        # the scale by a forward-only share, and gathers the context back to rank 0
        rank0, rank1 = _rank_graphs(_one_layer_transformer, 4, {"data": 4, "subgrids": 2, "csub": True})
        self.assertExpectedInline(rank0, """\
# rank 0 of 4 (data=0, tensor=0; sub-grid 0, position 0, batch chunk 0); built by passes: analysis -> subgraph_parallel -> tensor_parallel -> data_parallel
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
    size_2 = transpose_1.size(-1);  transpose_1 = None
    sqrt = math_sqrt(size_2);  size_2 = None
    truediv = 1.0 / sqrt;  sqrt = None
    new_ones = model_blocks_0_ln1.new_ones(getitem_1, getitem_1, dtype = torch.bool);  model_blocks_0_ln1 = None
    tril = new_ones.tril();  new_ones = None
    invert = ~tril;  tril = None
    segment_share = autopar_strategies_dsp_collectives_segment_share(truediv, 'segment');  truediv = None
    segment_share_1 = autopar_strategies_dsp_collectives_segment_share(invert, 'segment');  invert = None
    flatten_2 = transpose.flatten(2);  transpose = None
    flatten_3 = transpose_3.flatten(2);  transpose_3 = None
    flatten_4 = transpose_2.flatten(2);  transpose_2 = None
    cat = torch.cat([flatten_2, flatten_3, flatten_4], 2);  flatten_2 = flatten_3 = flatten_4 = None
    segmented_scatter = autopar_strategies_dsp_collectives_segmented_scatter(cat, 1, [2, 2], 'segment');  cat = None
    split_1 = segmented_scatter.split([128, 128, 128], 2);  segmented_scatter = None
    getitem_6 = split_1[0]
    unflatten = getitem_6.unflatten(2, (16, 8));  getitem_6 = None
    getitem_7 = split_1[1]
    unflatten_1 = getitem_7.unflatten(2, (8, 16));  getitem_7 = None
    getitem_8 = split_1[2];  split_1 = None
    unflatten_2 = getitem_8.unflatten(2, (16, 8));  getitem_8 = None
    matmul = unflatten @ unflatten_1;  unflatten = unflatten_1 = None
    mul = matmul * segment_share;  matmul = segment_share = None
    masked_fill = mul.masked_fill(segment_share_1, -inf);  mul = segment_share_1 = None
    softmax = torch.nn.functional.softmax(masked_fill, dim = -1, _stacklevel = 3, dtype = None);  masked_fill = None
    matmul_1 = softmax @ unflatten_2;  softmax = unflatten_2 = None
    segmented_gather = autopar_strategies_dsp_collectives_segmented_gather(matmul_1, 1, [2, 2], 'segment');  matmul_1 = None
    transpose_4 = segmented_gather.transpose(1, 2);  segmented_gather = None
    contiguous = transpose_4.contiguous();  transpose_4 = None
    view_3 = contiguous.view(getitem, getitem_1, getitem_2);  contiguous = getitem = getitem_1 = getitem_2 = None
    model_blocks_0_attn_proj = getattr(self.model.blocks, "0").attn.proj(view_3);  view_3 = None
    add_1 = add + model_blocks_0_attn_proj;  add = model_blocks_0_attn_proj = None
    model_blocks_0_ln2 = getattr(self.model.blocks, "0").ln2(add_1)
    model_blocks_0_fc = getattr(self.model.blocks, "0").fc(model_blocks_0_ln2);  model_blocks_0_ln2 = None
    gelu = torch._C._nn.gelu(model_blocks_0_fc);  model_blocks_0_fc = None
    model_blocks_0_proj = getattr(self.model.blocks, "0").proj(gelu);  gelu = None
    add_2 = add_1 + model_blocks_0_proj;  add_1 = model_blocks_0_proj = None
    model_ln_f = self.model.ln_f(add_2);  add_2 = None
    model_lm_head = self.model.lm_head(model_ln_f);  model_ln_f = None
    flatten = model_lm_head.flatten(0, 1);  model_lm_head = None
    flatten_1 = target.flatten();  target = None
    cross_entropy = torch.nn.functional.cross_entropy(flatten, flatten_1, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  flatten = flatten_1 = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")
        self.assertExpectedInline(rank1, """\
# rank 1 of 4 (data=1, tensor=0; sub-grid 1, position 0, batch chunk 0); built by passes: analysis -> csub_branches
def forward(self):
    segment_share = autopar_strategies_dsp_collectives_segment_share(None, 'segment', ('scalar',))
    segment_share_1 = autopar_strategies_dsp_collectives_segment_share(None, 'segment', ('tensor', [16, 16], torch.bool))
    csub_placeholder = autopar_strategies_dsp_collectives_csub_placeholder([2, 4, 384], torch.float32, None)
    segmented_scatter = autopar_strategies_dsp_collectives_segmented_scatter(csub_placeholder, 1, [2, 2], 'segment');  csub_placeholder = None
    split = segmented_scatter.split([128, 128, 128], 2);  segmented_scatter = None
    getitem = split[0]
    unflatten = getitem.unflatten(2, (16, 8));  getitem = None
    getitem_1 = split[1]
    unflatten_1 = getitem_1.unflatten(2, (8, 16));  getitem_1 = None
    getitem_2 = split[2];  split = None
    unflatten_2 = getitem_2.unflatten(2, (16, 8));  getitem_2 = None
    matmul = unflatten @ unflatten_1;  unflatten = unflatten_1 = None
    mul = matmul * segment_share;  matmul = segment_share = None
    masked_fill = mul.masked_fill(segment_share_1, -inf);  mul = segment_share_1 = None
    softmax = torch.nn.functional.softmax(masked_fill, dim = -1, _stacklevel = 3, dtype = None);  masked_fill = None
    matmul_1 = softmax @ unflatten_2;  softmax = unflatten_2 = None
    segmented_gather = autopar_strategies_dsp_collectives_segmented_gather(matmul_1, 1, [2, 2], 'segment');  matmul_1 = None
    return segmented_gather
    
""")

    def test_mlp_cube(self):
        """Bian's cube on 2x2x2: rank 0's two consecutive layers of each chain with every
        collective: the input cut over y (columns) and x (rows), each bias assembled
        from its diagonal piece (cube_vector: broadcast over the in axis, all-gather over
        z), linear_cube gathering rows and reduce-scattering them inside; the second
        chain reads the first's output as its A_ijl, with no re-layout between them."""
        table, code = _plan_and_graph(mlp, 8, {"cube": 2})
        self.assertExpectedInline(table, """\
autopar plan: MLP on 8 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 8 (forced)
mesh: data=1 x z=2 x y=2 x x=2   (Bian cube Gx=2 Gy=2 Gz=2 Gdata=1; rank = ((data*Gz + z)*Gy + y)*Gx + x)
predicted step 9.060 ms: compute 0.029 ms, data comm 0.583 ms, x comm 1.622 ms, y comm 3.607 ms, z comm 3.219 ms; memory per rank 0.03 MiB
model: 4.086e+05 FLOP per step -> 5.637e+06 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 4 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region               kind          strategy   compute ms  comm x ms  comm y ms  comm z ms  comm data ms  memory MiB  alternatives ms
-------------------  ------------  ---------  ----------  ---------  ---------  ---------  ------------  ----------  ---------------
linear_chain:body    linear_chain  cube3d     0.011       0.811      1.803      1.610      0.000         0.01        replicate 0.012
linear_chain:body#1  linear_chain  cube3d     0.011       0.811      1.803      1.610      0.000         0.01        replicate 0.012
(outside regions)    -             replicate  0.007       0.000      0.000      0.000      0.000         0.00        -

the step on every rank, ms per step:
    0.023  regions (the rows above, a folded row N times): compute
    1.622  regions (the rows above, a folded row N times): communication over x
    3.607  regions (the rows above, a folded row N times): communication over y
    3.219  regions (the rows above, a folded row N times): communication over z
    0.007  nodes outside regions: compute
    0.403  gradient sync over the data ranks, exposed after overlapping the backward
    0.180  the loss's targets counted over the ranks splitting the batch
  = 9.060  predicted step
memory on every rank, MiB:
    0.01  parameters: 1336 elements on the rank, fp32 (4 B each)
    0.01  gradients (4 B each)
    0.01  optimizer state (AdamW's two moments, 8 B each)
    0.00  activations saved for backward (the batch of 4 row(s))
    0.01  3D layers' all-gathered weights kept for backward
  = 0.03  predicted memory per rank

cube layers (Bian et al.; orientation by data flow; Algorithms 1/3: all-gather A's rows over the out axis and W over z, reduce-scatter the output's rows over the in axis; backward (2/4): all-gather dC over the in axis, reduce-scatter dA over the out axis and dW over z; biases on the diagonal ranks, Algorithms 7-8):
  linear_chain:body: model_body_0 plain (in y, out x); model_body_2 transposed (in x, out y)
    boundary: input cut to y column blocks and x row blocks (backward all-gathers over y and x), output read as A_ijl by the next region (no re-layout)
  linear_chain:body#1: model_body_3 plain (in y, out x); model_body_5 transposed (in x, out y)
    boundary: input read as A_ijl from the previous region (no re-layout), output all-gathered over y, then x

meshes weighed:
 * 3D cube (Bian) p=2 data=1: step 9.060 ms, memory 0.03 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 8 (data=0, z=0, y=0, x=0); built by passes: analysis -> cube3d -> data_parallel
def forward(self, input_0, target):
    scatter_to_tensor_region = autopar_runtime_collectives_scatter_to_tensor_region(input_0, 1, 'y');  input_0 = None
    scatter_to_tensor_region_1 = autopar_runtime_collectives_scatter_to_tensor_region(scatter_to_tensor_region, 0, 'x');  scatter_to_tensor_region = None
    model_body_0_weight = getattr(self.model.body, "0").weight
    model_body_0_bias = getattr(self.model.body, "0").bias
    cube_vector = autopar_strategies_cube_collectives_cube_vector(model_body_0_bias, 32, 'y', 'x');  model_body_0_bias = None
    model_body_2_weight_1 = getattr(self.model.body, "2").weight
    linear_cube = autopar_strategies_cube_collectives_linear_cube(scatter_to_tensor_region_1, model_body_0_weight, cube_vector, (32, 16), 'y', 'x', False, prefetch = model_body_2_weight_1, checkpointed = False);  scatter_to_tensor_region_1 = model_body_0_weight = cube_vector = model_body_2_weight_1 = None
    model_body_1 = getattr(self.model.body, "1")(linear_cube);  linear_cube = None
    model_body_2_weight = getattr(self.model.body, "2").weight
    model_body_2_bias = getattr(self.model.body, "2").bias
    cube_vector_1 = autopar_strategies_cube_collectives_cube_vector(model_body_2_bias, 16, 'x', 'y');  model_body_2_bias = None
    model_body_3_weight_1 = getattr(self.model.body, "3").weight
    linear_cube_1 = autopar_strategies_cube_collectives_linear_cube(model_body_1, model_body_2_weight, cube_vector_1, (16, 32), 'x', 'y', False, prefetch = model_body_3_weight_1, checkpointed = False);  model_body_1 = model_body_2_weight = cube_vector_1 = model_body_3_weight_1 = None
    model_body_3_weight = getattr(self.model.body, "3").weight
    model_body_3_bias = getattr(self.model.body, "3").bias
    cube_vector_2 = autopar_strategies_cube_collectives_cube_vector(model_body_3_bias, 32, 'y', 'x');  model_body_3_bias = None
    model_body_5_weight_1 = getattr(self.model.body, "5").weight
    linear_cube_2 = autopar_strategies_cube_collectives_linear_cube(linear_cube_1, model_body_3_weight, cube_vector_2, (32, 16), 'y', 'x', False, prefetch = model_body_5_weight_1, checkpointed = False);  linear_cube_1 = model_body_3_weight = cube_vector_2 = model_body_5_weight_1 = None
    model_body_4 = getattr(self.model.body, "4")(linear_cube_2);  linear_cube_2 = None
    model_body_5_weight = getattr(self.model.body, "5").weight
    model_body_5_bias = getattr(self.model.body, "5").bias
    cube_vector_3 = autopar_strategies_cube_collectives_cube_vector(model_body_5_bias, 16, 'x', 'y');  model_body_5_bias = None
    linear_cube_3 = autopar_strategies_cube_collectives_linear_cube(model_body_4, model_body_5_weight, cube_vector_3, (16, 32), 'x', 'y', False, prefetch = None, checkpointed = False);  model_body_4 = model_body_5_weight = cube_vector_3 = None
    gather_from_tensor_region_2 = autopar_runtime_collectives_gather_from_tensor_region(linear_cube_3, 1, 'y');  linear_cube_3 = None
    gather_from_tensor_region_3 = autopar_runtime_collectives_gather_from_tensor_region(gather_from_tensor_region_2, 0, 'x');  gather_from_tensor_region_2 = None
    model_head = self.model.head(gather_from_tensor_region_3);  gather_from_tensor_region_3 = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  model_head = target = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")

    def test_mlp_3d_grid(self):
        """AxoNN 3D on a 2x2x2 grid: rank 0's two consecutive layers of each chain, the
        first plain (in y, out x), the second transposed (in x, out y), with every
        collective: the input cut over y, the weight all-gathers over z (the next
        layer's issued ahead), the all-reduces inside linear_3d, the output gathered over y."""
        table, code = _plan_and_graph(mlp, 8, {"x": 2, "y": 2, "z": 2})
        self.assertExpectedInline(table, """\
autopar plan: MLP on 8 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 8 (forced)
mesh: data=1 x z=2 x y=2 x x=2   (3D grid Gx=2 Gy=2 Gz=2 Gdata=1; rank = ((data*Gz + z)*Gy + y)*Gx + x)
predicted step 5.358 ms: compute 0.030 ms, data comm 0.583 ms, x comm 0.721 ms, y comm 2.406 ms, z comm 1.618 ms; memory per rank 0.03 MiB
model: 4.086e+05 FLOP per step -> 9.532e+06 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step, on every rank; a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 4 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region               kind          strategy   compute ms  comm x ms  comm y ms  comm z ms  comm data ms  memory MiB  alternatives ms
-------------------  ------------  ---------  ----------  ---------  ---------  ---------  ------------  ----------  ---------------
linear_chain:body    linear_chain  tensor3d   0.012       0.361      1.203      0.809      0.000         0.01        replicate 0.012
linear_chain:body#1  linear_chain  tensor3d   0.012       0.361      1.203      0.809      0.000         0.01        replicate 0.012
(outside regions)    -             replicate  0.007       0.000      0.000      0.000      0.000         0.00        -

the step on every rank, ms per step:
    0.023  regions (the rows above, a folded row N times): compute
    0.721  regions (the rows above, a folded row N times): communication over x
    2.406  regions (the rows above, a folded row N times): communication over y
    1.618  regions (the rows above, a folded row N times): communication over z
    0.007  nodes outside regions: compute
    0.403  gradient sync over the data ranks, exposed after overlapping the backward
    0.180  the loss's targets counted over the ranks splitting the batch
  = 5.358  predicted step
memory on every rank, MiB:
    0.01  parameters: 1384 elements on the rank, fp32 (4 B each)
    0.01  gradients (4 B each)
    0.01  optimizer state (AdamW's two moments, 8 B each)
    0.00  activations saved for backward (the batch of 4 row(s))
    0.01  3D layers' all-gathered weights kept for backward
  = 0.03  predicted memory per rank

3D layers (orientation by data flow; Algorithm 1: all-gather W over z, all-reduce the output over the in axis; backward: all-reduce dI over the out axis, reduce-scatter dW over z):
  linear_chain:body: model_body_0 plain (in y, out x); model_body_2 transposed (in x, out y)
    boundary: input cut to y blocks (backward all-gather over y), output read split over y by the next region (no re-layout)
  linear_chain:body#1: model_body_3 plain (in y, out x); model_body_5 transposed (in x, out y)
    boundary: input read split over y from the previous region (no re-layout), output all-gathered over y

meshes weighed:
 * 3D x=2 y=2 z=2 data=1: step 5.358 ms, memory 0.03 MiB""")
        self.assertExpectedInline(code, """\
# rank 0 of 8 (data=0, z=0, y=0, x=0); built by passes: analysis -> tensor3d -> data_parallel
def forward(self, input_0, target):
    scatter_to_tensor_region = autopar_runtime_collectives_scatter_to_tensor_region(input_0, 1, 'y');  input_0 = None
    model_body_0_weight = getattr(self.model.body, "0").weight
    model_body_0_bias = getattr(self.model.body, "0").bias
    model_body_2_weight_1 = getattr(self.model.body, "2").weight
    linear_3d = autopar_strategies_tensor3d_runtime_linear_3d(scatter_to_tensor_region, model_body_0_weight, model_body_0_bias, (32, 16), 'y', 'x', False, prefetch = model_body_2_weight_1, checkpointed = False);  scatter_to_tensor_region = model_body_0_weight = model_body_0_bias = model_body_2_weight_1 = None
    model_body_1 = getattr(self.model.body, "1")(linear_3d);  linear_3d = None
    model_body_2_weight = getattr(self.model.body, "2").weight
    model_body_2_bias = getattr(self.model.body, "2").bias
    model_body_3_weight_1 = getattr(self.model.body, "3").weight
    linear_3d_1 = autopar_strategies_tensor3d_runtime_linear_3d(model_body_1, model_body_2_weight, model_body_2_bias, (16, 32), 'x', 'y', False, prefetch = model_body_3_weight_1, checkpointed = False);  model_body_1 = model_body_2_weight = model_body_2_bias = model_body_3_weight_1 = None
    model_body_3_weight = getattr(self.model.body, "3").weight
    model_body_3_bias = getattr(self.model.body, "3").bias
    model_body_5_weight_1 = getattr(self.model.body, "5").weight
    linear_3d_2 = autopar_strategies_tensor3d_runtime_linear_3d(linear_3d_1, model_body_3_weight, model_body_3_bias, (32, 16), 'y', 'x', False, prefetch = model_body_5_weight_1, checkpointed = False);  linear_3d_1 = model_body_3_weight = model_body_3_bias = model_body_5_weight_1 = None
    model_body_4 = getattr(self.model.body, "4")(linear_3d_2);  linear_3d_2 = None
    model_body_5_weight = getattr(self.model.body, "5").weight
    model_body_5_bias = getattr(self.model.body, "5").bias
    linear_3d_3 = autopar_strategies_tensor3d_runtime_linear_3d(model_body_4, model_body_5_weight, model_body_5_bias, (16, 32), 'x', 'y', False, prefetch = None, checkpointed = False);  model_body_4 = model_body_5_weight = model_body_5_bias = None
    gather_from_tensor_region_1 = autopar_runtime_collectives_gather_from_tensor_region(linear_3d_3, 1, 'y');  linear_3d_3 = None
    model_head = self.model.head(gather_from_tensor_region_1);  gather_from_tensor_region_1 = None
    cross_entropy = torch.nn.functional.cross_entropy(model_head, target, weight = None, size_average = None, ignore_index = -100, reduce = None, reduction = 'sum', label_smoothing = 0.0);  model_head = target = None
    global_mean = autopar_runtime_target_count_global_mean(cross_entropy);  cross_entropy = None
    return global_mean
    
""")

    def test_transformer_pipeline(self):
        """PTD-P: pipeline 2 x tensor 2 with 4 microbatches (1F1B): the stage partition, the
        timeline, and rank 0's stage program (embedding and block 0, Megatron inside)."""
        from autopar.passes.rank_program import rewrite
        from autopar.strategies.pipeline.program import pipeline_rank_code
        model, inputs, loss_fn, target = transformer()
        plan = autopar.plan(model, 4, inputs, loss_fn, {"pipeline": 2, "tensor": 2, "microbatches": 4, "schedule": "1f1b"},
                            example_target=target)
        self.assertExpectedInline(plan.explain(), """\
autopar plan: TinyTransformer on 4 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this machine), global batch 4 (forced)
mesh: pipeline=2 x data=1 x tensor=2   (rank = (pipeline*1 + data)*2 + tensor; tensor ranks adjacent, pipeline outermost)
predicted step 6.356 ms: compute 0.271 ms, data comm 0.000 ms, pipeline comm 2.444 ms, tensor comm 3.641 ms; memory per rank 0.17 MiB
model: 1.121e+07 FLOP per step -> 4.409e+08 FLOP/s per device predicted

regions: compute, communication and the alternatives weighed in ms per step (4 microbatches), on each rank of the stage that runs the region (stage: its pipeline stage and rank; the nodes outside regions: every stage's together); a folded row "first .. last (xN, each)" gives one of its N identical blocks
memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two moments; before ZeRO) and the activations one microbatch of 1 row(s) saves in it for backward (before recomputation); the rank's memory by part closes the table
region                   kind          strategy   stage                   compute ms  comm tensor ms  comm data ms  memory MiB  alternatives ms
-----------------------  ------------  ---------  ----------------------  ----------  --------------  ------------  ----------  ---------------
vocab:tok                vocab         megatron   0 (rank 0), 1 (rank 1)  0.029       1.456           0.000         0.02        replicate 0.032
attention:blocks.0.attn  attention     megatron   0 (rank 0)              0.116       1.456           0.000         0.04        replicate 0.129
attention:blocks.1.attn  attention     megatron   1 (rank 1)              0.116       1.456           0.000         0.04        replicate 0.129
linear_chain:blocks.0    linear_chain  megatron   0 (rank 0)              0.057       1.456           0.000         0.07        replicate 0.069
linear_chain:blocks.1    linear_chain  megatron   1 (rank 1)              0.057       1.456           0.000         0.07        replicate 0.069
(outside regions)        -             replicate  all                     0.161       0.000           0.000         0.04        -

the step on pipeline rank 1 (stage 1; the slowest pipeline rank, whose time per microbatch sets the step), ms per step:
    0.173  regions on its stages (1 attention, 1 linear_chain of the rows above): compute
    2.913  regions on its stages (1 attention, 1 linear_chain of the rows above): communication over tensor
    0.098  the rest of its stages: nodes outside regions, its part of vocab:tok, the executor's per-pass actions: compute
    0.728  the rest of its stages: communication inside them (vocab:tok's part)
    1.173  point-to-point sends to and from the neighbouring stages
    1.271  pipeline bubble ((p-1)/(v*m))
  = 6.356  predicted step
memory on pipeline rank 0 (the most of any pipeline rank), MiB:
    0.03  parameters: 7952 elements on the rank, fp32 (4 B each)
    0.03  gradients (4 B each)
    0.06  optimizer state (AdamW's two moments, 8 B each)
    0.05  activations saved for backward (2 microbatch(es) in flight; the rank's memory less its state)
  = 0.17  predicted memory per rank

pipeline (megatron sec. 2.2): 2 stages on 2 pipeline ranks; schedule 1f1b, 4 microbatch(es) of 1 row(s); predicted bubble (p-1)/(v*m) = 0.250 (1.271 ms); scatter/gather on
  stage 0 (rank 0): block:blocks.0 + embedding; 0.977 ms per microbatch; sends 2.0 KiB per microbatch
  stage 1 (rank 1): block:blocks.1 + head and loss; 0.978 ms per microbatch
  per rank: rank 0 1.270 ms/microbatch, 2 in flight, 0.17 MiB (0.15 MiB recomputing); rank 1 1.271 ms/microbatch, 1 in flight, 0.13 MiB (0.13 MiB recomputing)
  schedules at m=4 (step, bubble, memory per rank): zb-h1 6.315 ms, 1.230 ms, 0.17 MiB; gpipe 6.356 ms, 1.271 ms, 0.22 MiB; 1f1b 6.356 ms, 1.271 ms, 0.17 MiB (chosen)
timeline (unit: one chunk's forward; backward = 2 units):
  rank 0 | F1  F2  .   .   B1  B1  F3  B2  B2  F4  B3  B3  .   B4  B4 |
  rank 1 | .   F1  B1  B1  F2  B2  B2  F3  B3  B3  F4  B4  B4  .   .  |
  1f1b: p=2 m=4; step 15 units, compute 12 per rank, bubble 0.250 of the ideal time

meshes weighed:
 * pipeline=2 x data=1 x tensor=2, pipeline 1f1b, m=4: step 6.356 ms, memory 0.17 MiB""")
        self.assertExpectedInline(pipeline_rank_code(model, plan, 0, inputs, loss_fn, target, rewrite=rewrite), """\
# stage 0 on rank 0 of 4 (pipeline=0, data=0, tensor=0); built by passes: pipeline_stages -> analysis -> stage_blocks -> tensor_parallel
torch.fx._symbolic_trace.wrap("math_sqrt")

def forward(self, input_0):
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
    floordiv_3 = getitem_2 // 2;  getitem_2 = None
    view_3 = contiguous.view(getitem, getitem_1, floordiv_3);  contiguous = getitem = getitem_1 = floordiv_3 = None
    model_blocks_0_attn_proj_weight = getattr(self.model.blocks, "0").attn.proj.weight
    linear = torch._C._nn.linear(view_3, model_blocks_0_attn_proj_weight);  view_3 = model_blocks_0_attn_proj_weight = None
    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(linear, 'tensor');  linear = None
    model_blocks_0_attn_proj_bias = getattr(self.model.blocks, "0").attn.proj.bias
    add_3 = reduce_from_tensor_region + model_blocks_0_attn_proj_bias;  reduce_from_tensor_region = model_blocks_0_attn_proj_bias = None
    add_1 = add + add_3;  add = add_3 = None
    model_blocks_0_ln2 = getattr(self.model.blocks, "0").ln2(add_1)
    copy_to_tensor_region_1 = autopar_runtime_collectives_copy_to_tensor_region(model_blocks_0_ln2, 'tensor');  model_blocks_0_ln2 = None
    model_blocks_0_fc = getattr(self.model.blocks, "0").fc(copy_to_tensor_region_1);  copy_to_tensor_region_1 = None
    gelu = torch._C._nn.gelu(model_blocks_0_fc);  model_blocks_0_fc = None
    model_blocks_0_proj_weight = getattr(self.model.blocks, "0").proj.weight
    linear_1 = torch._C._nn.linear(gelu, model_blocks_0_proj_weight);  gelu = model_blocks_0_proj_weight = None
    reduce_from_tensor_region_1 = autopar_runtime_collectives_reduce_from_tensor_region(linear_1, 'tensor');  linear_1 = None
    model_blocks_0_proj_bias = getattr(self.model.blocks, "0").proj.bias
    add_4 = reduce_from_tensor_region_1 + model_blocks_0_proj_bias;  reduce_from_tensor_region_1 = model_blocks_0_proj_bias = None
    add_2 = add_1 + add_4;  add_1 = add_4 = None
    return add_2
    
""")


    def test_fused_bias_gelu_source(self):
        """The generated Triton source of bias+GeLU (megatron §5.8): the linear's bias split
        off into the kernel, the backward by reverse-mode differentiation."""
        self.assertExpectedInline(_fused_source(_BiasGelu(), torch.randn(2, 3, 8)), """\
# generated by autopar.passes.fusion.codegen: do not edit
# bias_gelu: add -> gelu
#   in0: full float32
#   in1: trailing float32
#   out0 = v1: float32
#   iteration space: numel elements, BLOCK per program
import triton
import triton.language as tl

from autopar.passes.fusion import triton_helpers as th

@triton.jit
def bias_gelu_850dba3ba5_fwd(in0_ptr, in1_ptr, out0_ptr, numel, in1_numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < numel
    in0 = tl.load(in0_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    in1 = tl.load(in1_ptr + offs % in1_numel, mask=valid, other=0.0).to(tl.float32)
    v0 = in0 + in1  # add
    v1 = th.gelu(v0)  # gelu
    tl.store(out0_ptr + offs, v1.to(out0_ptr.dtype.element_ty), mask=valid)


@triton.jit
def bias_gelu_850dba3ba5_bwd(in0_ptr, in1_ptr, gout0_ptr, gin0_ptr, gin1_ptr, numel, in1_numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < numel
    in0 = tl.load(in0_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    in1 = tl.load(in1_ptr + offs % in1_numel, mask=valid, other=0.0).to(tl.float32)
    v0 = in0 + in1  # add
    v1 = th.gelu(v0)  # gelu
    gout0 = tl.load(gout0_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    g_v1 = gout0
    g_v0 = g_v1 * th.gelu_grad(v0)
    g_in0 = g_v0
    g_in1 = g_v0
    tl.store(gin0_ptr + offs, (g_in0).to(gin0_ptr.dtype.element_ty), mask=valid)
    tl.store(gin1_ptr + offs, (g_in1).to(gin1_ptr.dtype.element_ty), mask=valid)
""")

    def test_fused_scale_mask_softmax_source(self):
        """The generated Triton source of scale+mask+softmax: one row per tile row, the
        causal mask read broadcast, softmax's max treated as a constant in backward."""
        self.assertExpectedInline(_fused_source(_ScaleMaskSoftmax(), torch.randn(2, 2, 4, 4)), """\
# generated by autopar.passes.fusion.codegen: do not edit
# scale_mask_softmax: mul -> masked_fill -> softmax
#   in0: full float32
#   in1: trailing bool
#   out0 = v6: float32
#   iteration space: rows of n_cols, ROWS rows per program
import triton
import triton.language as tl

from autopar.passes.fusion import triton_helpers as th

@triton.jit
def scale_mask_softmax_f15fc91f8e_fwd(in0_ptr, in1_ptr, out0_ptr, n_rows, n_cols, in1_numel, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    valid = (rows < n_rows) & (cols < n_cols)
    offs = rows * n_cols + cols
    in0 = tl.load(in0_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    in1 = tl.load(in1_ptr + offs % in1_numel, mask=valid, other=0) != 0
    v0 = in0 * 0.5  # mul
    v1 = tl.where(in1, float("-inf"), v0)  # masked_fill
    v2 = tl.max(tl.where(valid, v1, float("-inf")), axis=1)[:, None]  # softmax
    v3 = v1 - v2  # softmax
    v4 = tl.exp(v3)  # softmax
    v5 = tl.sum(tl.where(valid, v4, 0.0), axis=1)[:, None]  # softmax
    v6 = v4 / v5  # softmax
    tl.store(out0_ptr + offs, v6.to(out0_ptr.dtype.element_ty), mask=valid)


@triton.jit
def scale_mask_softmax_f15fc91f8e_bwd(in0_ptr, in1_ptr, gout0_ptr, gin0_ptr, n_rows, n_cols, in1_numel, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    valid = (rows < n_rows) & (cols < n_cols)
    offs = rows * n_cols + cols
    in0 = tl.load(in0_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    in1 = tl.load(in1_ptr + offs % in1_numel, mask=valid, other=0) != 0
    v0 = in0 * 0.5  # mul
    v1 = tl.where(in1, float("-inf"), v0)  # masked_fill
    v2 = tl.max(tl.where(valid, v1, float("-inf")), axis=1)[:, None]  # softmax
    v3 = v1 - v2  # softmax
    v4 = tl.exp(v3)  # softmax
    v5 = tl.sum(tl.where(valid, v4, 0.0), axis=1)[:, None]  # softmax
    v6 = v4 / v5  # softmax
    gout0 = tl.load(gout0_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    g_v6 = gout0
    g_v4 = g_v6 / v5
    g_v5 = tl.sum(tl.where(valid, -g_v6 * v4 / (v5 * v5), 0.0), axis=1)[:, None]
    g_v4 = g_v4 + g_v5
    g_v3 = g_v4 * v4
    g_v1 = g_v3
    g_v0 = tl.where(in1, 0.0, g_v1)
    g_in0 = g_v0 * 0.5
    tl.store(gin0_ptr + offs, (tl.broadcast_to(g_in0, (ROWS, BLOCK))).to(gin0_ptr.dtype.element_ty), mask=valid)
""")

    def test_mixed_stem_trunk(self):
        """A mixed plan (docs/mixed_plans.md): D&SP on the stem, Megatron attention, 3D MLPs
        over one tensor group of 4; rank 1 runs branch b2 only."""
        table, code = _plan_and_graph(stem_trunk, 4, {"data": 1, "tensor": 4, "regions": {
            "kind:fork_join": "dsp", "kind:attention": "megatron", "kind:linear_chain": {"3d": {"x": 2, "y": 2}}}},
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
 * data=1 x tensor=4, mixed 3d 2x2: step 10.504 ms, memory 0.45 MiB""")
        self.assertExpectedInline(code, """\
# rank 1 of 4 (data=0, tensor=1); built by passes: analysis -> subgraph_parallel -> tensor_parallel -> tensor3d -> data_parallel
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


class _BiasGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


class _ScaleMaskSoftmax(torch.nn.Module):
    def forward(self, scores):
        causal = torch.ones(4, 4, dtype=torch.bool).tril()
        return torch.softmax((scores * 0.5).masked_fill(~causal, float("-inf")), dim=-1)


def _fused_source(model, x) -> str:
    from autopar.trace.capture import capture
    from autopar.passes.fusion.rewrite import FUSION, fusion_pass
    gm = fusion_pass(capture(model, (x,)))
    kernel, = gm.meta[FUSION].kernels
    return kernel.source


def _one_layer_transformer():
    from examples.models import TinyTransformer, lm_loss
    model, inputs, loss_fn, target = transformer()
    torch.manual_seed(0)
    return TinyTransformer(layers=1), inputs, lm_loss, target


def _rank_graphs(factory, world, strategy, ranks=(0, 1)):
    model, inputs, loss_fn, target = factory()
    plan = autopar.plan(model, world, inputs, loss_fn, strategy, example_target=target)
    return [rank_graph_code(autopar.rank_graph(model, plan, r, inputs, loss_fn, target), plan, r) for r in ranks]

