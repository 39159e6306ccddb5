"""This machine's calibrated profile, cached: what ``compile`` prices with by default.

``autopar calibrate`` stores the :class:`~autopar.cost.hardware.Hardware` it fits in a
per-user cache, one file per backend (:func:`profile_path`: ``$AUTOPAR_CACHE_DIR``, else
``$XDG_CACHE_HOME/autopar``, else ``~/.cache/autopar``, then ``profiles/<backend>.json``),
beside the facts of the machine it measured (:func:`machine_facts`: host name,
processor, CPU cores, accelerator, torch version). ``autopar.plan`` / ``compile`` /
``autopar plan`` without ``hardware=`` resolve through :func:`resolve`: the cached
profile of this machine's backend when its facts match this machine's, otherwise the
``cpu-gloo`` preset, and the plan's header says which (``Plan.hardware_source``) and,
when falling back, why (no profile yet, or one measured on another machine: a changed
host, processor, core count, accelerator or torch version invalidates it; ``autopar
calibrate`` writes a new one). An explicit preset name, JSON file or :class:`Hardware`
is used as given.

    >>> import os, tempfile
    >>> os.environ["AUTOPAR_CACHE_DIR"] = tempfile.mkdtemp()
    >>> hw, source = resolve(None)
    >>> hw.name, source.startswith("default preset")
    ('cpu-gloo', True)
"""
from __future__ import annotations

import json
import logging
import os
import platform
import socket
from pathlib import Path

from autopar.cost.hardware import PRESETS, Hardware, get_hardware

log = logging.getLogger(__name__)

CACHE_ENV = "AUTOPAR_CACHE_DIR"
FALLBACK = "cpu-gloo"
"""The preset used when this machine has no calibrated profile."""


def cache_dir() -> Path:
    """``$AUTOPAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/autopar``, else ``~/.cache/autopar``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autopar"


def default_backend() -> str:
    """The backend ``compile`` runs on here: nccl where CUDA is available, else gloo."""
    import torch
    return "nccl" if torch.cuda.is_available() else "gloo"


def profile_path(backend: str | None = None) -> Path:
    """Where this machine's calibrated profile for ``backend`` is cached."""
    return cache_dir() / "profiles" / f"{backend or default_backend()}.json"


def processor() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict[str, object]:
    """What a profile is valid for: host name, processor, CPU cores, accelerators (names
    and count, "none" without) and the torch version; any change invalidates it."""
    import torch
    accelerator = "none"
    if torch.cuda.is_available():
        accelerator = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return {"host": socket.gethostname(), "processor": processor(), "cpu_cores": os.cpu_count() or 0,
            "accelerator": accelerator, "torch": torch.__version__}


def save_profile(hardware: Hardware, backend: str) -> Path:
    """Cache ``hardware`` as this machine's profile for ``backend``; its path."""
    path = profile_path(backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"machine": machine_facts(), "backend": backend, "hardware": hardware.to_json()}, f, indent=2,
                  sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)  # a rank reading it meanwhile sees the old file or the new, whole
    return path


def load_profile(backend: str | None = None) -> tuple[Hardware | None, str]:
    """(this machine's cached profile for ``backend`` or None, why not when None)."""
    path = profile_path(backend)
    if not path.is_file():
        return None, "no calibrated profile of this machine"
    try:
        with open(path) as f:
            saved = json.load(f)
        hardware = Hardware.from_json(saved["hardware"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"the profile at {path} cannot be read ({type(e).__name__}: {e})"
    here = machine_facts()
    changed = [f"{k} {saved['machine'].get(k)!r} -> {v!r}" for k, v in here.items()
               if saved.get("machine", {}).get(k) != v]
    if changed:
        return None, f"the profile at {path} was measured on another machine ({'; '.join(changed)})"
    return hardware, ""


_said: set[str] = set()


def _say_once(message: str) -> None:
    """Warn once per process (on rank 0 where ranks are running) and log it."""
    log.info(message)
    if message in _said:
        return
    _said.add(message)
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        import warnings
        warnings.warn(message, stacklevel=5)


def resolve(spec: "str | Hardware | os.PathLike | None") -> tuple[Hardware, str]:
    """(the hardware ``spec`` names, where it came from in words). ``None``: this
    machine's cached calibrated profile, else the ``cpu-gloo`` preset with the reason."""
    if spec is not None:
        hw = get_hardware(spec)
        if isinstance(spec, Hardware):
            return hw, "given"
        key = os.fspath(spec)
        return hw, "preset" if key in PRESETS else f"file {key}"
    hw, why = load_profile()
    if hw is not None:
        return hw, f"this machine's calibrated profile, {profile_path()}"
    _say_once(f"autopar: {why}; pricing plans with the {FALLBACK!r} preset (`autopar calibrate` measures this "
              f"machine and caches its profile for every later compile)")
    return PRESETS[FALLBACK], f"default preset; {why}"


__all__ = ["CACHE_ENV", "FALLBACK", "cache_dir", "default_backend", "load_profile", "machine_facts",
           "profile_path", "resolve", "save_profile"]
