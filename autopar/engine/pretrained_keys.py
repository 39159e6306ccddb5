"""Which checkpoint key feeds which state-dict entry (:mod:`autopar.engine.pretrained`).

Loading matches each key of a safetensors checkpoint with an entry of the model's state
dict, in this order:

1. the same name;
2. the key renamed as ``transformers``' ``from_pretrained`` renames it, for a
   ``PreTrainedModel``: the ``key_mapping`` given (regular expression -> replacement),
   the renamings of the model's conversion mapping (``transformers.conversion_mapping``:
   per model type or class, and the legacy ``LayerNorm.gamma``/``beta`` ->
   ``weight``/``bias`` and ``weight_g``/``weight_v``), then the model's base-model prefix
   added or removed where that gives a name of the model (a ``LlamaForCausalLM`` loading
   what a ``LlamaModel`` saved, and the reverse); for any other model, the
   ``key_mapping`` only;
3. for an entry still without a key, the key of another name of the same parameter (a
   tied ``lm_head.weight`` saved as ``model.embed_tokens.weight`` only).

A key that ``transformers`` would convert rather than rename (a ``WeightConverter``:
experts stacked into one tensor, fused projections split) is not loaded and is named
in the error. Keys and entries a ``PreTrainedModel`` lists in
``_keys_to_ignore_on_load_unexpected`` / ``_keys_to_ignore_on_load_missing`` are
ignored, as ``from_pretrained`` ignores them.

Saving keeps one name per tied parameter: for a ``PreTrainedModel`` the name that is
not a key of its ``all_tied_weights_keys`` (``_tied_weights_keys``), the name
``from_pretrained`` expects in the file; otherwise the first.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch.nn as nn


@dataclass
class KeyMatch:
    """``sources``: state-dict name -> checkpoint key it is read from; the model's names no
    key feeds (``missing``), the keys that feed none (``unexpected``), and the keys
    ``transformers`` would convert (``converted``: key -> the name it would feed)."""

    sources: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    converted: dict[str, str] = field(default_factory=dict)


def match_keys(model: nn.Module, names: list[str], tied: dict[str, tuple[str, ...]], stored: Iterable[str],
               key_mapping: Optional[dict[str, str]] = None) -> KeyMatch:
    """Match the checkpoint's ``stored`` keys with the state-dict ``names`` of ``model``
    (module docstring); ``tied``: name -> every name of its parameter."""
    wanted = set(names)
    stored = list(stored)
    out = KeyMatch()
    found: dict[str, str] = {k: k for k in stored if k in wanted}  # name -> key, exact first
    rename = renamer(model, names, key_mapping)
    ignore_unexpected = _patterns(model, "_keys_to_ignore_on_load_unexpected")
    for key in stored:
        if key in wanted:
            continue
        name, converted = rename(key)
        if converted:
            out.converted[key] = name
        elif name in wanted and name not in found:
            found[name] = key
        elif not any(p.search(key) for p in ignore_unexpected):
            out.unexpected.append(key)
    ignore_missing = _patterns(model, "_keys_to_ignore_on_load_missing")
    for name in names:
        key = found.get(name) or next((found[n] for n in tied.get(name, ()) if n in found), None)
        if key is not None:
            out.sources[name] = key
        elif not any(p.search(name) for p in ignore_missing):
            out.missing.append(name)
    return out


# ---------------------------------------------------------------------------- renaming
def renamer(model: nn.Module, names: list[str], key_mapping: Optional[dict[str, str]] = None
            ) -> Callable[[str], tuple[str, bool]]:
    """``key -> (name, converted)``: the state-dict name ``from_pretrained`` would load a
    checkpoint key into, and whether it would convert the tensor on the way (module
    docstring). Not a ``PreTrainedModel``: the ``key_mapping`` only."""
    if not is_pretrained_model(model):
        return lambda key: (_apply_mapping(key, key_mapping), False)
    found = _transformers_renamer(model, names, key_mapping)
    return found if found is not None else _fallback_renamer(model, names, key_mapping)


def is_pretrained_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``transformers.PreTrainedModel`` (without importing
    ``transformers`` when the user did not)."""
    transformers = sys.modules.get("transformers")
    base = getattr(transformers, "PreTrainedModel", None) if transformers is not None else None
    return base is not None and isinstance(model, base)


def _transformers_renamer(model, names: list[str], key_mapping) -> Optional[Callable[[str], tuple[str, bool]]]:
    """The renaming of ``from_pretrained`` itself (transformers 5: its conversion mapping
    and ``rename_source_key``); None where this ``transformers`` has neither."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        return None
    conversions = get_model_conversion_mapping(model, key_mapping)
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    present = dict.fromkeys(names, True)
    prefix = getattr(model, "base_model_prefix", "") or None

    def rename(key: str) -> tuple[str, bool]:
        name, pattern = rename_source_key(key, renamings, converters, prefix, present)
        return name, pattern is not None
    return rename


_LEGACY = ((re.compile(r"LayerNorm\.gamma$"), "LayerNorm.weight"), (re.compile(r"LayerNorm\.beta$"), "LayerNorm.bias"),
           (re.compile(r"\.weight_g$"), ".parametrizations.weight.original0"),
           (re.compile(r"\.weight_v$"), ".parametrizations.weight.original1"))


def _fallback_renamer(model, names: list[str], key_mapping) -> Callable[[str], tuple[str, bool]]:
    """transformers 4's renaming: the ``key_mapping`` (else the model's
    ``_checkpoint_conversion_mapping``), the legacy renames, the base-model prefix."""
    mapping = key_mapping if key_mapping is not None else getattr(model, "_checkpoint_conversion_mapping", None)
    present = set(names)
    prefix = getattr(model, "base_model_prefix", "") or ""

    def rename(key: str) -> tuple[str, bool]:
        name = _apply_mapping(key, mapping, first_only=True)
        for pattern, replacement in _LEGACY:
            name = pattern.sub(replacement, name)
        if prefix and name.startswith(prefix + ".") and name[len(prefix) + 1:] in present:
            name = name[len(prefix) + 1:]
        elif prefix and f"{prefix}.{name}" in present:
            name = f"{prefix}.{name}"
        return name, False
    return rename


def _apply_mapping(key: str, mapping: Optional[dict[str, str]], first_only: bool = False) -> str:
    """``key`` through each ``pattern -> replacement`` of ``mapping`` (regular expressions)."""
    for pattern, replacement in (mapping or {}).items():
        key, count = re.subn(pattern, replacement, key)
        if count and first_only:
            break
    return key


def _patterns(model, attribute: str) -> list[re.Pattern]:
    values = getattr(model, attribute, None) if is_pretrained_model(model) else None
    return [re.compile(p) for p in (values or ())]


# ---------------------------------------------------------------------------- saving
def saved_names(model: nn.Module, names: list[str], tied: dict[str, tuple[str, ...]]) -> list[str]:
    """The state-dict ``names`` to write, in their order: every name of an untied entry,
    and one of each tied parameter's (module docstring)."""
    targets = _tie_targets(model)
    present = set(names)
    out = []
    for name in names:
        group = [n for n in tied.get(name, (name,)) if n in present] or [name]
        keep = next((n for n in group if not targets(n)), group[0])
        if keep == name:
            out.append(name)
    return out


def _tie_targets(model) -> Callable[[str], bool]:
    """Whether a name is one ``transformers`` ties to another on loading (absent from the
    files ``save_pretrained`` writes)."""
    if not is_pretrained_model(model):
        return lambda name: False
    expanded = getattr(model, "all_tied_weights_keys", None)
    if isinstance(expanded, dict):
        return lambda name: name in expanded
    declared = getattr(model, "_tied_weights_keys", None) or ()
    patterns = [re.compile(p) for p in (declared.keys() if isinstance(declared, dict) else declared)]
    return lambda name: any(p.search(name) for p in patterns)
