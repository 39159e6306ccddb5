"""Plan a Hugging Face model from its configuration alone: no weights, no download.

    plan = autopar.plan_config("config.json", world=512, batch=(1024, 4096), hardware="h100")
    plan = autopar.plan_config("llama", world=8, batch="8x2048",
                               overrides={"hidden_size": 4096, "num_hidden_layers": 32})

The configuration is a ``config.json`` path (or the directory holding one), a
``transformers.PretrainedConfig``, or a model type (``"llama"``, ``"mixtral"``, …: the
keys of ``transformers.CONFIG_MAPPING``) with ``overrides`` on its defaults. The model is
built with ``transformers``' own class for causal language modelling
(``AutoModelForCausalLM``) on the meta device, in ``dtype`` (default: the
configuration's ``dtype`` / ``torch_dtype``, else bfloat16), and planned on a global
batch of ``batch = (sequences, tokens)`` token ids with the model's own loss (``labels``
= the ids), as ``model(input_ids=ids, labels=ids)`` trains. ``autopar plan --hf`` is the
same from the command line (:mod:`autopar.cli`).
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import torch

from autopar.api import plan as plan_model


def parse_batch(text: str | tuple | list) -> tuple[int, int]:
    """``"512x8192"`` or ``(512, 8192)`` → (sequences, tokens per sequence)."""
    if isinstance(text, (tuple, list)):
        parts = list(text)
    else:
        parts = str(text).lower().replace("×", "x").split("x")
    try:
        sequences, tokens = (int(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"batch {text!r}: give SEQUENCESxTOKENS, e.g. 512x8192 (the global batch of sequences "
                         f"and the tokens of each)") from None
    if sequences < 1 or tokens < 1:
        raise ValueError(f"batch {text!r}: sequences and tokens must be at least 1")
    return sequences, tokens


def parse_overrides(text: str) -> dict[str, Any]:
    """``"hidden_size=8192,num_hidden_layers=80,tie_word_embeddings=false"`` → a dict,
    each value read as JSON where it parses (numbers, true/false, lists, objects), else a
    string. Commas inside brackets, braces and quotes belong to the value."""
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in _top_level_split(text or ""))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"--set {item!r}: give KEY=VALUE pairs separated by commas, e.g. hidden_size=4096")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out


def _top_level_split(text: str) -> list[str]:
    """``text`` split at the commas outside brackets, braces and double quotes."""
    parts, depth, quoted, current = [], 0, False, []
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0 and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def load_config(config, overrides: Mapping[str, Any] | None = None):
    """A ``transformers`` configuration from a path, a model type or a configuration
    object, with ``overrides`` set on it (module docstring)."""
    import transformers
    try:
        return _load_config(transformers, config, dict(overrides or {}))
    except (FileNotFoundError, TypeError):
        raise
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers' own validation (strict dataclasses): said as bad input
        raise ValueError(f"the configuration is refused by transformers ({type(e).__name__}: {e}); check the values "
                         f"given (--set / overrides)") from None


def _load_config(transformers, config, overrides: dict):
    if isinstance(config, transformers.PretrainedConfig):
        config = config.__class__.from_dict({**config.to_dict(), **overrides})
    elif isinstance(config, (str, os.PathLike)) and os.path.exists(config):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{os.fspath(config)!r} holds no config.json; give the file or a model type")
        with open(path) as f:
            data = json.load(f)
        model_type = data.get("model_type")
        if model_type not in transformers.CONFIG_MAPPING:
            raise ValueError(f"{path}: model_type {model_type!r} is not one transformers "
                             f"{transformers.__version__} knows; the file needs a \"model_type\" key naming one")
        config = transformers.CONFIG_MAPPING[model_type].from_dict({**data, **overrides})
    elif isinstance(config, str):
        if config not in transformers.CONFIG_MAPPING:
            close = sorted(k for k in transformers.CONFIG_MAPPING.keys() if config.lower()[:4] in k)[:8]
            raise ValueError(f"{config!r} is neither a config.json path nor a model type of transformers "
                             f"{transformers.__version__}" + (f"; did you mean one of {close}?" if close else ""))
        config = transformers.CONFIG_MAPPING[config](**overrides)
    else:
        raise TypeError(f"config: a config.json path, a model type or a transformers.PretrainedConfig, not "
                        f"{type(config).__name__}")
    if hasattr(config, "use_cache"):
        config.use_cache = False  # training: no key/value cache in the captured graph
    return config


def _dtype(config, dtype) -> torch.dtype:
    if dtype is None:  # the configuration's (``dtype``; ``torch_dtype`` in older transformers), read quietly
        fields = vars(config)
        dtype = fields.get("dtype") or fields.get("torch_dtype") or torch.bfloat16
    if isinstance(dtype, str):
        name = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}.get(dtype, dtype)
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype {name!r}: use bfloat16, float16 or float32")
    return dtype


def meta_model(config, dtype=None):
    """``AutoModelForCausalLM.from_config(config)`` on the meta device in ``dtype``."""
    import transformers
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    except ValueError as e:
        if type(config) not in transformers.AutoModelForCausalLM._model_mapping:
            raise ValueError(f"{type(config).__name__} ({config.model_type}) has no causal language model class in "
                             f"transformers {transformers.__version__} ({e}); plan its model with autopar.plan from "
                             f"a factory instead") from None
        raise ValueError(f"building the {config.model_type} model from its configuration failed: {e}; check the "
                         f"configuration's values (--set / overrides)") from None
    except (AssertionError, TypeError, IndexError, KeyError, AttributeError) as e:  # the model class's own checks
        raise ValueError(f"building the {config.model_type} model from its configuration failed "
                         f"({type(e).__name__}: {e}); check the configuration's values (--set / overrides), e.g. "
                         f"token ids (pad_token_id={getattr(config, 'pad_token_id', None)}) within vocab_size="
                         f"{getattr(config, 'vocab_size', None)}") from None
    return model.to(_dtype(config, dtype))


def example_batch(config, batch) -> dict[str, torch.Tensor]:
    """The keyword inputs of one global batch on the meta device: ``input_ids`` and
    ``labels`` of shape ``batch``."""
    sequences, tokens = parse_batch(batch)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and tokens > limit:
        raise ValueError(f"batch: {tokens} tokens per sequence exceed the configuration's max_position_embeddings "
                         f"({limit}); give fewer tokens or set max_position_embeddings")
    ids = torch.zeros(sequences, tokens, dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": ids}


def plan_config(config, world: int, batch, *, overrides: Mapping[str, Any] | None = None, dtype=None,
                strategy: Any = "auto", hardware=None, memory_limit: float | None = None, progress=None):
    """The plan of the causal language model of ``config`` (module docstring) for
    ``world`` devices of ``hardware`` on a global batch ``batch`` = (sequences, tokens);
    the other arguments as :func:`autopar.plan`. The plan's ``model`` is the model's
    class (``LlamaForCausalLM``)."""
    config = load_config(config, overrides)
    model = meta_model(config, dtype)
    made = plan_model(model, world, (), None, strategy, example_kwargs=example_batch(config, batch),
                      hardware=hardware, memory_limit=memory_limit, progress=progress)
    return made
