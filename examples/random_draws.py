"""Models that draw random numbers in forward, for the tests and docs of autopar's
plan-independent draws (docs/random_draws.md): each trains to the same losses
and parameters under every plan and world size, one rank included.

* ``dropout_mlp``: ``nn.Dropout`` between two linears;
* ``vae``: a variational autoencoder's reparameterisation (``torch.randn_like(mu)``), its
  loss returning the KL term beside the reconstruction;
* ``label_dropout``: a class-conditional model dropping labels at random
  (``torch.rand(batch) < p``, as diffusers' DiT does for classifier-free guidance);
* ``gpt2_dropout``: Hugging Face GPT-2 with embedding, residual and attention dropout
  (``scaled_dot_product_attention``'s ``dropout_p``), its own loss;
* ``noisy_targets``: diffusion-style training noise drawn in the loss (``torch.randn``
  of the target's shape, ``torch.randint`` timesteps) and ``F.dropout`` as a function.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8


class DropoutMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(16, 32), nn.Dropout(0.3), nn.Linear(32, 4)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.mu, self.logvar, self.dec = nn.Linear(16, 16), nn.Linear(16, 4), nn.Linear(16, 4), \
            nn.Linear(4, 16)

    def forward(self, x):
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def vae_loss(out, target):
    reconstruction, mu, logvar = out
    return F.mse_loss(reconstruction, target) - 0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())


class LabelDropout(nn.Module):
    """A class embedding whose labels are replaced by a null class at random."""

    def __init__(self, classes: int = 10, p: float = 0.3):
        super().__init__()
        self.classes, self.p = classes, p
        self.table = nn.Embedding(classes + 1, 16)
        self.body = nn.Linear(16, 16)

    def forward(self, x, labels):
        drop = torch.rand(labels.shape[0]) < self.p
        labels = torch.where(drop, self.classes, labels)
        return self.body(x + self.table(labels))


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(17, 32), nn.SiLU(), nn.Linear(32, 16))

    def forward(self, x, t):
        return self.net(torch.cat([F.dropout(x, 0.1, True), t[:, None].float() / 1000], -1))


class NoisyTargets(nn.Module):
    """Training noise drawn in the model: timesteps per row, Gaussian noise of the inputs' shape."""

    def __init__(self):
        super().__init__()
        self.denoiser = Denoiser()

    def forward(self, x):
        t = torch.randint(0, 1000, (x.shape[0],))
        noise = torch.randn(x.shape)
        scale = (1 - t.float() / 1000)[:, None]
        return self.denoiser(x * scale + noise * (1 - scale), t), noise


class TimestepBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(100, 16), nn.Linear(16, 16)

    def forward(self, h, t):
        return h + torch.tanh(self.fc(h + self.emb(t)))


class TimestepBlocks(nn.Module):
    """A timestep drawn once in forward and read by every block (as diffusers' DiT): under
    a pipeline the later stages receive the draw."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([TimestepBlock() for _ in range(4)])

    def forward(self, x):
        t = torch.randint(0, 100, (x.shape[0],))
        noise = torch.randn_like(x)
        h = x + noise
        for block in self.blocks:
            h = block(h, t)
        return h, noise


def noise_loss(out, target):
    prediction, noise = out
    return F.mse_loss(prediction, noise)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, use_cache=False,
                                      resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.3, bos_token_id=0, eos_token_id=0))


def case(name: str) -> tuple:
    """``(factory, inputs, target, loss_fn, kwargs)`` of the named model (float32; the
    tests run them in float64)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(BATCH, 16, generator=g)
    if name == "dropout_mlp":
        return DropoutMLP, (x,), torch.randn(BATCH, 4, generator=g), F.mse_loss, {}
    if name == "vae":
        return VAE, (x,), x.clone(), vae_loss, {}
    if name == "label_dropout":
        labels = torch.randint(0, 10, (BATCH,), generator=g)
        return LabelDropout, (x, labels), torch.randn(BATCH, 16, generator=g), F.mse_loss, {}
    if name == "noisy_targets":
        return NoisyTargets, (x,), torch.zeros(BATCH, 16), noise_loss, {}
    if name == "timestep_blocks":
        return TimestepBlocks, (x,), torch.zeros(BATCH, 16), noise_loss, {}
    if name == "gpt2_dropout":
        ids = torch.randint(0, 64, (BATCH, 12), generator=g)
        return _gpt2, (), None, None, {"input_ids": ids, "labels": ids}
    raise KeyError(name)


NAMES = ("dropout_mlp", "vae", "label_dropout", "noisy_targets", "timestep_blocks", "gpt2_dropout")


def train(name: str, strategy, steps: int = 3, seed: int = 5) -> dict:
    """On every rank of a job (or on one process): compile the named model in float64 under
    ``strategy``, train ``steps`` AdamW steps; the losses, the final parameters and the
    plan's mesh."""
    import autopar
    factory, inputs, target, loss_fn, kwargs = case(name)
    torch.manual_seed(0)
    model = factory().double()
    inputs = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    target = target.double() if target is not None and target.is_floating_point() else target
    pm = autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         example_kwargs=kwargs, strategy=strategy, seed=seed)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = pm.step(*inputs, target=target, **kwargs) if loss_fn is not None else pm.step(*inputs, **kwargs)
        losses.append(float(loss))
        optimizer.step()
    state = {k: v.detach().clone() for k, v in pm.full_state_dict().items()}
    return {"losses": losses, "state": state, "mesh": dict(pm.plan.mesh), "form": pm.plan.form}


def train_job(runs: list) -> list:
    """:func:`train` for each ``(name, strategy)`` on this rank."""
    return [train(name, strategy) for name, strategy in runs]


def mask_rows_job(strategy) -> dict:
    """A dropout of a batch of ones under ``strategy``: the whole batch's mask as the
    compiled model returns it (each rank's rows gathered)."""
    import autopar
    torch.manual_seed(0)
    model = nn.Sequential(nn.Identity(), nn.Dropout(0.5))
    x = torch.ones(BATCH, 64, dtype=torch.float64)
    pm = autopar.compile(model, None, example_inputs=(x,), strategy=strategy, seed=9)
    return {"mask": pm(x) != 0, "second": pm(x) != 0}
