"""Expert parallelism through ``autopar.compile`` on 4 real gloo ranks, against the
single-device model (docs/experts.md): Hugging Face Mixtral (top-2 of 4 and of 8 experts) under
expert degrees 2 and 4, with Megatron tensor parallelism inside the experts, inside a
2-stage pipeline; a model whose experts are a ``ModuleList`` of standard layers
(``examples/models.ListMoETransformer``, float64, within 1e-12); Qwen2-MoE (a gated
shared expert beside the routed ones); DeepSeek-V3 (sigmoid scores, a correction bias,
group-limited routing, a shared expert); GPT-OSS (a router with a bias, experts with
biases and the clamped SwiGLU on alternating gate and up columns, attention sinks cut
with their heads under Megatron), also under "auto" and plain data x tensor; the models'
own load-balancing loss with a padding mask, under expert parallelism (with tensor
parallelism for Qwen2-MoE; plain data parallelism's is in tests/strategies/experts/test_moe.py).
Compared: the outputs, the loss, every gradient, the gradient norms and every parameter
after 3 AdamW steps (float32: torch's grouped matmul, which the experts call, takes no
float64; the tolerances are float32 rounding through 3 Adam steps, as plain data
parallelism of the same model reaches). Each rank program holds the expert-parallel call
(no grouped matmul over every expert left), each rank holds its share of the experts,
and the measured load is reported.
"""
import pytest
import torch

import shared_ranks
from autopar.testing import compare_with_single_device, equivalence_job

CASES = [
    ("mixtral", {"data": 4, "experts": 2}),
    ("list_moe", {"data": 4, "experts": 2}, {"dtype": "float64"}),
    ("gpt_oss", {"data": 2, "tensor": 2, "experts": 2}),
]
EXTENDED = [
    ("mixtral", {"data": 2, "tensor": 2, "experts": 2}),
    ("qwen2_moe", {"data": 4, "experts": 4}),
    ("mixtral8", {"data": 4, "experts": 4}),
    ("mixtral", {"pipeline": 2, "data": 2, "experts": 2}),
    ("qwen2_moe", {"regions": {"kind:experts": {"experts": 2}}}),
    ("list_moe", {"data": 2, "tensor": 2, "experts": 2}, {"dtype": "float64"}),
    ("deepseek_v3", {"data": 4, "experts": 4}),
    ("gpt_oss", {"data": 4, "experts": 4}),
]
# GPT-OSS without expert parallelism: what "auto" chooses, and Megatron splitting its
# experts (biases, alternating gate/up columns) and its attention sinks (2 rows: 1 per data rank)
GPT_OSS_OTHERS = [("gpt_oss", "auto"), ("gpt_oss", {"data": 2, "tensor": 2}, {"batch": 2})]


def aux_job(cases) -> list:
    """The models' own loss (cross-entropy plus 0.1 x the load-balancing loss over a
    padded batch) under expert parallelism."""
    from examples.factories import moe_model
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 9:] = 0   # padding on one rank's rows only: the statistics' counts differ per rank
    mask[3, 5:] = 0
    kwargs = {"input_ids": ids, "attention_mask": mask, "labels": ids}
    reports = []
    # (plain data parallelism's aux loss: tests/strategies/experts/test_moe.py)
    for name, strategy in cases:
        report = compare_with_single_device(lambda: moe_model(name, aux=True), (), None, None, strategy,
                                            kwargs=kwargs)
        report["case"] = (name, strategy)
        reports.append(report)
    return reports


_MAIN = shared_ranks.register(4, __name__, equivalence_job, (CASES,), timeout_s=600)
_AUX = shared_ranks.register(4, __name__ + ".aux", aux_job, ([("mixtral", {"data": 4, "experts": 2})],),
                             timeout_s=600)
_AUX_EXTENDED = shared_ranks.register(4, __name__ + ".aux_extended", aux_job,
                                      ([("qwen2_moe", {"data": 2, "tensor": 2, "experts": 2})],), timeout_s=600,
                                      extended=True)
_EXTENDED = shared_ranks.register(4, __name__ + ".extended", equivalence_job, (EXTENDED,), timeout_s=600,
                                  extended=True)
_GPT_OSS_OTHERS = shared_ranks.register(4, __name__ + ".gpt_oss", equivalence_job, (GPT_OSS_OTHERS,),
                                        timeout_s=300, extended=True)

TOLERANCE = {"output": 1e-5, "loss": 1e-5, "grad": 2e-5, "grad_norm": 1e-5, "param": 5e-4}


def _check(report: dict) -> None:
    case = report["case"]
    exact = len(case) > 2 and case[2].get("dtype") == "float64"   # a ModuleList's experts: float64
    for key, bound in TOLERANCE.items():
        bound = 1e-12 if exact else bound
        assert report[key][1] <= bound, (case, key, report[key], report.get("worst_" + key.split("_")[0]))


def _megatron_rows(plan: str, kind: str) -> int:
    """How many of the plan table's regions of ``kind`` are Megatron-split."""
    return sum(1 for line in plan.splitlines()
               if line.startswith(kind + ":") and line.split()[1:3] == [kind, "megatron"])


def _check_experts(reports: list, degree: int) -> None:
    """Every rank's report within tolerance, the expert-parallel program, the held share,
    the measured load and the plan's text."""
    for report in reports:
        _check(report)
    code = reports[0]["code"]
    assert ("expert_parallel_mlp" in code or "expert_parallel_modules" in code) and "grouped_mm" not in code \
        and "index_add" not in code, reports[0]["case"]
    # each rank holds 1/degree of the experts (and its share of what the tensor group splits)
    assert all(r["held_params"] < r["all_params"] for r in reports)
    load = reports[0]["expert_load"]
    assert load and all(len(rows) == degree for rows in load.values())   # the expert group's ranks
    assert "expert parallelism: expert groups of" in reports[0]["explain"]
    assert "measured" in reports[0]["explain"]
    if reports[0]["case"][0] == "gpt_oss":   # the experts' biases and activation reach the call
        assert all(f"{key} = " in code for key in ("gate_up_bias", "down_bias", "interleaved")), code
        assert "activation = ('clamped_swiglu', 1.702, 0.3)" in code
        if "tensor" in reports[0]["case"][1]:   # the attention (its sinks with it) split by heads
            assert _megatron_rows(reports[0]["explain"], "attention") == 2, reports[0]["explain"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)))
def test_expert_parallel_equals_the_single_device_model(index):
    reports = [per_rank[index] for per_rank in _MAIN()]
    _check_experts(reports, CASES[index][1].get("experts", 2))
    assert "experts" in reports[0]["plan"]


@pytest.mark.multiprocess
def test_the_load_balancing_loss_equals_the_single_device_models():
    _check_experts([r[0] for r in _AUX()], 2)


@pytest.mark.multiprocess
@pytest.mark.extended
def test_the_load_balancing_loss_with_tensor_parallel_experts_and_a_shared_expert():
    _check_experts([r[0] for r in _AUX_EXTENDED()], 2)


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)))
def test_expert_parallel_in_a_pipeline_and_at_degree_four(index):
    _check_experts([per_rank[index] for per_rank in _EXTENDED()], EXTENDED[index][1].get("experts", 2))


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(GPT_OSS_OTHERS)))
def test_gpt_oss_without_expert_parallelism(index):
    """GPT-OSS as "auto" plans it (no expert parallelism on 4 CPU ranks), and under plain
    data x tensor: its experts' chains (biases, alternating gate/up columns) and its
    attention (sinks cut with the heads) Megatron-split."""
    reports = [per_rank[index] for per_rank in _GPT_OSS_OTHERS()]
    for report in reports:
        _check(report)
    if GPT_OSS_OTHERS[index][1] != "auto":
        plan = reports[0]["plan"]
        assert _megatron_rows(plan, "attention") == 2 and _megatron_rows(plan, "linear_chain") == 2, plan
