"""Golden text of a PTD-P pipeline: the plan table and the rewritten rank graphs (built in
this process: the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_pipeline.py`` and read the diff.
"""
import expecttest

import autopar
from examples.factories import transformer


class TestGoldenPipeline(expecttest.TestCase):
    def test_transformer_pipeline(self):
        """PTD-P: pipeline 2 x tensor 2 with 4 microbatches (1F1B): the stage partition, the
        timeline, and rank 0's stage program (embedding and block 0, Megatron inside)."""
        from autopar.driver.rank_program import rewrite
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
