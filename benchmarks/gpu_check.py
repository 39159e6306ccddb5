"""``make gpu-check``: every GPU test and benchmark in one command, each step under its own
time limit, every result written under one directory as JSON and text.

The steps, in order (docs/benchmarks.md §13 says what each measures and the latest figures):

1. ``test-gpu``: ``pytest -m gpu tests/test_gpu.py`` with ``TRITON_INTERPRET=0`` (the
   generated kernels compiled for the GPU, not interpreted);
2. ``fusion``: ``bench_fusion.py`` at its real shapes, few steps: the seven chains against
   eager and ``torch.compile``, bf16 and fp32, forward and forward + backward, each as a
   share of the measured copy bandwidth;
3. ``compile-overhead``: ``bench_compile_overhead.py --device cuda --dtype bf16 --fusion``
   on GPT-2 124M and a 1.1B Llama (eager, autopar unfused, autopar fused), then
   ``--breakdown`` of each (autopar's Python per step);
4. ``calibrate``: ``autopar calibrate --world 1 --backend nccl --dtype bf16 --base h100``:
   the one GPU's compute figures beside the ``h100`` preset (one rank times no collective);
5. ``predict``: the plans of step 3's models on one rank, priced with the ``h100`` preset
   and with step 4's profile, beside step 3's measured step;
6. ``meta-init``: a model compiled from the meta device and initialised on the GPU, its
   peak ``torch.cuda.max_memory_allocated`` beside the plan's memory per rank (skipped,
   saying why, where ``ParallelModule`` has no ``init_weights``);
7. ``torch-compile``: ``bench_torch_compile.py --device cuda``: autopar's rank programs
   with and without ``torch_compile=True`` (Inductor's Triton kernels), NCCL ranks, one per
   GPU up to two (on one GPU: the whole model as one program);
8. ``peers``: ``bench_peers.py --device cuda``: every entry with at most as many ranks as
   the machine has GPUs, autopar against torchtitan (FSDP2, TP + SP, compiled) and
   torch.pipelining over NCCL; on one GPU, both compiled on one rank. Needs torchtitan
   (``make peers``; its wheel in ``.whl/`` on a machine without a registry).

A step that fails or runs past its limit does not stop the others. The run records the
device, driver, CUDA, torch, Triton and Python versions. It writes at most four files
(what a remote run can bring back): ``gpu-check.json`` (environment, every step's
command, status, seconds, parsed results and the tail of its output), ``gpu-check.txt``
(the same as text, with each step's whole output), ``test-gpu.xml`` (JUnit) and
``calibrated-gpu.json`` (the profile), under ``$OUT`` when it is set, else ``gpu-results/``.

It runs with the interpreter it is started with (``make gpu-check PYTHON=python3`` on a
machine whose Python already has torch with CUDA): autopar is imported from the source
tree. Wheels in ``.whl/`` (``make gpu-wheels`` downloads what the GPU machine's Python
lacks) are installed into a private directory first. Without CUDA it prints what it
would run and exits 0.

    python benchmarks/gpu_check.py [--out DIR] [--only STEP ...] [--dry-run]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_CASES = ["gpt2-124m", "llama-1b"]


@dataclasses.dataclass
class Step:
    name: str
    limit_s: int
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    json_name: str | None = None   # the step's --json file, read back into gpu-check.json
    keep: str | None = None        # a file the step writes that is kept in the output directory


def steps(python: str, out: str, tmp: str) -> list[Step]:
    """The steps with their limits (seconds): 8 minutes for the first eight on an H100, under 4
    for ``torch-compile`` and ``peers`` (two calls of a device with a 10-minute command limit)."""
    bench = os.path.join(REPO_ROOT, "benchmarks")
    me = os.path.join(bench, "gpu_check.py")
    return [
        Step("test-gpu", 110, [python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                               "--junitxml", os.path.join(out, "test-gpu.xml"), "tests/test_gpu.py"],
             env={"TRITON_INTERPRET": "0"}, keep="test-gpu.xml"),
        Step("fusion", 140, [python, os.path.join(bench, "bench_fusion.py"), "--steps", "10", "--warmup", "3",
                             "--json", os.path.join(tmp, "fusion.json")],
             env={"TRITON_INTERPRET": "0"}, json_name="fusion.json"),
        Step("compile-overhead", 90, [python, os.path.join(bench, "bench_compile_overhead.py"), "--device", "cuda",
                                      "--dtype", "bf16", "--fusion", "--steps", "20", "--warmup", "5", "--cases",
                                      *GPU_CASES, "--json", os.path.join(tmp, "compile-overhead.json")],
             env={"TRITON_INTERPRET": "0"}, json_name="compile-overhead.json"),
        *(Step(f"breakdown-{case}", limit, [python, os.path.join(bench, "bench_compile_overhead.py"), "--device",
                                             "cuda", "--dtype", "bf16", "--breakdown", case, "--breakdown-steps",
                                             "40"])
          for case, limit in zip(GPU_CASES, (20, 25))),
        Step("calibrate", 35, [python, "-m", "autopar.cli", "calibrate", "--world", "1", "--backend", "nccl",
                               "--dtype", "bf16", "--base", "h100", "--quick", "--no-cache", "--name",
                               "calibrated-gpu", "--out", os.path.join(out, "calibrated-gpu.json")],
             keep="calibrated-gpu.json"),
        Step("predict", 30, [python, me, "--predict", os.path.join(tmp, "predict.json"), "--profile",
                             os.path.join(out, "calibrated-gpu.json")], json_name="predict.json"),
        Step("meta-init", 30, [python, me, "--meta-init", os.path.join(tmp, "meta-init.json")],
             json_name="meta-init.json"),
        Step("torch-compile", 100, [python, os.path.join(bench, "bench_torch_compile.py"), "--device", "cuda",
                                    "--steps", "10", "--json", os.path.join(tmp, "torch-compile.json")],
             env={"TRITON_INTERPRET": "0"}, json_name="torch-compile.json"),
        Step("peers", 120, [python, os.path.join(bench, "bench_peers.py"), "--device", "cuda", "--steps", "10",
                            "--warmup", "3", "--json", os.path.join(tmp, "peers.json")],
             env={"TRITON_INTERPRET": "0"}, json_name="peers.json"),
    ]


def environment(python: str) -> dict:
    """Device, driver, CUDA, torch, Triton, transformers and Python versions of ``python``."""
    probe = ("import json, platform, torch\n"
             "info = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
             "        'cuda_available': torch.cuda.is_available()}\n"
             "if torch.cuda.is_available():\n"
             "    p = torch.cuda.get_device_properties(0)\n"
             "    info.update(device=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),\n"
             "                memory_gib=round(p.total_memory / 2**30, 1), capability=f'{p.major}.{p.minor}',\n"
             "                nccl='.'.join(map(str, torch.cuda.nccl.version())))\n"
             "for name in ('triton', 'transformers'):\n"
             "    try:\n"
             "        info[name] = __import__(name).__version__\n"
             "    except Exception as e:\n"
             "        info[name] = f'not importable: {e}'\n"
             "print(json.dumps(info))\n")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        if done.returncode != 0:  # an interpreter without torch: say so, run nothing
            raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
        info = json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as e:
        info = {"python": platform.python_version(), "cuda_available": False, "error": f"{type(e).__name__}: {e}"}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run([smi, "--query-gpu=driver_version,name", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30)
            info["driver"] = done.stdout.strip().splitlines()[0].split(",")[0].strip()
        except Exception as e:
            info["driver"] = f"unknown: {e}"
    info["host"] = platform.node()
    info["cpus"] = os.cpu_count()
    return info


def run_step(step: Step, env: dict[str, str]) -> dict:
    """Run one step in its own process group under its limit; what it did, as a dict."""
    started = time.perf_counter()
    proc = subprocess.Popen(step.argv, cwd=REPO_ROOT, env={**env, **step.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=step.limit_s)
        status = "passed" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = "timed out"
    return {"name": step.name, "command": " ".join(step.argv), "limit_s": step.limit_s,
            "seconds": round(time.perf_counter() - started, 1), "status": status, "returncode": proc.returncode,
            "output": output}


def install_wheels(python: str, env: dict[str, str], tmp: str) -> str | None:
    """Install the wheels of ``.whl/`` (if any) into a private directory put first on
    PYTHONPATH; a line saying what was done."""
    wheels = os.path.join(REPO_ROOT, ".whl")
    found = sorted(f for f in os.listdir(wheels) if f.endswith(".whl")) if os.path.isdir(wheels) else []
    if not found:
        return None
    site = os.path.join(tmp, "site")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--target", site, *(os.path.join(wheels, f) for f in found)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"wheels in .whl/ not installed: {done.stderr.strip()[-500:]}"
    env["PYTHONPATH"] = os.pathsep.join([site] + env["PYTHONPATH"].split(os.pathsep))
    return f"installed from .whl/: {', '.join(found)}"


def report_text(env_info: dict, results: list[dict], notes: list[str]) -> str:
    lines = ["autopar gpu-check", "", "environment:"]
    lines += [f"  {k}: {v}" for k, v in env_info.items()]
    lines += [f"  {n}" for n in notes]
    lines += ["", f"{'step':<22} {'status':<10} {'seconds':>8} {'limit':>6}"]
    lines += [f"{r['name']:<22} {r['status']:<10} {r['seconds']:>8.1f} {r['limit_s']:>6}" for r in results]
    for r in results:
        lines += ["", "=" * 100, f"{r['name']}: {r['status']} in {r['seconds']} s (limit {r['limit_s']} s)",
                  f"$ {r['command']}", "", r["output"].rstrip()]
    return "\n".join(lines) + "\n"


def check(out: str, only: list[str] | None, dry_run: bool) -> int:
    python = sys.executable
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO_ROOT, env.get("PYTHONPATH", "")] if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory(prefix="autopar-gpu-check-") as tmp:
        plan = [s for s in steps(python, out, tmp) if not only or s.name in only]
        unknown = sorted(set(only or ()) - {s.name for s in steps(python, out, tmp)})
        if unknown:
            print(f"gpu-check: unknown step(s) {unknown}; the steps are {[s.name for s in steps(python, out, tmp)]}")
            return 2
        info = environment(python) if not dry_run else {"cuda_available": False}
        if dry_run or not info.get("cuda_available"):
            why = "--dry-run" if dry_run else f"no CUDA device for {python} ({info.get('error') or 'torch ' + str(info.get('torch')) + ', CUDA ' + str(info.get('cuda'))})"
            print(f"gpu-check: {why}; on a machine with a GPU it would run, in order "
                  f"({sum(s.limit_s for s in plan)} s of limits together), writing under {out}:")
            for s in plan:
                print(f"  {s.name:<22} limit {s.limit_s:>4} s  "
                      f"{' '.join(f'{k}={v}' for k, v in s.env.items())}{' ' if s.env else ''}{' '.join(s.argv)}")
            return 0
        os.makedirs(out, exist_ok=True)
        notes = [n for n in [install_wheels(python, env, tmp)] if n]
        print(f"gpu-check on {info.get('device')} (driver {info.get('driver')}, CUDA {info.get('cuda')}, torch "
              f"{info.get('torch')}, Triton {info.get('triton')}), writing under {out}", flush=True)
        results = []
        for step in plan:
            result = run_step(step, env)
            if step.json_name and os.path.exists(os.path.join(tmp, step.json_name)):
                with open(os.path.join(tmp, step.json_name)) as f:
                    result["result"] = json.load(f)
            if step.keep and os.path.exists(os.path.join(out, step.keep)):
                result["kept"] = step.keep
            results.append(result)
            print(f"  {step.name:<22} {result['status']:<10} {result['seconds']:>6.1f} s", flush=True)
            _write(out, info, results, notes)   # after every step: a run cut short keeps what it did
        failed = [r["name"] for r in results if r["status"] != "passed"]
        print(f"gpu-check: {len(results) - len(failed)} of {len(results)} steps passed"
              + (f"; not passed: {', '.join(failed)}" if failed else "") + f"; see {out}/gpu-check.txt")
        return 1 if failed else 0


def _write(out: str, info: dict, results: list[dict], notes: list[str]) -> None:
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump({"environment": info, "notes": notes,
                   "steps": [{k: (v[-4000:] if k == "output" else v) for k, v in r.items()} for r in results]},
                  f, indent=2, default=str)
    with open(os.path.join(out, "gpu-check.txt"), "w") as f:
        f.write(report_text(info, results, notes))


# ---------------------------------------------------------------- steps run by this file


def _meta_model(case: str):
    """A one-GPU benchmark case's model, input, target and loss on the meta device, bf16."""
    import torch
    sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
    from bench_compile_overhead import gpu_case
    with torch.device("meta"):
        model, x, y, loss_fn = gpu_case(case)
    return model.to(torch.bfloat16), x.to("meta"), y.to("meta"), loss_fn


def predict(path: str, profile: str) -> None:
    """The one-rank plans of :data:`GPU_CASES` priced on the ``h100`` preset and on the
    calibrated profile (where step 4 wrote one): step time and memory per rank."""
    import autopar
    rows = []
    for case in GPU_CASES:
        model, x, y, loss_fn = _meta_model(case)
        for hardware in ["h100"] + ([profile] if os.path.exists(profile) else []):
            plan = autopar.plan(model, 1, (x,), loss_fn, {"data": 1}, example_target=y, hardware=hardware)
            rows.append({"case": case, "hardware": os.path.basename(hardware), "predicted_step_ms": plan.step_s * 1e3,
                         "predicted_memory_gib": plan.total.memory_bytes / 2**30})
            print(f"{case:<10} {os.path.basename(hardware):<22} predicted step {plan.step_s * 1e3:8.2f} ms, "
                  f"memory {plan.total.memory_bytes / 2**30:6.2f} GiB")
    with open(path, "w") as f:
        json.dump(rows, f, indent=2)


def meta_init(path: str) -> None:
    """Compile a model built on the meta device and initialise it on the GPU; its peak
    allocated memory beside the plan's prediction."""
    import torch
    import autopar
    if not hasattr(autopar.ParallelModule, "init_weights"):
        result = {"skipped": "ParallelModule has no init_weights: compiling from the meta device is not available"}
        print(result["skipped"])
    else:
        model, x, y, loss_fn = _meta_model("llama-1b")
        x, y = x.to("cuda"), y.to("cuda")
        torch.cuda.reset_peak_memory_stats()
        pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=loss_fn, example_target=y,
                             strategy={"data": 1})
        pm.init_weights(0)
        pm.step(x, target=y)
        torch.cuda.synchronize()
        result = {"case": "llama-1b", "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                  "predicted_gib": pm.plan.total.memory_bytes / 2**30}
        print(result)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO_ROOT, "gpu-results"),
                   help="output directory (default $OUT, else gpu-results/)")
    p.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps (a re-run of those that failed)")
    p.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    p.add_argument("--predict", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--profile", default="", help=argparse.SUPPRESS)
    p.add_argument("--meta-init", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.predict:
        predict(args.predict, args.profile)
        return 0
    if args.meta_init:
        meta_init(args.meta_init)
        return 0
    return check(os.path.abspath(args.out), args.only, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
