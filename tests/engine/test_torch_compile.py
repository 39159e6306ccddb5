"""compile(torch_compile=True): each rank program runs under torch.compile (Inductor's
C++ on the CPU) and trains as the uncompiled programs do: the losses of three SGD
steps and the parameters after them, float64, on 2 gloo ranks, for data parallelism
(the main suite) and tensor parallelism, ZeRO-3 and a 2-stage pipeline (extended:
each compiles its programs for 10-20 s on the 2-core machine)."""
from __future__ import annotations

import pytest
import torch

import shared_ranks


def compiled_against_eager(strategies: list) -> list:
    import autopar
    from autopar.engine import executable
    from examples.factories import training_case
    made = []   # every program compile(torch_compile=True) wrapped, and whether its forward is Dynamo's

    wrap = executable.compiled

    def counted(program):
        out = wrap(program)
        made.append(hasattr(out.forward, "_torchdynamo_orig_callable"))
        return out
    executable.compiled = counted
    factory, inputs, target, loss = training_case("transformer", layers=4)
    out = []
    for strategy in strategies:
        runs = {}
        for compiled in (False, True):
            torch.manual_seed(0)
            pm = autopar.compile(factory().double(), None, example_inputs=inputs, loss_fn=loss,
                                 example_target=target, strategy=strategy, torch_compile=compiled)
            opt = torch.optim.SGD(pm.parameters(), lr=0.1)
            losses = []
            for _ in range(3):
                opt.zero_grad()
                losses.append(float(pm.step(*inputs, target=target)))
                opt.step()
            runs[compiled] = (losses, pm.full_state_dict(), list(made))
            made.clear()
        eager, compiled = runs[False], runs[True]
        out.append({"losses": (eager[0], compiled[0]), "compiled": (eager[2], compiled[2]),
                    "param": max((compiled[1][k] - v).abs().max().item() for k, v in eager[1].items())})
    return out


MAIN = [{"data": 2}]
EXTENDED = [{"tensor": 2}, {"data": 2, "zero": 3}, {"pipeline": 2, "microbatches": 2}]
_MAIN = shared_ranks.register(2, __name__, compiled_against_eager, (MAIN,), timeout_s=600)
_EXTENDED = shared_ranks.register(2, __name__ + ":extended", compiled_against_eager, (EXTENDED,), timeout_s=900,
                                  extended=True)


def _check(reports) -> None:
    for report in reports:
        eager, compiled = report["losses"]
        assert compiled == pytest.approx(eager, rel=1e-12, abs=0.0), report
        assert report["param"] < 1e-12, report
        eager, compiled = report["compiled"]   # the programs were compiled, and only with torch_compile
        assert not eager and compiled and all(compiled), report


@pytest.mark.multiprocess
def test_compiled_data_parallel_programs_train_as_the_uncompiled():
    _check([r[0] for r in _MAIN()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[str(s) for s in EXTENDED])
def test_compiled_programs_train_as_the_uncompiled(index):
    _check([r[index] for r in _EXTENDED()])


def test_fusion_and_torch_compile_together_are_refused():
    import autopar
    from examples.factories import training_case
    factory, inputs, target, loss = training_case("transformer")
    with pytest.raises(ValueError, match="fusion=True and torch_compile=True"):
        autopar.compile(factory(), None, example_inputs=inputs, loss_fn=loss, example_target=target,
                        fusion=True, torch_compile=True)
