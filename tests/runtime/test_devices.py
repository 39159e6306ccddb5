"""The runtime's tensors live on the device of the values they serve, never on the
default device (autopar/runtime/devices.py): the CPU guard for the GPU path.

* Statically: every tensor factory call in ``autopar/`` (``torch.empty``, ``zeros``,
  ``ones``, ``full``, ``tensor``, ``arange``, ``rand*``, ...) names its device; the
  ``*_like`` and ``new_*`` forms follow their value and need none.
* On 4 real ranks: each family's step, forward, norms, clipping and state under
  ``torch.device("meta")`` as the default device equal the single-device model. A buffer
  made without a device (a pipeline's receive buffer, a cSub placeholder, ZeRO's refresh
  flag, the loss a sub-grid receives) lands on ``meta`` there and the step fails: with
  the pipeline executor's receive buffer as it was before this guard (``torch.empty(n,
  dtype=...)``) the pipeline cases fail on the receiving ranks with "Cannot copy out of
  meta tensor; no data!" (and the static check names the line).
"""
import ast
import pathlib

import pytest
import torch

import shared_ranks
from autopar.runtime import devices
from autopar.testing import equivalence_job

ROOT = pathlib.Path(__file__).resolve().parents[2] / "autopar"
FACTORIES = {"empty", "zeros", "ones", "full", "tensor", "arange", "rand", "randn", "randint", "randperm", "eye",
             "linspace", "logspace", "empty_strided", "scalar_tensor"}


def _factory_calls_without_device(root: pathlib.Path = ROOT):
    missing = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            base = node.func.value
            if isinstance(base, ast.Name) and base.id == "torch" and node.func.attr in FACTORIES:
                if not any(k.arg == "device" for k in node.keywords):
                    missing.append(f"{path.relative_to(root.parent)}:{node.lineno}: torch.{node.func.attr}")
    return missing


def test_every_tensor_factory_in_autopar_names_its_device():
    missing = _factory_calls_without_device()
    assert not missing, ("tensors made on the default device (give device=, the value's it serves or "
                         "autopar.runtime.devices.current()):\n  " + "\n  ".join(missing))


def test_the_static_check_sees_a_factory_without_a_device(tmp_path):
    (tmp_path / "autopar").mkdir()
    (tmp_path / "autopar" / "bad.py").write_text("import torch\nx = torch.empty(3, dtype=torch.float32)\n"
                                                 "y = torch.zeros_like(x)\nz = torch.ones(2, device=x.device)\n")
    assert _factory_calls_without_device(tmp_path / "autopar") == ["autopar/bad.py:2: torch.empty"]


def test_the_rank_device_is_its_parameters_not_the_default():
    held = torch.nn.Linear(2, 2)
    stand_in = torch.nn.Parameter(torch.empty(0, device="cpu"))
    planned = torch.nn.Parameter(torch.empty(3, device="meta"))
    with torch.device("meta"):
        assert devices.rank_device([stand_in, planned, *held.parameters()]) == torch.device("cpu")
        assert devices.rank_device([stand_in], (torch.ones(1, device="cpu"),)) == torch.device("cpu")
        assert devices.current() == torch.device("cpu")
        with devices.use_device(torch.device("cpu")):
            assert devices.current() == torch.device("cpu")
    # point-to-point under gloo goes through host memory; CPU values stay where they are
    assert devices.wire_device(torch.device("cpu")) == torch.device("cpu")


META = {"dtype": "float64", "default_device": "meta", "steps": 1}
CASES = [
    ("transformer", {"data": 2, "tensor": 2}, META),                               # data + Megatron
    ("transformer", {"data": 4, "zero": 1}, META),                                 # ZeRO's refresh flag
    ("transformer", {"data": 4, "subgrids": 2, "csub": True}, META),               # cSub placeholders
    ("transformer", {"pipeline": 2, "tensor": 2, "microbatches": 2}, META),        # receive buffers, all-gather
]
# AxoNN's grid and Bian's cube make their buffers with new_empty and empty_like of the values
# they serve (the static check above)

_LAUNCHED = shared_ranks.register(4, __name__, equivalence_job, (CASES,), timeout_s=600)


def _check(report):
    assert report["output"][1] < 1e-12, report   # float64: collectives reorder sums, nothing else
    assert report["loss"][1] < 1e-12, report
    assert report["grad"][1] < 1e-12, report
    assert report["grad_norm"][1] < 1e-12, report
    assert report["param"][0] < 1e-12, report


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(s) for _, s, _ in CASES])
def test_every_family_runs_with_a_default_device_that_is_not_its_own(index):
    for rank_reports in _LAUNCHED():
        _check(rank_reports[index])
