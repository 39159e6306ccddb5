"""Golden text of D&SP and D&SP-cSub: the plan table and the rewritten rank graphs (built in
this process: the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_dsp.py`` and read the diff.
"""
import expecttest

import autopar
from autopar.engine.executable import rank_graph_code
from golden_helpers import _plan_and_graph, _one_layer_transformer, _rank_graphs
from examples.factories import inception


class TestGoldenDsp(expecttest.TestCase):
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
# rank 0 of 4 (data=0, tensor=0; sub-grid 0, position 0, batch chunk 0); built by passes: analysis -> dsp -> tensor_parallel -> data_parallel
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
# rank 1 of 4 (data=1, tensor=0; sub-grid 1, position 0, batch chunk 1); built by passes: analysis -> dsp -> tensor_parallel -> data_parallel
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
# rank 0 of 4 (data=0, tensor=0; sub-grid 0, position 0, batch chunk 0); built by passes: analysis -> dsp -> tensor_parallel -> data_parallel
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
        self.assertExpectedInline(head1, """# rank 1 of 4 (data=1, tensor=0; sub-grid 1, position 0, batch chunk 1); built by passes: analysis -> dsp -> tensor_parallel -> data_parallel""")

    def test_transformer_csub_heads(self):
        # D&SP-cSub: sub-grid 0 (rank 0) runs the common layers on its half of the batch and
        # scatters the heads; sub-grid 1 (rank 1) runs only heads 2-3, receiving the mask and
        # the scale by a forward-only share, and gathers the context back to rank 0
        rank0, rank1 = _rank_graphs(_one_layer_transformer, 4, {"data": 4, "subgrids": 2, "csub": True})
        self.assertExpectedInline(rank0, """\
# rank 0 of 4 (data=0, tensor=0; sub-grid 0, position 0, batch chunk 0); built by passes: analysis -> dsp -> tensor_parallel -> data_parallel
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
