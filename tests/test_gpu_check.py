"""``make gpu-check`` (benchmarks/gpu_check.py): without CUDA it says what it would run and
exits 0; with a device, a step that fails or outruns its limit does not stop the others,
and every step's status, output and results land in the output directory."""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gpu_check  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


def test_without_cuda_it_prints_the_steps_and_exits_0(tmp_path):
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert "no CUDA device" in done.stdout
    for step in ("test-gpu", "fusion", "compile-overhead", "breakdown-gpt2-124m", "breakdown-llama-1b", "calibrate",
                 "predict", "meta-init", "torch-compile", "peers"):
        assert f"  {step} " in done.stdout
    assert "bench_peers.py --device cuda" in done.stdout and "bench_torch_compile.py --device cuda" in done.stdout
    assert "bench_compile_overhead.py --device cuda --dtype bf16 --fusion" in done.stdout
    assert "calibrate --world 1 --backend nccl --dtype bf16 --base h100" in done.stdout
    assert not out.exists()
    # two calls of at most 10 minutes each (a lent device's command limit): the kernels,
    # compile overhead and calibration, then torch.compile and the peers (--only)
    limits = {s.name: s.limit_s for s in gpu_check.steps(sys.executable, str(out), str(tmp_path))}
    peers = limits.pop("torch-compile") + limits.pop("peers")
    assert sum(limits.values()) <= 8 * 60 and peers <= 10 * 60


def test_unknown_step_is_refused(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path), "--only", "fusoin"]) == 2
    assert "unknown step(s) ['fusoin']" in capsys.readouterr().out


def test_a_failed_or_slow_step_does_not_stop_the_others(tmp_path, monkeypatch):
    """Three steps on a pretend device: one fails, one outruns its limit (its child process
    killed with it), one writes results; all three are recorded, the run returns 1."""
    pidfile = tmp_path / "child.pid"
    sleeper = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
               f"time.sleep(60)']); open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)")

    def steps(python, out, tmp):
        return [gpu_check.Step("fails", 30, [python, "-c", "import sys; print('broken'); sys.exit(3)"]),
                gpu_check.Step("slow", 2, [python, "-c", sleeper]),
                gpu_check.Step("works", 30, [python, "-c", f"import json; json.dump([{{'x': 1}}], "
                                                           f"open({os.path.join(tmp, 'w.json')!r}, 'w'))"],
                               json_name="w.json")]

    monkeypatch.setattr(gpu_check, "steps", steps)
    monkeypatch.setattr(gpu_check, "environment", lambda python: {"cuda_available": True, "device": "pretend"})
    out = tmp_path / "out"
    assert gpu_check.check(str(out), None, dry_run=False) == 1
    with open(out / "gpu-check.json") as f:
        report = json.load(f)
    got = {s["name"]: s for s in report["steps"]}
    assert [s["name"] for s in report["steps"]] == ["fails", "slow", "works"]
    assert got["fails"]["status"] == "failed" and got["fails"]["returncode"] == 3 and "broken" in got["fails"]["output"]
    assert got["slow"]["status"] == "timed out" and got["slow"]["returncode"] is not None
    assert got["works"]["status"] == "passed" and got["works"]["result"] == [{"x": 1}]
    child = int(pidfile.read_text())
    for _ in range(50):   # the step's own children went with it (a zombie awaiting its reaper counts as gone)
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)
    text = (out / "gpu-check.txt").read_text()
    assert "fails: failed" in text and "slow: timed out" in text and "works: passed" in text
    assert sorted(os.listdir(out)) == ["gpu-check.json", "gpu-check.txt"]
