"""Pipeline parallelism and PTD-P on real gloo ranks against the single-device model.

p = 2 (2 ranks) and p = 4 (4 ranks, alone and as pipeline 2 × data 2) with m = 4 and 8
microbatches under GPipe, 1F1B and interleaved 1F1B (v = 2), and PTD-P pipeline 2 ×
data 2 × tensor 2 on 8 ranks with §4.1's scatter/gather (without it, interleaved, and
with recomputation, in the extended suite); on the plain-PyTorch
transformer and Hugging Face GPT-2 (torch.export; its tied embedding and head live on the
first and the last stage, their gradients summed over both). Each case compares, in
float64, the outputs, the loss and every gradient after one step over the whole batch,
the gradient norm, and every parameter after 3 AdamW steps, each tensor to what float64
achieves (:data:`TOLERANCE`); GPT-2 also runs with its
blocks recomputed in backward (megatron §3.5). Every rank also reports the order in
which it ran its forwards and backwards, compared with the paper's Figure 4 for p = 4,
m = 8 and v = 1, 2.
"""
import pytest

import shared_ranks
from autopar.planning.schedules import schedule
from autopar.planning.timeline import simulate
from autopar.testing import equivalence_job

F = {"dtype": "float64", "batch": 8, "layers": 4}
F8 = {**F, "layers": 8}
R = {**F, "recompute": True}
CASES = {
    2: [("transformer", {"pipeline": 2, "microbatches": 4, "schedule": "1f1b"}, F),
        ("gpt2", {"pipeline": 2, "microbatches": 4, "chunks": 2, "schedule": "interleaved"}, F)],
    4: [("transformer", {"pipeline": 4, "microbatches": 4, "schedule": "1f1b"}, F),
        ("transformer", {"pipeline": 4, "microbatches": 8, "chunks": 2, "schedule": "interleaved"}, F8),
        ("gpt2", {"pipeline": 4, "microbatches": 4, "chunks": 2, "schedule": "interleaved"}, F8),
        ("gpt2", {"pipeline": 4, "microbatches": 8, "schedule": "1f1b"}, R),
        ("gpt2", {"pipeline": 2, "data": 2, "microbatches": 4, "chunks": 2, "schedule": "interleaved"}, F)],
    8: [("gpt2", {"pipeline": 2, "data": 2, "tensor": 2, "microbatches": 2, "schedule": "1f1b"}, F)],
}
# zero-bubble schedules (Qi et al. 2024): ZB-H1 and ZB-V on Llama, GPT-2 (a tied vocabulary
# over the ends: under ZB-V both ends are on rank 0) and torch's nn.TransformerEncoderLayer
# blocks, with 2 and 4 stages, with data and tensor parallelism and recomputation
CASES[2] += [("gpt2", {"pipeline": 2, "microbatches": 4, "schedule": "zbv"}, F)]
# the rest of the matrix (4 stages, tensor 2, recomputation): the extended suite, with
# GPT-2 under ZB-V with data 2 (its tied weight, read by two chunks of rank 0, is armed
# for the data all-reduce only after the later chunk's last W), GPipe on 4 stages and the
# transformer interleaved on 2 stages, over data 2 here (GPT-2 interleaved on 2 and the
# transformer on 4 stay in the main suite)
# and GPipe and recomputation on 2 stages (each on 4 stages in the main suite)
EXTENDED_2 = [("gpt2", {"pipeline": 2, "microbatches": 8, "schedule": "gpipe"}, F),
              ("gpt2", {"pipeline": 2, "microbatches": 4, "schedule": "1f1b"}, R)]
EXTENDED_ZB = [("gpt2", {"pipeline": 2, "data": 2, "microbatches": 4, "schedule": "zbv"}, F),
               ("transformer", {"pipeline": 2, "data": 2, "microbatches": 4, "chunks": 2, "schedule": "interleaved"},
                F),
               ("transformer", {"pipeline": 4, "microbatches": 8, "schedule": "gpipe"}, F),
               ("llama", {"pipeline": 4, "microbatches": 8, "schedule": "zbv"}, F8),
               ("llama", {"pipeline": 4, "microbatches": 4, "schedule": "zb-h1"}, F),
               ("gpt2", {"pipeline": 2, "tensor": 2, "microbatches": 4, "schedule": "zb-h1"}, R),
               ("gpt2", {"pipeline": 4, "microbatches": 8, "schedule": "zb-h1"}, F),
               ("encoder", {"pipeline": 4, "microbatches": 4, "schedule": "zb-h1"}, R),
               ("encoder", {"pipeline": 2, "data": 2, "microbatches": 4, "schedule": "zbv"}, F),
               ("llama", {"pipeline": 2, "tensor": 2, "microbatches": 4, "schedule": "zbv"}, R),
               ("gpt2", {"pipeline": 4, "microbatches": 8, "schedule": "zbv"}, {**F8, "recompute": True}),
               ("transformer", {"pipeline": 2, "data": 2, "microbatches": 4, "chunks": 2, "schedule": "interleaved-zb"},
                F8),
               ("llama", {"pipeline": 2, "data": 2, "microbatches": 4, "schedule": "zb-h1"}, R),
               ("encoder", {"pipeline": 4, "microbatches": 8, "schedule": "zbv"}, {**F8, "recompute": True})]
# PTD-P without §4.1's scatter/gather, interleaved, and with recomputation, with tensor 2:
# the extended suite
EXTENDED = [("gpt2", {"pipeline": 2, "data": 2, "tensor": 2, "microbatches": 2, "scatter_gather": False,
                      "schedule": "1f1b"}, F),
            ("transformer", {"pipeline": 2, "data": 2, "tensor": 2, "microbatches": 2, "chunks": 2,
                             "schedule": "interleaved"}, F),
            ("transformer", {"pipeline": 2, "data": 2, "tensor": 2, "microbatches": 4, "schedule": "1f1b"}, R)]
ALL = [(world, i) for world in CASES for i in range(len(CASES[world]))]
# the largest relative error over every tensor of each kind (autopar.testing). The
# parallel and single-device sums differ only in their order: outputs, loss, gradients
# and their norms agree to ~1e-15 (largest seen 1.3e-15, a GPT-2 LayerNorm weight's
# gradient); the parameters after 3 AdamW steps to ~1e-13 (largest 6.7e-13), Adam
# normalising each entry's gradient, which magnifies the rounding of entries whose gradient
# is near zero
TOLERANCE = {"output": 1e-14, "loss": 1e-14, "grad": 1e-14, "grad_norm": 1e-14, "param": 2e-12}
# one launch per world size, shared with other modules' jobs (tests/shared_ranks.py)
# PTD-P on 8 ranks (pipeline x data x tensor) takes minutes on the 2-core machine: the
# extended suite (each pair of its dimensions runs on 4 ranks in the main one)
_LAUNCHED = {world: shared_ranks.register(world, __name__, equivalence_job, (cases,), timeout_s=900,
                                          extended=world == 8)
             for world, cases in CASES.items()}
_EXTENDED = shared_ranks.register(8, __name__ + ":extended", equivalence_job, (EXTENDED,), timeout_s=900,
                                  extended=True)
_EXTENDED_ZB = shared_ranks.register(4, __name__ + ":extended-zb", equivalence_job, (EXTENDED_ZB,), timeout_s=900,
                                     extended=True)
_EXTENDED_2 = shared_ranks.register(2, __name__ + ":extended-2", equivalence_job, (EXTENDED_2,), timeout_s=900,
                                    extended=True)


def _reports(world):
    return dict(enumerate(_LAUNCHED[world]()))


def _case_id(world, i, cases=None):
    model, strategy, options = (cases if cases is not None else CASES[world])[i]
    text = "-".join(f"{k}{v}" for k, v in strategy.items())
    return f"{world}ranks-{model}-{text}{'-recompute' if options.get('recompute') else ''}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("world,index", [pytest.param(w, i, marks=pytest.mark.extended) if w == 8 else (w, i)
                                         for w, i in ALL], ids=[_case_id(w, i) for w, i in ALL])
def test_matches_single_device(world, index):
    _check(CASES[world][index], [reports[index] for reports in _LAUNCHED[world]()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[_case_id(8, i, EXTENDED) for i in range(len(EXTENDED))])
def test_extended_cases_match_single_device(index):
    _check(EXTENDED[index], [reports[index] for reports in _EXTENDED()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED_ZB)),
                         ids=[_case_id(4, i, EXTENDED_ZB) for i in range(len(EXTENDED_ZB))])
def test_zero_bubble_cases_match_single_device(index):
    _check(EXTENDED_ZB[index], [reports[index] for reports in _EXTENDED_ZB()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED_2)), ids=[_case_id(2, i, EXTENDED_2) for i in range(len(EXTENDED_2))])
def test_two_stage_gpipe_and_recomputation_match_single_device(index):
    _check(EXTENDED_2[index], [reports[index] for reports in _EXTENDED_2()])


def _check(case, reports) -> None:
    model, strategy, options = case
    name = strategy["schedule"]
    p, v = strategy["pipeline"], strategy.get("chunks", 2 if name == "zbv" else 1)
    m = strategy["microbatches"]
    data, tensor = strategy.get("data", 1), strategy.get("tensor", 1)
    for rank, report in enumerate(reports):
        assert report["case"] == case
        assert report["mesh"] == {"pipeline": p, "data": data, "tensor": tensor}
        for what, bound in TOLERANCE.items():
            assert report[what][1] < bound, (rank, case, what, report[what], report.get(f"worst_{what}"))
        position = rank // (data * tensor)
        # the rank ran exactly its schedule's order, the one the timeline simulator predicts
        assert report["executed"] == " ".join(str(a) for a in schedule(name, p, m, position, v))
        assert report["executed"] == " ".join(str(a) for a, _, _ in simulate(name, p, m, v).runs[position])
        # it holds only its stages' parameters (plus the tied head on the last stage)
        assert report["held_params"] < report["all_params"]
        # the blocks are recomputed in backward (one checkpointed call per block of the
        # rank's stages; the plain transformer's call nn.Linear modules, re-bound to the
        # rank's module tree)
        blocks = options["layers"] // p
        assert report["recomputed"] == (blocks if options.get("recompute") else 0)


@pytest.mark.multiprocess
def test_order_on_ranks_is_figure_4():
    """Figure 4 of megatron for p = 4, m = 8: 1F1B (v = 1) and interleaved (v = 2), as run."""
    one_f_one_b = _reports(4)[0][3]   # GPT-2, p=4, m=8, 1F1B (blocks recomputed)
    interleaved = _reports(4)[0][1]   # transformer, p=4, m=8, v=2
    assert one_f_one_b["executed"] == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert interleaved["executed"] == (
        "F0 F1 F2 F3 F0.1 F1.1 F2.1 F3.1 F4 F5 "
        "F6 B0.1 F7 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0 F7.1 B1 "
        "B2 B3 B4.1 B5.1 B6.1 B7.1 B4 B5 B6 B7")
    last = _reports(4)[3][3]
    assert last["executed"] == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"


@pytest.mark.multiprocess
@pytest.mark.extended
def test_scatter_gather_halves_the_point_to_point_bytes():
    """megatron §4.1: with tensor 2 each tensor rank sends half the activation."""
    for rank, (reports, extended) in enumerate(zip(_LAUNCHED[8](), _EXTENDED())):
        with_sg, without = reports[0]["sent_bytes"], extended[0]["sent_bytes"]
        assert with_sg * 2 == without, (rank, with_sg, without)
