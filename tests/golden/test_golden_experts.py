"""Golden text of expert parallelism: the plan table and the rewritten rank graphs (built in
this process: the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_experts.py`` and read the diff.
"""
import expecttest

from golden_helpers import _plan_and_graph
from examples.factories import mixtral, mlp


class TestGoldenExperts(expecttest.TestCase):
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
