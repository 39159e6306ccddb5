"""The cost model: ring formulas, placement-aware bandwidth, hardware presets, FLOP counts."""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from expecttest import TestCase

from autopar.trace.capture import capture
from autopar.cost import model as cost
from autopar.passes.analysis.flops import NO_WORK, NodeWork, graph_work, node_work
from autopar.cost.hardware import PRESETS, Hardware, get_hardware

SELENE = PRESETS["a100-selene"]
# one node of 8 at 10 GB/s and no latency: the axonn equations as printed
FLAT = dataclasses.replace(SELENE, name="flat", intra_node_bandwidth=10e9, intra_node_latency_s=0.0)


class RingFormulas(TestCase):
    def test_hand_computed_values(self):
        # all-reduce of 1 MB over 4 ranks at 10 GB/s: 2·(3/4)·1e6/1e10 = 150 µs (eq 3)
        self.assertAlmostEqual(cost.all_reduce_time(4, 1e6, FLAT), 150e-6, places=12)
        # reduce-scatter of the same buffer: (3/4)·1e6/1e10 = 75 µs (eq 2)
        self.assertAlmostEqual(cost.reduce_scatter_time(4, 1e6, FLAT), 75e-6, places=12)
        # all-gather of 1 MB contributed per rank: 3·1e6/1e10 = 300 µs (eq 1)
        self.assertAlmostEqual(cost.all_gather_time(4, 1e6, FLAT), 300e-6, places=12)

    def test_alpha_terms(self):
        hw = dataclasses.replace(FLAT, intra_node_latency_s=1e-6)
        self.assertAlmostEqual(cost.all_reduce_time(4, 1e6, hw), 150e-6 + 6e-6, places=12)
        self.assertAlmostEqual(cost.reduce_scatter_time(4, 1e6, hw), 75e-6 + 3e-6, places=12)
        self.assertAlmostEqual(cost.all_gather_time(4, 1e6, hw), 300e-6 + 3e-6, places=12)
        self.assertAlmostEqual(cost.all_reduce_time(4, 0, hw), 6e-6, places=12)

    def test_group_of_one_costs_nothing(self):
        for fn in (cost.all_reduce_time, cost.reduce_scatter_time, cost.all_gather_time):
            self.assertEqual(fn(1, 1e9, SELENE), 0.0)
            self.assertIsInstance(fn(2, 10, SELENE), float)

    def test_all_reduce_is_reduce_scatter_plus_all_gather(self):
        g, nbytes = 8, 64e6
        self.assertAlmostEqual(cost.all_reduce_time(g, nbytes, SELENE),
                               cost.reduce_scatter_time(g, nbytes, SELENE)
                               + cost.all_gather_time(g, nbytes / g, SELENE), places=12)

    def test_monotone_in_bytes_and_group_size(self):
        for fn in (cost.all_reduce_time, cost.reduce_scatter_time, cost.all_gather_time):
            times = [fn(4, b, SELENE) for b in (1e3, 1e6, 1e9)]
            self.assertEqual(times, sorted(times))
            self.assertLess(fn(2, 1e6, SELENE), fn(8, 1e6, SELENE))
        # leaving the node makes the same collective slower
        self.assertLess(cost.all_reduce_time(8, 1e8, SELENE), cost.all_reduce_time(16, 1e8, SELENE))
        self.assertLess(cost.all_reduce_time(2, 1e8, SELENE, stride=4),
                        cost.all_reduce_time(2, 1e8, SELENE, stride=8))

    def test_formulas_print(self):
        self.assertExpectedInline(str(cost.FORMULAS["all_reduce"]), """2*alpha*(G - 1) + 2*m*(G - 1)/(G*beta)""")
        self.assertExpectedInline(str(cost.FORMULAS["reduce_scatter"]), """alpha*(G - 1) + m*(G - 1)/(G*beta)""")
        self.assertExpectedInline(str(cost.FORMULAS["all_gather"]), """alpha*(G - 1) + m*(G - 1)/beta""")
        self.assertExpectedInline(str(cost.FORMULAS["placement_bandwidth"]), """beta_inter/Min(G_inner, G_node)""")
        self.assertExpectedInline(str(cost.FORMULAS["matmul_time"]), """launch + (flops + saturation)/(efficiency*peak)""")
        self.assertExpectedInline(str(cost.FORMULAS["pipeline_bubble"]), """(p - 1)/(m_b*v)""")


class Placement(TestCase):
    def test_intra_and_inter_node(self):
        # 8 ranks per node, rank-major
        # (the preset's NCCL bus bandwidths: 235 GB/s NVLink, 20 GB/s per GPU's HCA)
        self.assertEqual(cost.group_link(8, 1, SELENE), (235e9, 2e-6))    # one whole node
        self.assertEqual(cost.group_link(4, 2, SELENE), (235e9, 2e-6))    # {0,2,4,6}
        self.assertEqual(cost.group_link(16, 1, SELENE), (160e9, 5e-6))   # 2 nodes, one ring: all 8 NICs
        self.assertEqual(cost.group_link(2, 8, SELENE), (20e9, 5e-6))     # {r, r+8}: 8 rings share the NICs
        self.assertEqual(cost.group_link(3, 1, SELENE)[1], 5e-6)          # groups of 3 straddle nodes
        self.assertEqual(cost.group_link(1, 64, SELENE), (235e9, 2e-6))

    def test_eq10_sharing(self):
        # β = β_inter / min(G_node, stride), β_inter = 8 · 20 GB/s, capped by NVLink (235 GB/s)
        seen = {s: cost.group_link(32 // s, s, SELENE)[0] for s in (1, 2, 4, 8, 16)}
        self.assertEqual(seen, {1: 160e9, 2: 80e9, 4: 40e9, 8: 20e9, 16: 20e9})
        beta_sym = cost.FORMULAS["placement_bandwidth"].subs(
            {cost.beta_inter: 160e9, cost.G_node: 8, cost.G_inner: 4})
        self.assertAlmostEqual(float(beta_sym), seen[4])

    def test_bad_group(self):
        with self.assertRaisesRegex(ValueError, "group_size"):
            cost.group_link(0, 1, SELENE)


class Compute(TestCase):
    def test_matmul_time(self):
        self.assertEqual(cost.matmul_time(0, SELENE), 0.0)
        rate = SELENE.peak_flops * SELENE.matmul_efficiency
        # at saturation_flops the matmul runs at half the achievable rate
        half = cost.matmul_time(SELENE.saturation_flops, SELENE) - SELENE.kernel_launch_s
        self.assertAlmostEqual(half, 2 * SELENE.saturation_flops / rate, places=15)
        big = 1e15
        self.assertAlmostEqual(cost.matmul_time(big, SELENE) / (big / rate), 1.0, places=5)

    def test_memory_bound_and_training_memory(self):
        # 2039 MB at the preset's 2039 GB/s x memory_efficiency 0.16, plus a 5 us launch
        self.assertAlmostEqual(cost.memory_bound_time(2039e6, SELENE), 1e-3 / 0.16 + 5e-6, places=12)
        self.assertEqual(cost.training_memory(1e6, 0), 16e6)  # 4 + 4 + 8 bytes per parameter
        self.assertEqual(cost.training_memory(10, 100, param_bytes=2, grad_bytes=2, optimizer_state_bytes=12), 260.0)

    def test_step_compute_time_factors(self):
        mm = NodeWork(flops=10**9, bytes_moved=0, is_matmul=True, is_kernel=True)
        pw = NodeWork(flops=10, bytes_moved=10**6, is_matmul=False, is_kernel=True)
        t_mm, t_pw = cost.matmul_time(1e9, SELENE), cost.memory_bound_time(1e6, SELENE)
        self.assertAlmostEqual(cost.step_compute_time([mm, pw, NO_WORK], SELENE), 3 * t_mm + 2 * t_pw, places=15)
        self.assertAlmostEqual(cost.step_compute_time([mm, pw], SELENE, recompute=True),
                               4 * t_mm + 3 * t_pw, places=15)

    def test_pipeline_bubble(self):
        self.assertAlmostEqual(cost.pipeline_bubble_fraction(4, 8), 3 / 8)
        self.assertAlmostEqual(cost.pipeline_bubble_fraction(4, 8, 2), 3 / 16)


class Overheads(TestCase):
    """What a step pays besides FLOPs and bytes (docs/planner.md, "Overheads")."""

    HOST = dataclasses.replace(FLAT, host_op_s=3e-6, collective_call_s=40e-6, pipeline_action_s=500e-6)

    def test_per_kernel_pass_and_per_call(self):
        # a 2e9-FLOP matmul at the preset's efficiency x 312 TFLOP/s, saturation 1e8:
        # (2e9 + 1e8)/(peak x efficiency) + 5 us launch + 3 us host
        expected = (2e9 + SELENE.saturation_flops) / (SELENE.peak_flops * SELENE.matmul_efficiency) \
            + SELENE.kernel_launch_s + 3e-6
        self.assertAlmostEqual(cost.matmul_time(2e9, self.HOST), expected, places=12)
        self.assertAlmostEqual(cost.memory_bound_time(1e6, self.HOST) - cost.memory_bound_time(1e6, FLAT), 3e-6,
                               places=12)
        # every collective call and send pays 40 us on the host; a group of one nothing
        self.assertAlmostEqual(cost.all_reduce_time(4, 1e6, self.HOST), 150e-6 + 40e-6, places=12)
        self.assertAlmostEqual(cost.all_gather_time(4, 1e6, self.HOST) - cost.all_gather_time(4, 1e6, FLAT), 40e-6,
                               places=12)
        self.assertEqual(cost.all_reduce_time(1, 1e6, self.HOST), 0.0)

    def test_a_view_costs_the_host_per_pass(self):
        """A view launches no kernel but is a Python call and an autograd node: forward
        and backward each pay ``host_op_s`` (and the recomputing forward once more);
        free in the presets, where the term is 0."""
        import torch
        from autopar.passes.analysis.flops import VIEW_WORK

        class Reshaping(torch.nn.Module):
            def forward(self, x):
                return x.view(2, 8).transpose(0, 1).flatten() * 2

        gm = capture(Reshaping(), (torch.randn(4, 4),))
        views = [n for n in gm.graph.nodes if node_work(n, gm) == VIEW_WORK]
        self.assertEqual(len(views), 3, [n.format_node() for n in gm.graph.nodes])
        works = list(graph_work(gm).values())
        with_views = cost.step_compute_time(works, self.HOST)
        kernels_only = cost.step_compute_time([w for w in works if w.is_kernel], self.HOST)
        self.assertAlmostEqual(with_views - kernels_only, 3 * 2 * 3e-6, places=12)
        self.assertAlmostEqual(cost.step_compute_time([VIEW_WORK], self.HOST, recompute=True), 3 * 3e-6, places=12)
        self.assertEqual(cost.step_compute_time([VIEW_WORK], FLAT), 0.0)

    def test_the_plan_says_its_overheads_as_their_own_column(self):
        """Each region's ``overhead_s`` is its priced seconds less the same region's
        priced without the overhead terms; the plan's, its step less that step; linear
        in the terms (twice the terms, twice the overhead); the presets show none."""
        import torch
        import autopar
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
        x = torch.randn(8, 16)
        cpu = get_hardware("cpu-gloo")
        plain = autopar.plan(model, 2, (x,), None, {"data": 1, "tensor": 2}, hardware=cpu)
        self.assertEqual(plain.overhead_s, 0.0)
        self.assertNotIn("of which host", plain.explain())
        self.assertTrue(all(r.cost.overhead_s == 0.0 for r in plain.regions))
        plans = {}
        for k in (1, 2):
            hw = dataclasses.replace(cpu, host_op_s=k * 3e-6, collective_call_s=k * 40e-6, step_overhead_s=k * 1e-3)
            plans[k] = autopar.plan(model, 2, (x,), None, {"data": 1, "tensor": 2}, hardware=hw)
        self.assertAlmostEqual(plans[1].overhead_s, plans[1].step_s - plain.step_s, places=12)
        self.assertAlmostEqual(plans[2].overhead_s, 2 * plans[1].overhead_s, places=12)
        for r, r0, r2 in zip(plans[1].regions, plain.regions, plans[2].regions):
            seconds = lambda c: c.compute_s + c.total_comm_s  # noqa: E731
            self.assertAlmostEqual(r.cost.overhead_s, seconds(r.cost) - seconds(r0.cost), places=12)
            self.assertAlmostEqual(r2.cost.overhead_s, 2 * r.cost.overhead_s, places=12)
        split = next(r for r in plans[1].regions if r.strategy == "megatron")
        # its two tensor all-reduces (forward exit, backward entry) pay 40 us each, its kernels 3 us per pass
        self.assertGreater(split.cost.overhead_s, 2 * 40e-6)
        text = plans[1].explain()
        self.assertIn("of which host", text)
        self.assertIn(f"host overheads {plans[1].overhead_s * 1e3:.3f} ms", text)

    def test_a_loss_over_counted_targets_pays_the_counts_all_reduce(self):
        """A cross-entropy averaged over its targets (ignore_index) counts them over the
        ranks splitting the batch each step (runtime.target_count): one 8-byte
        all-reduce over the data group, in the plan's data communication; a mean
        squared error counts nothing, and a plan that does not split the batch neither."""
        import torch
        import autopar
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
        x, labels = torch.randn(8, 16), torch.randint(0, 16, (8,))
        cpu = get_hardware("cpu-gloo")
        ce = autopar.plan(model, 4, (x,), torch.nn.functional.cross_entropy, {"data": 4}, example_target=labels)
        mse = autopar.plan(model, 4, (x,), torch.nn.functional.mse_loss, {"data": 4}, example_target=torch.randn(8, 16))
        count = cost.all_reduce_time(4, 8, cpu)
        self.assertAlmostEqual(ce.step_s - mse.step_s, count, delta=1e-7)  # the two losses differ by ns
        self.assertAlmostEqual(ce.total.comm_s["data"] - mse.total.comm_s["data"], count, places=12)
        whole = autopar.plan(model, 4, (x,), torch.nn.functional.cross_entropy, {"data": 1, "tensor": 4},
                             example_target=labels)
        unsplit = autopar.plan(model, 4, (x,), torch.nn.functional.mse_loss, {"data": 1, "tensor": 4},
                               example_target=torch.randn(8, 16))
        self.assertAlmostEqual(whole.step_s, unsplit.step_s, delta=1e-7)

    def test_bucket_copies(self):
        from autopar.planning.model import bucket_copy_s, exposed_data_comm
        # 8 MB of gradients copied in and out of the buckets at 2 TB/s: 8 us
        self.assertAlmostEqual(bucket_copy_s(8e6, SELENE), 2 * 8e6 / SELENE.memory_bandwidth, places=15)
        self.assertEqual(exposed_data_comm(1, 1, 8e6, 1.0, SELENE), 0.0)  # no data ranks, no buckets
        with_copies = exposed_data_comm(4, 1, 8e6, 1.0, SELENE)
        self.assertAlmostEqual(with_copies - bucket_copy_s(8e6, SELENE),
                               cost.all_reduce_time(4, min(8e6, 25 * 2**20), SELENE), places=12)

    def test_ranks_sharing_cores(self):
        # measured with 2 ranks on 2 cores; 4 ranks on the same 2 cores halve each one's share
        cpu = dataclasses.replace(get_hardware("cpu-gloo"), host_cores=2, measured_ranks=2, host_op_s=2e-6)
        self.assertEqual((cpu.sharing(1), cpu.sharing(2), cpu.sharing(4)), (1.0, 1.0, 2.0))
        four = cpu.on_world(4)
        self.assertEqual((four.peak_flops, four.memory_bandwidth), (cpu.peak_flops / 2, cpu.memory_bandwidth / 2))
        self.assertEqual((four.kernel_launch_s, four.host_op_s), (cpu.kernel_launch_s * 2, 4e-6))
        self.assertIs(cpu.on_world(2), cpu)  # as measured
        self.assertIs(SELENE.on_world(1024), SELENE)  # a device per rank: nothing shared
        # a profile measured on 4 ranks sharing 2 cores, planned for 2: each gets a core back
        self.assertEqual(dataclasses.replace(cpu, measured_ranks=4).on_world(2).peak_flops, cpu.peak_flops * 2)
        self.assertEqual(Hardware.from_json(json.loads(json.dumps(four.to_json()))), four)

    def test_a_pipeline_computes_with_the_cores_its_waiting_stages_leave(self):
        """4 ranks on 2 cores, figures measured with all 4 computing: a 2-stage pipeline
        with 1 microbatch keeps each stage busy half the step (m/(m + p - 1)), so 2 ranks
        compute at a time, each on a core: its compute priced at twice the rate; a data
        plan (every rank busy) as measured; a device per rank (host_cores 0) unchanged."""
        shared = dataclasses.replace(get_hardware("cpu-gloo"), host_cores=2, measured_ranks=4)
        self.assertEqual(shared.while_busy(2).peak_flops, 2 * shared.peak_flops)
        self.assertEqual(shared.while_busy(4.0).peak_flops, shared.peak_flops)
        import autopar
        from examples.factories import transformer
        model, inputs, loss_fn, target = transformer()
        own = dataclasses.replace(shared, host_cores=0)
        pipe = {"pipeline": 2, "data": 2, "microbatches": 1}
        one = {k: autopar.plan(model, 4, inputs, loss_fn, pipe, example_target=target, hardware=hw)
               for k, hw in (("shared", shared), ("own", own))}
        self.assertLess(one["shared"].total.compute_s, one["own"].total.compute_s)
        self.assertLess(one["shared"].step_s, one["own"].step_s)
        data = [autopar.plan(model, 4, inputs, loss_fn, {"data": 4}, example_target=target, hardware=hw).step_s
                for hw in (shared, own)]
        self.assertEqual(data[0], data[1])

    def test_csub_common_layers_compute_with_the_cores_the_other_subgrids_leave(self):
        """D&SP-cSub runs the common layers on sub-grid 0 only: with 4 ranks on 2 cores
        and 2 sub-grids, the 2 ranks of sub-grid 0 compute them a core each while the
        others wait, so those layers are priced at twice the rate the figures (measured
        with all 4 computing) give; D&SP (common layers on every rank) as measured."""
        import autopar
        from examples.factories import transformer
        model, inputs, loss_fn, target = transformer()
        shared = dataclasses.replace(get_hardware("cpu-gloo"), host_cores=2, measured_ranks=4, host_op_s=10e-6)
        own = dataclasses.replace(shared, host_cores=0)

        def outside(strategy, hw):
            plan = autopar.plan(model, 4, inputs, loss_fn, strategy, example_target=target, hardware=hw)
            return next(c.cost.compute_s for c in plan.regions if c.region == "(outside regions)")

        csub = {"data": 4, "subgrids": 2, "csub": True}
        self.assertAlmostEqual(outside(csub, shared), outside(csub, own) / 2, places=12)
        dsp = {"data": 4, "subgrids": 2}
        self.assertEqual(outside(dsp, shared), outside(dsp, own))

    def test_pipeline_actions(self):
        from examples.factories import transformer
        from autopar.passes.analysis.analyse import analyse
        from autopar.driver.search import plan_graph
        model, inputs, loss, target = transformer()
        gm = analyse(capture(model, inputs, loss, target))
        strategy = {"pipeline": 2, "data": 2, "microbatches": 2}
        base = plan_graph(gm, 4, FLAT, strategy).pipeline
        busy = plan_graph(gm, 4, dataclasses.replace(FLAT, pipeline_action_s=500e-6), strategy).pipeline
        # each stage's forward and backward of a microbatch: one action each, 0.5 ms
        for a, b in zip(base["stage_s"], busy["stage_s"]):
            self.assertAlmostEqual(b - a, 1e-3, places=12)
        # the runner's fixed cost per step: on every plan, said in the explanation
        plain = plan_graph(gm, 4, FLAT, {"data": 4})
        fixed = plan_graph(gm, 4, dataclasses.replace(FLAT, step_overhead_s=2e-3), {"data": 4})
        self.assertAlmostEqual(fixed.step_s - plain.step_s, 2e-3, places=12)
        self.assertIn("runtime per step 2.000 ms", fixed.explain())
        self.assertNotIn("runtime per step", plain.explain())


class Presets(TestCase):
    def test_round_trip(self):
        for hw in PRESETS.values():
            self.assertEqual(Hardware.from_json(json.loads(json.dumps(hw.to_json()))), hw)
            self.assertIs(get_hardware(hw.name), hw)
        self.assertIs(get_hardware(None), PRESETS["cpu-gloo"])
        self.assertIs(get_hardware(FLAT), FLAT)

    def test_from_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "flat.json")
            with open(path, "w") as f:
                json.dump(FLAT.to_json(), f)
            self.assertEqual(get_hardware(path), FLAT)

    def test_unknown_name(self):
        with self.assertRaises(ValueError) as ctx:
            get_hardware("tpu-v9")
        self.assertExpectedInline(str(ctx.exception), """unknown hardware 'tpu-v9': expected one of the presets ['a100', 'a100-perlmutter', 'a100-selene', 'b200', 'cpu-gloo', 'h100', 'h200', 'mi250x-frontier', 'mi300x', 'v100-lassen'] or the path of a JSON file written by Hardware.to_json()""")
        with self.assertRaisesRegex(ValueError, r"missing fields \['memory_bytes'\]"):
            Hardware.from_json({k: v for k, v in FLAT.to_json().items() if k != "memory_bytes"})

    def test_selene_figures(self):
        self.assertEqual((SELENE.peak_flops, SELENE.devices_per_node), (312e12, 8))
        self.assertEqual((SELENE.intra_node_bandwidth, SELENE.inter_node_bandwidth), (235e9, 20e9))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)).view(x.shape[0], -1))


def _matmul_flops(gm) -> int:
    return sum(w.flops for w in graph_work(gm).values() if w.is_matmul)


class NodeWorkTest(TestCase):
    def test_mlp_both_tracers_agree(self):
        x = torch.randn(4, 16)
        expected = 2 * 4 * 16 * 64 + 2 * 4 * 64 * 8
        traced = capture(MLP(), (x,), tracer="symbolic_trace")
        exported = capture(MLP(), (x,), tracer="export")
        self.assertEqual(_matmul_flops(traced), expected)
        self.assertEqual(_matmul_flops(exported), expected)
        for gm in (traced, exported):
            work = graph_work(gm)
            kernels = [name for name, w in work.items() if w.is_kernel]
            self.assertEqual(len(kernels), 3, kernels)  # fc1, gelu, fc2; the view is free
        fc1 = next(n for n in traced.graph.nodes if str(n.target).endswith("fc1"))
        # input 256 B + output 1024 B + weight 4096 B + bias 256 B
        self.assertEqual(node_work(fc1, traced), NodeWork(2 * 4 * 16 * 64, 5632, True, True))

    def test_sdpa(self):
        class Attention(nn.Module):
            def __init__(self, causal):
                super().__init__()
                self.causal = causal

            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

        b, h, s, d = 2, 4, 8, 16
        q = torch.randn(b, h, s, d)
        for tracer in ("symbolic_trace", "export"):
            # QKᵀ and PV over every pair; causal: the s(s+1)/2 pairs a query attends
            # (a flash kernel skips the blocks above the diagonal)
            gm = capture(Attention(False), (q, q, q), tracer=tracer)
            self.assertEqual(_matmul_flops(gm), 4 * b * h * s * s * d, tracer)
            gm = capture(Attention(True), (q, q, q), tracer=tracer)
            self.assertEqual(_matmul_flops(gm), 4 * b * h * (s * (s + 1) // 2) * d, tracer)

    def test_conv_and_embedding(self):
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, groups=1), nn.ReLU())
        x = torch.randn(2, 3, 10, 10)
        for tracer in ("symbolic_trace", "export"):
            gm = capture(model, (x,), tracer=tracer)
            self.assertEqual(_matmul_flops(gm), 2 * (2 * 8 * 10 * 10) * 3 * 3 * 3, tracer)
        emb = capture(nn.Embedding(100, 32), (torch.zeros(4, 5, dtype=torch.long),))
        work = [w for w in graph_work(emb).values() if w.is_kernel]
        self.assertEqual(work, [NodeWork(0, 4 * 5 * 8 + 2 * 4 * 5 * 32 * 4, False, True)])

    def test_leaf_multihead_attention(self):
        e, h, b, s = 16, 2, 2, 5
        model = nn.MultiheadAttention(e, h, batch_first=True)
        x = torch.randn(b, s, e)
        traced = capture(model, (x, x, x), tracer="symbolic_trace")
        expected = 4 * 2 * b * s * e * e + 4 * b * s * s * e  # q, k, v, out projections + attention
        self.assertEqual(_matmul_flops(traced), expected)

    def test_placeholders_and_parameters_are_free(self):
        gm = capture(MLP(), (torch.randn(4, 16),), tracer="export")
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "get_attr", "output"):
                self.assertEqual(node_work(node, gm), NO_WORK)
