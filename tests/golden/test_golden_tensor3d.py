"""Golden text of AxoNN's 3D grid and Bian's cube: the plan table and the rewritten rank graphs (built in
this process: the rewrite needs no process group). Update on purpose only:
``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_tensor3d.py`` and read the diff.
"""
import expecttest

from golden_helpers import _plan_and_graph
from examples.factories import mlp


class TestGoldenTensor3D(expecttest.TestCase):
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
linear_chain:body    linear_chain  cube       0.011       0.811      1.803      1.610      0.000         0.01        replicate 0.012
linear_chain:body#1  linear_chain  cube       0.011       0.811      1.803      1.610      0.000         0.01        replicate 0.012
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
# rank 0 of 8 (data=0, z=0, y=0, x=0); built by passes: analysis -> cube -> data_parallel
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
