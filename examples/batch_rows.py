"""Models whose rows of the batch meet (docs/batch_rows.md): what a split of the batch
must gather, reduce over the ranks, or refuse.

Each ``*_case()`` returns ``(factory, inputs, target, loss_fn, kwargs)``: ``factory()``
builds the model from seed 0, ``inputs``/``kwargs`` are one global batch, and the loss is
``loss_fn(model(*inputs, **kwargs), target)``, or the model's own when ``loss_fn`` is None.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8


def clip_config():
    from transformers import CLIPConfig
    return CLIPConfig(text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, max_position_embeddings=16, bos_token_id=0,
                                       eos_token_id=63, pad_token_id=1),
                      vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, image_size=16, patch_size=8),
                      projection_dim=16)


def _clip_batch(batch: int = BATCH):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 63, (batch, 7), generator=g)
    ids[:, -1] = 63   # the end-of-text token CLIP pools at
    return ids, torch.randn(batch, 3, 16, 16, generator=g)


class ClipLogits(nn.Module):
    """Hugging Face ``CLIPModel`` returning its image-to-text logits (for a loss given
    the labels as the target)."""

    def __init__(self):
        super().__init__()
        from transformers import CLIPModel
        torch.manual_seed(0)
        self.clip = CLIPModel(clip_config())

    def forward(self, input_ids, pixel_values):
        return self.clip(input_ids=input_ids, pixel_values=pixel_values).logits_per_image


class ClipWithLoss(nn.Module):
    """Hugging Face ``CLIPModel(..., return_loss=True)``: its contrastive loss, with the
    ``arange(batch)`` labels made inside the model, and its image-to-text logits (as a
    ``ModelOutput`` with ``loss`` and ``logits``)."""

    def __init__(self):
        super().__init__()
        from transformers import CLIPModel
        torch.manual_seed(0)
        self.clip = CLIPModel(clip_config())

    def forward(self, input_ids, pixel_values):
        from transformers.modeling_outputs import SequenceClassifierOutput
        out = self.clip(input_ids=input_ids, pixel_values=pixel_values, return_loss=True)
        return SequenceClassifierOutput(loss=out.loss, logits=out.logits_per_image)


def clip_case(batch: int = BATCH):
    """HF ``CLIPModel(return_loss=True)``: the contrastive loss with ``arange(batch)``
    labels made inside the model."""
    ids, pixels = _clip_batch(batch)
    return ClipWithLoss, (), None, None, {"input_ids": ids, "pixel_values": pixels}


def clip_target_case(batch: int = BATCH):
    """The same model's logits with the labels passed as the target (``arange(batch)``)."""
    ids, pixels = _clip_batch(batch)

    def loss(logits, labels):
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    return ClipLogits, (ids, pixels), torch.arange(batch), loss, {}


class DualEncoder(nn.Module):
    """A retrieval dual encoder: queries and documents through two MLP towers, scored
    against every document of the batch (in-batch negatives)."""

    def __init__(self, width: int = 16, dim: int = 8):
        super().__init__()
        self.query = nn.Sequential(nn.Linear(width, 32), nn.GELU(), nn.Linear(32, dim))
        self.doc = nn.Sequential(nn.Linear(width, 32), nn.GELU(), nn.Linear(32, dim))
        self.temperature = nn.Parameter(torch.tensor(0.5))

    def forward(self, queries, docs):
        q = F.normalize(self.query(queries), dim=-1)
        d = F.normalize(self.doc(docs), dim=-1)
        scores = q @ d.t() / self.temperature
        labels = torch.arange(q.shape[0], device=q.device)
        return F.cross_entropy(scores, labels)


def dual_encoder_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(2)

    def factory():
        torch.manual_seed(0)
        return DualEncoder()
    return factory, (torch.randn(batch, 16, generator=g), torch.randn(batch, 16, generator=g)), None, None, {}


class CentredMLP(nn.Module):
    """An MLP whose hidden layer is centred over the batch (``h - h.mean(0)``)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h - h.mean(0, keepdim=True))


def centred_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(3)

    def factory():
        torch.manual_seed(0)
        return CentredMLP()
    return factory, (torch.randn(batch, 16, generator=g),), torch.randn(batch, 4, generator=g), F.mse_loss, {}


class MaskedLM(nn.Module):
    """A Llama-style causal LM (HF ``LlamaModel``, 2 layers) with the loss written by hand as
    a masked mean over the tokens: ``(per_token * mask).sum() / mask.sum()``."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        self.model = LlamaModel(config)
        self.head = nn.Linear(32, 64, bias=False)

    def forward(self, ids, mask, labels):
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = self.head(hidden)
        per_token = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)
        weights = mask.to(per_token.dtype)
        return (per_token * weights).sum() / weights.sum()


LENGTHS = (12, 1, 3, 12, 2, 12, 1, 5)   # tokens per row: very uneven, so each part counts its own number


def masked_lm_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 64, (batch, 12), generator=g)
    mask = torch.zeros(batch, 12, dtype=torch.long)
    for row, n in enumerate(LENGTHS[:batch]):
        mask[row, :n] = 1
    labels = torch.randint(0, 64, (batch, 12), generator=g)
    return MaskedLM, (ids, mask, labels), None, None, {}


def _mlp_factory():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def summed_loss_case(batch: int = BATCH):
    """A loss that sums over the batch, scaled: each part's share adds up (not averages)."""
    g = torch.Generator().manual_seed(5)

    def loss(out, target):
        return F.mse_loss(out, target, reduction="sum") / 7.0
    return _mlp_factory, (torch.randn(batch, 4, generator=g),), torch.randn(batch, 3, generator=g), loss, {}


def mean_plus_sum_case(batch: int = BATCH):
    """A mean over the batch plus a penalty summed over it."""
    g = torch.Generator().manual_seed(6)

    def loss(out, target):
        return F.mse_loss(out, target) + 0.01 * out.pow(2).sum()
    return _mlp_factory, (torch.randn(batch, 4, generator=g),), torch.randn(batch, 3, generator=g), loss, {}


class RunningNorm(nn.Module):
    """Inputs centred by a running mean the forward updates from the batch under
    ``torch.no_grad()`` (a normaliser's statistic outside batch norm)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(16))
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.fc(x - self.mean)


def running_norm_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(5)

    def factory():
        torch.manual_seed(0)
        return RunningNorm()
    return factory, (torch.randn(batch, 16, generator=g) + 2,), torch.randn(batch, 4, generator=g), F.mse_loss, {}


class RunningBlock(nn.Module):
    """A residual block keeping a running mean of its hidden values (updated in forward)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("running_mean", torch.zeros(16))

    def forward(self, x):
        h = self.fc(x)
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(0.1 * h.mean(0))
        return x + torch.relu(h - self.running_mean)


class RunningBlocks(nn.Module):
    """Two :class:`RunningBlock` s: under a pipeline each stage's statistics live on its
    ranks only."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([RunningBlock() for _ in range(2)])
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def running_blocks_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(6)

    def factory():
        torch.manual_seed(0)
        return RunningBlocks()
    return factory, (torch.randn(batch, 16, generator=g),), torch.randn(batch, 4, generator=g), F.mse_loss, {}


def conv_bn_case(batch: int = BATCH):
    """A convolution and torch's BatchNorm2d (synchronised over the data ranks)."""
    g = torch.Generator().manual_seed(7)

    def factory():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    return factory, (torch.randn(batch, 3, 8, 8, generator=g),), torch.randint(0, 5, (batch,), generator=g), \
        F.cross_entropy, {}


class PaddedTagger(nn.Module):
    """A token classifier whose loss is a cross-entropy over the tokens that are not padding
    (``ignore_index``) plus a small penalty: the counted mean is one term of the loss."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(20, 16), nn.Linear(16, 5)

    def forward(self, ids, labels):
        logits = self.out(torch.tanh(self.embed(ids)))
        loss = F.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)
        return {"loss": loss + 0.01 * logits.pow(2).mean(), "logits": logits}


def counted_plus_penalty_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, 20, (batch, 6), generator=g)
    labels = torch.randint(0, 5, (batch, 6), generator=g)
    labels[: batch // 2, 1:] = -100   # half the rows mostly padding

    def factory():
        torch.manual_seed(0)
        return PaddedTagger()
    return factory, (ids, labels), None, None, {}


class SizeScaled(RunningNorm):
    """The batch's size used as a number, in a model torch.export captures (its forward
    changes a buffer in place): the capture bakes ``x.shape[0] / 4`` into a constant."""

    def forward(self, x):
        return super().forward(x) * (x.shape[0] / 4.0)


def size_scaled_case(batch: int = BATCH):
    factory, inputs, target, loss_fn, kwargs = running_norm_case(batch)

    def make():
        torch.manual_seed(0)
        return SizeScaled()
    return make, inputs, target, loss_fn, kwargs


class GraphConv(nn.Module):
    """A dense graph convolution over the batch's nodes (``a @ h`` with ``a`` the batch's
    adjacency, normalised in forward): no split of the batch is exact."""

    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x, adj):
        a = adj + torch.eye(adj.shape[0])
        d = a.sum(1).rsqrt()
        a = d[:, None] * a * d[None, :]
        return a @ self.w2(torch.relu(a @ self.w1(x)))


def gcn_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(6)
    adj = (torch.rand(batch, batch, generator=g) > 0.6).float()

    def factory():
        torch.manual_seed(0)
        return GraphConv()
    return factory, (torch.randn(batch, 16, generator=g), ((adj + adj.t()) > 0).float()), \
        torch.randn(batch, 4, generator=g), F.mse_loss, {}


class Whitened(nn.Module):
    """Hidden features decorrelated by their Gram matrix over the batch (``h.T @ h``, a
    sum over the rows: each part's product is its rows' share)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc1(x)
        gram = torch.einsum("bi,bj->ij", h, h) / 64 + torch.eye(8)
        return self.fc2(h @ torch.linalg.inv(gram) + (h.t() @ h).diagonal() / 64)


def whitened_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(7)

    def factory():
        torch.manual_seed(0)
        return Whitened()
    return factory, (torch.randn(batch, 16, generator=g),), torch.randn(batch, 4, generator=g), F.mse_loss, {}


class BagRetrieval(nn.Module):
    """A retrieval dual encoder of ``EmbeddingBag`` towers scoring every query against every
    document of the batch (in-batch negatives); its loss makes the labels from the scores'
    shape (``arange(scores.shape[0])``)."""

    def __init__(self):
        super().__init__()
        self.queries, self.docs = nn.EmbeddingBag(50, 16), nn.EmbeddingBag(50, 16)
        self.q, self.d = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, queries, docs):
        return self.q(self.queries(queries)) @ self.d(self.docs(docs)).t()


def in_batch_negatives(scores, target):
    return F.cross_entropy(scores, torch.arange(scores.shape[0]))


def bag_retrieval_case(batch: int = BATCH):
    g = torch.Generator().manual_seed(8)

    def factory():
        torch.manual_seed(0)
        return BagRetrieval()
    return factory, (torch.randint(0, 50, (batch, 5), generator=g), torch.randint(0, 50, (batch, 7), generator=g)), \
        torch.zeros(batch), in_batch_negatives, {}


CASES = {"clip": clip_case, "clip_target": clip_target_case, "dual_encoder": dual_encoder_case,
         "centred": centred_case, "masked_lm": masked_lm_case, "summed_loss": summed_loss_case,
         "mean_plus_sum": mean_plus_sum_case, "running_norm": running_norm_case, "gcn": gcn_case,
         "running_blocks": running_blocks_case, "conv_bn": conv_bn_case,
         "counted_plus_penalty": counted_plus_penalty_case, "size_scaled": size_scaled_case,
         "whitened": whitened_case, "bag_retrieval": bag_retrieval_case}


def equivalence_job(cases: list) -> list:
    """On every rank of a launched job: for each ``(case name, strategy)`` the report of
    :func:`autopar.testing.compare_with_single_device` in float64, or ``{"error": ...}``
    with the :class:`~autopar.planning.strategy.PlanError` a refused plan raised (planning
    is the same on every rank, so every rank refuses alike)."""
    from autopar.planning.strategy import PlanError
    from autopar.testing import compare_with_single_device
    reports = []
    for name, strategy in cases:
        factory, inputs, target, loss_fn, kwargs = CASES[name]()
        if target is not None and target.is_floating_point():
            target = target.to(torch.float64)   # as the model and its inputs
        try:
            report = compare_with_single_device(factory, inputs, target, loss_fn, strategy, kwargs=kwargs,
                                                dtype=torch.float64)
        except PlanError as e:
            report = {"error": str(e)}
        report["case"] = (name, strategy)
        reports.append(report)
    return reports
