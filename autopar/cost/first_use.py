"""This machine measured by ``compile`` on first use, when no profile is cached.

Without ``hardware=``, ``compile`` prices plans with this machine's calibrated profile
(:mod:`autopar.cost.profiles`). Where there is none yet, the ``cpu-gloo`` preset's figures
are another machine's, and they leave out what a step pays on a host besides FLOPs and
bytes (the per-op, per-collective and per-step overheads of docs/planner.md
"Overheads"): on the 2-core development machine it priced a small Llama's step 8-10×
faster than measured, and ranked a 2-stage pipeline ahead of plain data parallelism that
ran 1.2× faster. So the first ``compile`` on a machine measures it on the ranks it
already runs (:func:`calibration_job` at its ``"probe"`` settings: a few matmuls, a
copy, each collective at five sizes, the runtime's per-op, per-call, per-step and
per-pipeline-action costs; a few seconds), every rank fits the same gathered reports
(:func:`autopar.cost.calibration.fit_reports`), and the first rank caches the profile for
every later compile and ``autopar plan`` on this machine. ``autopar calibrate`` measures
more points for longer and replaces it.

``AUTOPAR_FIRST_USE_CALIBRATION=0`` turns this off (the preset is used, said in a
warning): the test suite does, so that its plans do not depend on the machine.
"""
from __future__ import annotations

import logging
import os
import time
import warnings

import torch
import torch.distributed as dist

from autopar.cost import profiles
from autopar.cost.calibrate_measure import calibration_job
from autopar.cost.calibration import fit_reports
from autopar.cost.hardware import Hardware

log = logging.getLogger(__name__)

ENV = "AUTOPAR_FIRST_USE_CALIBRATION"


def enabled() -> bool:
    """Whether ``compile`` measures this machine when no profile is cached (not with
    ``AUTOPAR_FIRST_USE_CALIBRATION=0``)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def needed() -> bool:
    """On every rank of the default group: whether to measure, as its first rank decides
    for all (as :func:`autopar.agreement.agreed_hardware` does): the measurement is on,
    the group runs the backend whose profile ``compile`` reads, and none is cached."""
    decide = [None]
    if dist.get_rank() == 0:
        decide = [enabled() and str(dist.get_backend()) == profiles.default_backend()
                  and profiles.load_profile()[0] is None]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(decide, src=0)
    return bool(decide[0])


def calibrate_here(compile_fn, plan_fn) -> tuple[Hardware, str]:
    """Measure this machine on every rank of the default group (all must call), fit, cache
    the profile (first rank), and return it with where it came from in words.
    ``compile_fn``, ``plan_fn``: ``autopar.compile`` and ``autopar.plan``, which compile
    and price the runtime's own cases (passed in: ``compile`` is what calls this)."""
    backend = str(dist.get_backend())
    world, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        print(f"autopar: no calibrated profile of this machine; measuring it on the {world} rank(s) now "
              f"(a few seconds, once; set {ENV}=0 to price with the cpu-gloo preset instead)", flush=True)
    started = time.perf_counter()
    rng = torch.random.get_rng_state()  # the runtime's cases seed the generator: the user's draws stay theirs
    try:
        with warnings.catch_warnings():  # torch's deprecation notes on the collectives it times
            warnings.simplefilter("ignore", FutureWarning)
            report = calibration_job(backend, "probe", "bf16" if backend == "nccl" else "fp32", compile_fn)
    finally:
        torch.random.set_rng_state(rng)
    reports: list = [None] * world
    dist.all_gather_object(reports, report)
    calibration = fit_reports(reports, world, backend=backend, quick="probe", name=f"first-use-{backend}-{world}",
                              seconds=time.perf_counter() - started, plan_fn=plan_fn)
    hw = calibration.hardware
    path = profiles.profile_path(backend)
    if rank == 0:
        try:
            path = profiles.save_profile(hw, backend)
        except OSError as e:  # a read-only home: priced with it all the same, measured again next time
            log.warning("autopar: could not cache the measured profile at %s (%s)", path, e)
        print(f"autopar: measured in {time.perf_counter() - started:.1f} s; cached at {path} for every later "
              f"compile (`autopar calibrate` measures it more thoroughly)", flush=True)
    return hw, f"this machine's profile, measured on first use, {path}"


__all__ = ["ENV", "calibrate_here", "enabled", "needed"]
