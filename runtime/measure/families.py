"""Model families the zoo (`thrifty.runtime.measure.zoo`) does not hold: the
accuracy benchmark's held-out set (`benchmarks/perfmodel_accuracy.py
--families`), on which thrifty's iteration prediction is checked against real
DDP on models none of its mechanisms were built on.

No shipped profile exists for any of them: the benchmark profiles each with
``thrifty profile``'s profiler, as a user would profile a model of their own,
then predicts and measures. They are usable as profiler factories
(``thrifty profile thrifty.runtime.measure.families:gru_tagger``) and as
trainers' workloads, like the zoo's, with the same conventions (seeded,
synthetic batches labelled by a fixed teacher).

==================== ================================================ =================================
factory              model                                            what sets it apart
==================== ================================================ =================================
``gru_tagger``       bidirectional 1-layer GRU over 32 tokens          a recurrent loop in both directions,
                     (vocab 3000, embed 48, hidden 96), mean-pooled    a per-token head (sequence loss)
``dwsep_cnn``        MobileNet-style depthwise-separable blocks        depthwise 3x3 convolutions (memory-
                     (ReLU6, batch norm) on 3x32x32 images             bound, one filter per channel)
``moe_mlp``          a mixture of 8 expert MLPs with top-2 routing     data-dependent gathers and scatters,
                     on 192 features                                   per-expert matmuls of varying size
``conv_autoencoder`` a denoising convolutional autoencoder with        transposed convolutions, a dense
                     transposed convolutions, MSE on 1x32x32           per-pixel regression loss
==================== ================================================ =================================

The benchmark holds ``conv_autoencoder`` out: nothing in the prediction was
checked against it while the others were used to find what the predictions
missed.

This module imports torch at the top: import it only from code that needs torch.
"""

from __future__ import annotations

from collections.abc import Callable

from thrifty.core.optional import require
from thrifty.runtime.measure.zoo import CLASSES, SyntheticBatches, Workload, _seeded_module

torch = require("torch", "torch")
from torch import Generator, Tensor, nn  # noqa: E402 - after `require` has said how to install torch

__all__ = ["gru_tagger", "dwsep_cnn", "moe_mlp", "conv_autoencoder", "FAMILIES", "HELD_OUT"]


# --- gru_tagger: bidirectional recurrent, per-token loss ---------------------------------

GRU_SEQ = 32  # tokens per sample


class GruTagger(nn.Module):
    """An embedding, a bidirectional GRU and a per-token linear tagger."""

    def __init__(self, vocab: int = 3000, embed: int = 48, hidden: int = 96, tags: int = 12) -> None:
        super().__init__()
        self.vocab, self.tags = vocab, tags
        self.embed = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, 1, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, tokens: Tensor) -> Tensor:
        output, _ = self.gru(self.embed(tokens))
        return self.head(output).flatten(0, 1)  # (batch * seq, tags)


def gru_tagger(seed: int = 0) -> Workload:
    """A bidirectional GRU sequence tagger: 32 tokens of a vocabulary of 3000,
    one of 12 tags per token (a token's tag depends on it and its left neighbour)."""
    model = _seeded_module(seed, GruTagger)
    assert isinstance(model, GruTagger)
    vocab, tags = model.vocab, model.tags
    table = torch.randint(0, tags, (vocab,), generator=torch.Generator().manual_seed(seed + 1))

    def teacher(tokens: Tensor) -> Tensor:
        left = torch.roll(tokens, 1, dims=1)
        return ((table[tokens] + table[left]) % tags).flatten()

    batches = SyntheticBatches(lambda g, n: torch.randint(0, vocab, (n, GRU_SEQ), generator=g), teacher, seed + 2)
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- dwsep_cnn: depthwise-separable convolutions --------------------------------------

# (output channels, stride) of each depthwise-separable block after the stem
DWSEP_BLOCKS = ((48, 1), (64, 2), (96, 1), (128, 2), (128, 1), (192, 2))
DWSEP_STEM = 24


def _dwsep_block(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_in, 3, stride=stride, padding=1, groups=c_in, bias=False), nn.BatchNorm2d(c_in),
            nn.ReLU6(),
            nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU6()]


def _build_dwsep_cnn() -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, DWSEP_STEM, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(DWSEP_STEM),
                               nn.ReLU6()]
    c_in = DWSEP_STEM
    for c_out, stride in DWSEP_BLOCKS:
        layers += _dwsep_block(c_in, c_out, stride)
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, CLASSES)]
    return nn.Sequential(*layers)


def dwsep_cnn(seed: int = 0) -> Workload:
    """A MobileNet-style classifier: a 3x3 stem, six depthwise-separable
    blocks (3x3 depthwise + 1x1 pointwise, batch norm, ReLU6) and global
    average pooling, on 3x32x32 images, 10 classes."""
    model = _seeded_module(seed, _build_dwsep_cnn)
    weight = torch.randn(3 * 2 * 2, CLASSES, generator=torch.Generator().manual_seed(seed + 1))
    batches = SyntheticBatches(
        lambda g, n: torch.randn(n, 3, 32, 32, generator=g),
        lambda images: (nn.functional.avg_pool2d(images, 16).flatten(1) @ weight).argmax(dim=1),
        seed + 2,
    )
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- moe_mlp: a mixture of experts with top-2 routing -------------------------------------

MOE_FEATURES = 192


class MoeLayer(nn.Module):
    """Top-k routing over expert MLPs: a linear router scores the experts,
    each sample goes to its `top` best with softmax weights, and every expert
    runs on the samples routed to it (gathered, then scattered back). An
    expert that got no sample runs on an empty batch, so every parameter has
    a gradient in every iteration, as DDP without ``find_unused_parameters``
    requires."""

    def __init__(self, features: int, hidden: int, experts: int, top: int) -> None:
        super().__init__()
        self.router = nn.Linear(features, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, features))
            for _ in range(experts))
        self.top = top

    def forward(self, x: Tensor) -> Tensor:
        weights, chosen = torch.softmax(self.router(x), dim=1).topk(self.top, dim=1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            y = expert(x.index_select(0, rows)) * weights[rows, slot].unsqueeze(1)
            out = out.index_add(0, rows, y)
        return x + out


class MoeMlp(nn.Module):
    """An input projection, two mixture-of-experts layers with layer norms, a classifier."""

    def __init__(self, features: int = MOE_FEATURES, hidden: int = 384, experts: int = 8, top: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(features, features)
        self.blocks = nn.ModuleList(MoeLayer(features, hidden, experts, top) for _ in range(2))
        self.norms = nn.ModuleList(nn.LayerNorm(features) for _ in range(2))
        self.head = nn.Linear(features, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        for norm, block in zip(self.norms, self.blocks):
            h = block(norm(h))
        return self.head(h)


def moe_mlp(seed: int = 0) -> Workload:
    """Two mixture-of-experts layers (8 experts of 192-384-192, top-2 routing)
    on 192 features, 10 classes."""
    model = _seeded_module(seed, MoeMlp)
    weight = torch.randn(MOE_FEATURES, CLASSES, generator=torch.Generator().manual_seed(seed + 1))
    batches = SyntheticBatches(lambda g, n: torch.randn(n, MOE_FEATURES, generator=g),
                               lambda x: (torch.tanh(x) @ weight).argmax(dim=1), seed + 2)
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- conv_autoencoder: transposed convolutions, a regression loss ---------------------------

AE_CHANNELS = (16, 32, 64)


def _build_conv_autoencoder() -> nn.Module:
    c1, c2, c3 = AE_CHANNELS
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, stride=2, padding=1), nn.ReLU(),       # 16x16
        nn.Conv2d(c1, c2, 3, stride=2, padding=1), nn.ReLU(),      # 8x8
        nn.Conv2d(c2, c3, 3, stride=2, padding=1), nn.ReLU(),      # 4x4
        nn.ConvTranspose2d(c3, c2, 4, stride=2, padding=1), nn.ReLU(),  # 8x8
        nn.ConvTranspose2d(c2, c1, 4, stride=2, padding=1), nn.ReLU(),  # 16x16
        nn.ConvTranspose2d(c1, 1, 4, stride=2, padding=1),              # 32x32
    )


def conv_autoencoder(seed: int = 0) -> Workload:
    """A denoising autoencoder: three strided convolutions down to 64x4x4 and
    three transposed convolutions back to 1x32x32, trained with the mean
    squared error to reconstruct a smooth image from a noisy copy."""
    model = _seeded_module(seed, _build_conv_autoencoder)

    def draw(g: Generator, n: int) -> Tensor:
        clean = nn.functional.interpolate(torch.randn(n, 1, 8, 8, generator=g), size=32, mode="bilinear")
        return torch.cat([clean + 0.3 * torch.randn(n, 1, 32, 32, generator=g), clean], dim=1)

    def loss(output: Tensor, clean: Tensor) -> Tensor:
        return nn.functional.mse_loss(output, clean)

    batches = SyntheticBatches(draw, lambda pair: pair[:, 1:], seed + 2)
    return Workload(_NoisyInput(model), batches, loss)


class _NoisyInput(nn.Module):
    """Feeds the noisy channel of a (noisy, clean) pair to the autoencoder."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, pair: Tensor) -> Tensor:
        return self.inner(pair[:, :1])


FAMILIES: dict[str, Callable[..., Workload]] = {
    "gru-tagger": gru_tagger,
    "dwsep-cnn": dwsep_cnn,
    "moe-mlp": moe_mlp,
    "conv-autoencoder": conv_autoencoder,
}
"""The held-out families by profile name."""

HELD_OUT = ("conv-autoencoder",)
"""Families not looked at while finding what the predictions miss."""
