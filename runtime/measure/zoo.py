"""Six small real torch models of six architecture families, usable as profiler factories
(``thrifty profile thrifty.runtime.measure.zoo:mlp``) and as trainers' workloads.

Each factory takes no required argument and returns a `Workload`: the model,
a `make_batch(batch)` that draws synthetic inputs and labels, and the loss.
Everything is deterministic given ``seed``: the initial weights and the stream
of batches. Labels come from a fixed random "teacher" function of the inputs,
so the tasks are learnable and a trainer's loss can be seen to fall.

Sizes are chosen so that one training iteration at batch 32 with one CPU
thread takes some milliseconds to tens of milliseconds, and each model has
tens of parameter tensors (so overlapping allreduce with the backward pass
matters) holding 0.5-20 MB of gradients:

==================== =============================== ======= ==========
factory              input                           tensors grad bytes
==================== =============================== ======= ==========
``mlp``              784 features, 10 classes        12      10.2 MB
``small_cnn``        3x32x32 images, 10 classes      19       1.3 MB
``tiny_transformer`` 32 tokens of 1000, 10 classes   30       1.6 MB
``lstm_text``        48 tokens of 2000, 10 classes   11       1.4 MB
``conv1d_audio``     4000-sample waveforms           17       0.2 MB
``embedding_bag``    13 dense + 4 x 8 sparse ids     14       4.9 MB
==================== =============================== ======= ==========

(The recurrent, 1-D convolutional and embedding-heavy families were added
for issue "Predictions that hold on models thrifty has not seen".)

This module imports torch at the top: import it only from code that needs
torch (never from ``thrifty.perfmodels``'s ``__init__``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from thrifty.core.optional import require

torch = require("torch", "torch")
from torch import Generator, Tensor, nn  # noqa: E402 - after `require` has said how to install torch

__all__ = ["Workload", "SyntheticBatches", "mlp", "small_cnn", "tiny_transformer", "lstm_text", "conv1d_audio",
           "embedding_bag", "FACTORIES"]


@dataclass(frozen=True)
class Workload:
    """One trainable job: `model`, `make_batch(batch) -> (inputs, targets)` and
    `loss_fn(outputs, targets) -> scalar loss`."""

    model: nn.Module
    make_batch: Callable[[int], tuple[Tensor, Tensor]]
    loss_fn: Callable[[Tensor, Tensor], Tensor]


class SyntheticBatches:
    """A seeded stream of synthetic batches: each call draws the next batch.

    `draw_inputs(generator, batch)` makes the inputs and `teacher(inputs)` the
    labels; the generator is private, so the stream does not touch (or depend
    on) torch's global random state.
    """

    def __init__(
        self,
        draw_inputs: Callable[[Generator, int], Tensor],
        teacher: Callable[[Tensor], Tensor],
        seed: int,
    ):
        self._draw_inputs = draw_inputs
        self._teacher = teacher
        self._generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch: int) -> tuple[Tensor, Tensor]:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch is {batch!r}, but must be a positive integer")
        inputs = self._draw_inputs(self._generator, batch)
        with torch.no_grad():
            targets = self._teacher(inputs)
        return inputs, targets


def _seeded_module(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """Build a module with weights drawn from `seed`, leaving torch's global
    random state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _linear_teacher(in_features: int, classes: int, seed: int) -> Callable[[Tensor], Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(in_features, classes, generator=generator)

    def teacher(features: Tensor) -> Tensor:
        return (features.flatten(1) @ weight).argmax(dim=1)

    return teacher


# --- mlp ----------------------------------------------------------------------------

MLP_FEATURES = 784
MLP_WIDTHS = (1024, 1024, 512, 256, 128)
CLASSES = 10


def _build_mlp() -> nn.Module:
    layers: list[nn.Module] = []
    width_in = MLP_FEATURES
    for width in MLP_WIDTHS:
        layers += [nn.Linear(width_in, width), nn.ReLU()]
        width_in = width
    layers.append(nn.Linear(width_in, CLASSES))
    return nn.Sequential(*layers)


def mlp(seed: int = 0) -> Workload:
    """A 6-layer perceptron on 784 features (MNIST-sized), 10 classes."""
    model = _seeded_module(seed, _build_mlp)
    batches = SyntheticBatches(
        lambda g, n: torch.randn(n, MLP_FEATURES, generator=g),
        _linear_teacher(MLP_FEATURES, CLASSES, seed + 1),
        seed + 2,
    )
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- small_cnn ----------------------------------------------------------------------

CNN_CHANNELS = (16, 32, 32, 64, 64)  # conv widths; a 2x2 max-pool after convs 1, 3 and 5


def _conv_block(c_in: int, c_out: int) -> list[nn.Module]:
    # No conv bias: the batch norm after it has its own.
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]


def _build_small_cnn() -> nn.Module:
    c1, c2, c3, c4, c5 = CNN_CHANNELS
    return nn.Sequential(
        *_conv_block(3, c1),
        nn.MaxPool2d(2),  # 16x16
        *_conv_block(c1, c2),
        *_conv_block(c2, c3),
        nn.MaxPool2d(2),  # 8x8
        *_conv_block(c3, c4),
        *_conv_block(c4, c5),
        nn.MaxPool2d(2),  # 4x4
        nn.Flatten(),
        nn.Linear(c5 * 4 * 4, 256),
        nn.ReLU(),
        nn.Linear(256, CLASSES),
    )


def small_cnn(seed: int = 0) -> Workload:
    """Five 3x3 conv + batch-norm blocks with max-pooling, then two linear
    layers, on 3x32x32 images (CIFAR-sized), 10 classes."""
    model = _seeded_module(seed, _build_small_cnn)
    # The teacher sees a 4x4-pooled image, so the labels depend on coarse colour layout.
    pooled_teacher = _linear_teacher(3 * 4 * 4, CLASSES, seed + 1)
    batches = SyntheticBatches(
        lambda g, n: torch.randn(n, 3, 32, 32, generator=g),
        lambda images: pooled_teacher(nn.functional.avg_pool2d(images, 8)),
        seed + 2,
    )
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- tiny_transformer ---------------------------------------------------------------

VOCAB = 1000
SEQ_LEN = 32
D_MODEL = 128
HEADS = 4
FEEDFORWARD = 256
ENCODER_LAYERS = 2


class TinyTransformer(nn.Module):
    """Token and position embeddings, a 2-layer pre-norm transformer encoder,
    mean pooling over the sequence and a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Parameter(torch.randn(SEQ_LEN, D_MODEL) * 0.02)
        layer = nn.TransformerEncoderLayer(
            D_MODEL, HEADS, FEEDFORWARD, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, ENCODER_LAYERS, norm=nn.LayerNorm(D_MODEL), enable_nested_tensor=False
        )
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, tokens: Tensor) -> Tensor:
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.encoder(hidden).mean(dim=1))


def _token_teacher(seed: int) -> Callable[[Tensor], Tensor]:
    # Each token votes for a class with a fixed random weight; the label is the winner.
    votes = torch.randn(VOCAB, CLASSES, generator=torch.Generator().manual_seed(seed))

    def teacher(tokens: Tensor) -> Tensor:
        return votes[tokens].sum(dim=1).argmax(dim=1)

    return teacher


def tiny_transformer(seed: int = 0) -> Workload:
    """A 2-layer transformer encoder classifier on sequences of 32 tokens from
    a vocabulary of 1000 (d_model 128, 4 heads, feed-forward 256), 10 classes."""
    model = _seeded_module(seed, TinyTransformer)
    batches = SyntheticBatches(
        lambda g, n: torch.randint(0, VOCAB, (n, SEQ_LEN), generator=g),
        _token_teacher(seed + 1),
        seed + 2,
    )
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- lstm_text: recurrent -------------------------------------------------------------

LSTM_VOCAB = 2000
LSTM_SEQ = 48
LSTM_EMBED = 64
LSTM_HIDDEN = 128
LSTM_LAYERS = 2


class LstmText(nn.Module):
    """An embedding, a 2-layer LSTM and a linear classifier on the last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(LSTM_VOCAB, LSTM_EMBED)
        self.lstm = nn.LSTM(LSTM_EMBED, LSTM_HIDDEN, LSTM_LAYERS, batch_first=True)
        self.head = nn.Linear(LSTM_HIDDEN, CLASSES)

    def forward(self, tokens: Tensor) -> Tensor:
        output, _ = self.lstm(self.embed(tokens))
        return self.head(output[:, -1])


def lstm_text(seed: int = 0) -> Workload:
    """A 2-layer LSTM text classifier (embedding 64, hidden 128) on sequences of
    48 tokens from a vocabulary of 2000, 10 classes."""
    model = _seeded_module(seed, LstmText)
    votes = torch.randn(LSTM_VOCAB, CLASSES, generator=torch.Generator().manual_seed(seed + 1))
    batches = SyntheticBatches(
        lambda g, n: torch.randint(0, LSTM_VOCAB, (n, LSTM_SEQ), generator=g),
        lambda tokens: votes[tokens].sum(dim=1).argmax(dim=1),
        seed + 2,
    )
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- conv1d_audio: 1-D convolutional ----------------------------------------------------

AUDIO_SAMPLES = 4000      # a quarter of a second at 16 kHz
AUDIO_CHANNELS = (16, 32, 32, 64, 64)


def _build_conv1d_audio() -> nn.Module:
    layers: list[nn.Module] = []
    c_in = 1
    for i, c_out in enumerate(AUDIO_CHANNELS):
        stride = 4 if i == 0 else 1
        layers += [nn.Conv1d(c_in, c_out, 9 if i == 0 else 5, stride=stride, padding=2, bias=False),
                   nn.BatchNorm1d(c_out), nn.ReLU(), nn.MaxPool1d(2)]
        c_in = c_out
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(c_in, CLASSES)]
    return nn.Sequential(*layers)


def conv1d_audio(seed: int = 0) -> Workload:
    """Five 1-D conv + batch-norm blocks with max-pooling and global average
    pooling on raw waveforms of 4000 samples (keyword-spotting sized), 10 classes."""
    model = _seeded_module(seed, _build_conv1d_audio)
    teacher = _linear_teacher(AUDIO_SAMPLES // 100, CLASSES, seed + 1)
    batches = SyntheticBatches(
        lambda g, n: torch.randn(n, 1, AUDIO_SAMPLES, generator=g),
        lambda waves: teacher(nn.functional.avg_pool1d(waves, 100)),
        seed + 2,
    )
    return Workload(model, batches, nn.CrossEntropyLoss())


# --- embedding_bag: embedding-heavy (a recommendation model's sparse side) ---------------

EMB_TABLES = (20000, 10000, 5000, 2000)   # rows of each categorical feature's table
EMB_DIM = 32
EMB_PER_SAMPLE = 8                         # ids per feature per sample (a bag)
EMB_DENSE = 13                             # dense features, as DLRM's Criteo input


class EmbeddingBagNet(nn.Module):
    """One sum-pooled embedding bag per categorical feature, a bottom MLP on the
    dense features, and a top MLP on their concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, EMB_DIM, mode="sum") for rows in EMB_TABLES)
        self.bottom = nn.Sequential(nn.Linear(EMB_DENSE, 64), nn.ReLU(), nn.Linear(64, EMB_DIM), nn.ReLU())
        width = EMB_DIM * (len(EMB_TABLES) + 1)
        self.top = nn.Sequential(nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                 nn.Linear(64, CLASSES))

    def forward(self, inputs: Tensor) -> Tensor:
        dense, ids = inputs[:, :EMB_DENSE], inputs[:, EMB_DENSE:].long()
        pooled = [table(ids[:, k * EMB_PER_SAMPLE:(k + 1) * EMB_PER_SAMPLE])
                  for k, table in enumerate(self.tables)]
        return self.top(torch.cat([self.bottom(dense), *pooled], dim=1))


def embedding_bag(seed: int = 0) -> Workload:
    """Four embedding bags (20000, 10000, 5000 and 2000 rows of 32, 8 ids each
    per sample) beside a bottom MLP on 13 dense features, and a top MLP, 10
    classes: most of its gradient bytes are embedding rows."""
    model = _seeded_module(seed, EmbeddingBagNet)
    weight = torch.randn(EMB_DENSE, CLASSES, generator=torch.Generator().manual_seed(seed + 1))

    def draw(g: Generator, n: int) -> Tensor:
        dense = torch.randn(n, EMB_DENSE, generator=g)
        ids = [torch.randint(0, rows, (n, EMB_PER_SAMPLE), generator=g) for rows in EMB_TABLES]
        return torch.cat([dense, *[i.float() for i in ids]], dim=1)

    batches = SyntheticBatches(draw, lambda x: (x[:, :EMB_DENSE] @ weight).argmax(dim=1), seed + 2)
    return Workload(model, batches, nn.CrossEntropyLoss())


FACTORIES: dict[str, Callable[..., Workload]] = {
    "mlp": mlp,
    "small-cnn": small_cnn,
    "tiny-transformer": tiny_transformer,
    "lstm-text": lstm_text,
    "conv1d-audio": conv1d_audio,
    "embedding-bag": embedding_bag,
}
"""The zoo by profile name (the names the shipped measured profiles use)."""
