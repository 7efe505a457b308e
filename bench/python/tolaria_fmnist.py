#!/usr/bin/env python3
"""Python peer of the `tolaria-fmnist` benchmark (DESIGN.md sections 6 and 7).

The workload, as the Rust crates define it:

  host  kasmina::host::CnnHost with CnnHostConfig::fashion_mnist(): 1x28x28
        input; three ConvBlocks (conv 3x3, padding 1, no bias -> BatchNorm
        (eps 1e-5, momentum 0.1, batch statistics in training) -> ReLU) with
        8 / 16 / 32 channels, each followed by a 2x2 max-pool (28 -> 14 -> 7
        -> 3, floor); global average pool; Linear(32 -> 10).
  seeds two, each behind the slot at its host boundary (PRE_POOL: after the
        block, before its pool), both blending with ADD at a constant alpha
        0.5, `h + 0.5 (s - h)` (torch.lerp, as kasmina::blend::blend_add),
        each seeing a detached copy of the host features (CNN gradient
        isolation: the host gets no gradient through the seed's input):
        r0c1 (16 ch at 14x14): conv_light, `x + ReLU(GN(conv3x3(x)))`, conv
              without bias, GroupNorm(1 group: kasmina's group_norm_groups(16));
        r0c2 (32 ch at 7x7):  attention (squeeze-excitation),
              `x * sigmoid(fc2(ReLU(fc1(mean_hw x))))`, fc1 32 -> 8 without
              bias, fc2 8 -> 32 with weight 0 and bias 3 at birth.
  init  PyTorch's defaults, as kasmina::layers: conv and linear weights and
        biases uniform in +-1/sqrt(fan_in); norm weights 1, biases 0;
        BatchNorm running mean 0, variance 1.
  optim three parameter groups (host, seed r0c1, seed r0c2) in one SGD
        optimizer (one step() call a step; the same update as one optimizer
        a group, which is how Tolaria holds them): SGD lr 0.01 momentum 0.9
        (tolaria::optim::OptimizerConfig::default(); the seeds'
        SEED_LEARNING_RATE 0.01, SEED_MOMENTUM 0.9), no weight decay, no
        dampening, no Nesterov; the fused kernel on CUDA.
  loss  softmax cross-entropy, mean over the batch.
  data  Fashion-MNIST from the four gzipped IDX files, pixels
        (byte / 255 - 0.2860) / 0.3530, resident on the device; every epoch
        a device-side permutation (torch.randperm) of the 60,000 training
        samples, batch 256, the last partial batch dropped (drop_last: 234
        steps, 59,904 samples an epoch); validation on the 10,000 test
        samples in one batch under torch.inference_mode (BatchNorm on its
        running statistics).

Modes (record mode names; every one uses channels_last, TF32 and cudnn
benchmark):
  eager       fp32, plain PyTorch
  eager-bf16  as eager under bf16 autocast
  graph       the whole training step (forward, loss, backward, the three
              optimizer steps, loss accumulation) captured once as a
              torch.cuda.CUDAGraph; every step gathers its batch with
              index_select into the graph's static input buffers, then
              replays
  graph-bf16  as graph under bf16 autocast (weight-cast cache off, as
              capture requires)
  compile     torch.compile (mode "default") of forward + loss (the backward
              compiled with it by AOTAutograd), fused SGD eager; validation
              forward compiled separately; compile times reported apart
  inductor-graph
              forward + loss through torch.compile (mode
              "max-autotune-no-cudagraphs": Inductor's fused Triton kernels,
              convolutions and matmuls autotuned against the aten ones), the
              backward compiled with it by AOTAutograd; then, as graph, the
              whole step (compiled forward and backward, the fused SGD, loss
              accumulation) captured by hand after the warm-up steps (where
              compilation and all autotuning happen, never under capture)
              and replayed after the gather. SGD keeps no step count, so its
              fused kernel needs no capturable flag. The compiled graph
              updates BatchNorm's running statistics in place; the first
              replay checks that they and every parameter changed
  inductor-graph-bf16
              as inductor-graph under bf16 autocast, entered around the
              compiled call (weight-cast cache off, as capture requires):
              Dynamo traces the casts into the graph and Inductor fuses them
              into their neighbours, the same step as autocast inside it
  max-autotune
              torch.compile (mode "max-autotune") of forward + loss: the
              same kernels with Inductor's own CUDA graphs (cudagraph trees,
              a step begun before every forward), fused SGD eager;
              inductor_cudagraph_skips counts the graphs Inductor declined
              to run as CUDA graphs

The record's params (compile_modes) keep each compiled mode's Inductor
options. compile_s is the first training step's seconds (compilation and
autotuning), compile_validation_s the first validation's, both apart from the
epoch times (the first epoch, a warm-up, holds them). Compiled modes validate
with torch.compile (mode "default") of the evaluation forward. Inductor's
on-disk caches (TORCHINDUCTOR_CACHE_DIR) from earlier runs, and autotuning
results of earlier modes of this run, shorten compile times (the metrics
fxgraph_cache_hits / _misses say which); Dynamo is reset after every
compiled mode. On the CPU the CUDA-only modes are recorded as
skipped, with the reason.

Epoch time is host wall time of the whole epoch: permutation, gathers,
every step, and the one readback of the epoch's summed loss (the only sync).
Validation runs after every epoch and is timed apart.

Usage:
  tolaria_fmnist.py [--merge-into RECORD.json] [--out RECORD.json]
                    [--data-dir DIR | --synthetic] [--quick]
                    [--epochs N] [--warmup-epochs N] [--modes a,b]

--data-dir defaults to $ESPER_FASHION_MNIST_DIR, then the Debian package's
folder /usr/share/datasets/fashion-mnist. --synthetic draws seeded random images
(class prototype plus noise) and labels of the real sizes, for machines
without the files.
With --merge-into, the results (impl "python") replace the python results of
an existing record written by `esper bench`; --out writes a standalone record
of the same shape.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import json
import math
import os
import platform
import struct
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

WORKLOAD = "tolaria-fmnist"
DIR_ENV = "ESPER_FASHION_MNIST_DIR"
DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
SIDE = 28
N_CLASSES = 10
N_TRAIN = 60_000
N_TEST = 10_000
MEAN = 0.2860
STD = 0.3530

BATCH = 256
HOST_CHANNELS = (8, 16, 32)
KERNEL = 3
NORM_EPS = 1e-5
BATCH_NORM_MOMENTUM = 0.1
ALPHA = 0.5
ATTENTION_REDUCTION = 4
ATTENTION_GATE_BIAS = 3.0
HOST_LR, HOST_MOMENTUM = 0.01, 0.9
SEED_LR, SEED_MOMENTUM = 0.01, 0.9  # tolaria::optim::{SEED_LEARNING_RATE, SEED_MOMENTUM}
INIT_SEED = 20251001
DATA_SEED = 20251002
GRAPH_WARMUP_STEPS = 3


@dataclass(frozen=True)
class Mode:
    """How one record mode runs the training step."""

    bf16: bool = False
    # The whole training step captured by hand in one torch.cuda.CUDAGraph.
    graphed: bool = False
    # torch.compile mode of forward + loss (None: eager).
    compile_mode: str | None = None
    # Why the mode cannot run on the CPU (None: it can).
    needs_cuda: str | None = None

    @property
    def inductor_cudagraphs(self) -> bool:
        """Inductor records its own CUDA graphs (cudagraph trees)."""
        return self.compile_mode in ("reduce-overhead", "max-autotune")

    @property
    def cuda_graphs(self) -> str:
        if self.graphed:
            return "the whole step, captured by hand"
        return "Inductor's (cudagraph trees)" if self.inductor_cudagraphs else "none"


HAND_GRAPH = "CUDA graphs need a CUDA device"
MODES = {
    "eager": Mode(),
    "eager-bf16": Mode(bf16=True),
    "graph": Mode(graphed=True, needs_cuda=HAND_GRAPH),
    "graph-bf16": Mode(bf16=True, graphed=True, needs_cuda=HAND_GRAPH),
    "compile": Mode(compile_mode="default"),
    "inductor-graph": Mode(graphed=True, compile_mode="max-autotune-no-cudagraphs", needs_cuda=HAND_GRAPH),
    "inductor-graph-bf16": Mode(bf16=True, graphed=True, compile_mode="max-autotune-no-cudagraphs",
                                needs_cuda=HAND_GRAPH),
    "max-autotune": Mode(compile_mode="max-autotune",
                         needs_cuda="Inductor's CUDA graphs and Triton autotuning need a CUDA device"),
}
ALL_MODES = list(MODES)


def group_norm_groups(channels: int) -> int:
    """kasmina::blueprint::group_norm_groups: the largest of 32/16/8/4/2/1
    dividing C with at least 16 channels a group, else the largest dividing C."""
    candidates = (32, 16, 8, 4, 2, 1)
    for g in candidates:
        if channels % g == 0 and channels // g >= 16:
            return g
    return next(g for g in candidates if channels % g == 0)


PARAMS = {
    "host": {"config": "CnnHostConfig::fashion_mnist", "in_channels": 1, "input_size": SIDE,
             "channels": list(HOST_CHANNELS), "kernel_size": KERNEL, "pool_layers": 3,
             "norm": "batch_norm", "n_classes": N_CLASSES},
    "seeds": [
        {"slot": "r0c1", "blueprint": "conv_light", "channels": 16, "group_norm_groups": group_norm_groups(16),
         "blend": "add", "alpha": ALPHA, "gradient_isolation": True},
        {"slot": "r0c2", "blueprint": "attention", "channels": 32,
         "reduction_width": 32 // ATTENTION_REDUCTION, "gate_bias_init": ATTENTION_GATE_BIAS,
         "blend": "add", "alpha": ALPHA, "gradient_isolation": True},
    ],
    "optimizers": {"host": {"sgd": {"learning_rate": HOST_LR, "momentum": HOST_MOMENTUM}},
                   "seed": {"sgd": {"learning_rate": SEED_LR, "momentum": SEED_MOMENTUM}},
                   "groups": ["host", "seed r0c1", "seed r0c2"], "fused_on_cuda": True,
                   "python": "one torch.optim.SGD with the three groups"},
    "loss": "softmax cross-entropy, mean",
    "batch_size": BATCH,
    "train_samples": N_TRAIN,
    "drop_last": True,
    "steps_per_epoch": N_TRAIN // BATCH,
    "train_samples_per_epoch": (N_TRAIN // BATCH) * BATCH,
    "validation_samples": N_TEST,
    "validation_batch": N_TEST,
    "normalisation": {"mean": MEAN, "std": STD},
    "shuffle": "torch.randperm on the device every epoch",
    "memory_format": "channels_last",
    "tf32": True,
    "cudnn_benchmark": True,
    "init_seed": INIT_SEED,
    "graph_warmup_steps": GRAPH_WARMUP_STEPS,
}


# -- data ------------------------------------------------------------------

class DataError(Exception):
    """A data problem the user can act on (printed without a traceback)."""


def data_dir(arg: str | None) -> str:
    return arg or os.environ.get(DIR_ENV) or DEFAULT_DIR


def read_idx(path: str, magic: int, item_dims: tuple[int, ...]) -> torch.Tensor:
    """One gzipped IDX file as a uint8 tensor [n, *item_dims] (header checked first)."""
    try:
        with gzip.open(path, "rb") as handle:
            header = handle.read(4 + 4 * (1 + len(item_dims)))
            if len(header) < 8:
                raise DataError(f"{path}: truncated IDX header")
            (found,) = struct.unpack(">I", header[:4])
            if found != magic:
                raise DataError(f"{path}: IDX magic {found:#010x}, expected {magic:#010x}")
            dims = struct.unpack(f">{1 + len(item_dims)}I", header[4:])
            if tuple(dims[1:]) != item_dims:
                raise DataError(f"{path}: item shape {tuple(dims[1:])}, expected {item_dims}")
            count = dims[0]
            expected = count * math.prod(item_dims)
            body = handle.read(expected + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DataError(f"{path}: cannot be read as a gzipped IDX file ({error})") from None
    if len(body) != expected:
        raise DataError(f"{path}: {len(body)} data bytes, the header promises {expected}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).view(count, *item_dims)


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 28, 28] -> float32 [n, 1, 28, 28], (byte / 255 - mean) / std (as tolaria::data)."""
    images = pixels.to(torch.float32).div_(255.0)
    images.sub_(torch.tensor(MEAN, dtype=torch.float32)).div_(torch.tensor(STD, dtype=torch.float32))
    return images.unsqueeze(1)


def load_fashion_mnist(directory: str):
    missing = [name for name in FILES.values() if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise DataError(
            f"Fashion-MNIST not found in {directory}: missing {', '.join(missing)}. "
            f"Point --data-dir or ${DIR_ENV} at the folder holding the four gzipped IDX files, "
            "install Debian's dataset-fashion-mnist package, or pass --synthetic.")
    path = {key: os.path.join(directory, name) for key, name in FILES.items()}
    train_x = read_idx(path["train_images"], IMAGES_MAGIC, (SIDE, SIDE))
    train_y = read_idx(path["train_labels"], LABELS_MAGIC, ())
    test_x = read_idx(path["test_images"], IMAGES_MAGIC, (SIDE, SIDE))
    test_y = read_idx(path["test_labels"], LABELS_MAGIC, ())
    for images, labels, what in ((train_x, train_y, "training"), (test_x, test_y, "test")):
        if images.shape[0] != labels.shape[0]:
            raise DataError(f"{directory}: {images.shape[0]} {what} images but {labels.shape[0]} labels")
        if labels.numel() and int(labels.max()) >= N_CLASSES:
            raise DataError(f"{directory}: {what} label {int(labels.max())} is not below {N_CLASSES}")
    return (normalise(train_x), train_y.long()), (normalise(test_x), test_y.long())


def synthetic_data(n_train: int = N_TRAIN, n_test: int = N_TEST):
    """Random data of the real sizes (seeded): each image the mean of its
    class's random prototype and uniform noise, so that it can be learnt (a
    training bug shows as accuracy that does not rise)."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    prototypes = torch.randint(0, 256, (N_CLASSES, SIDE, SIDE), dtype=torch.int32, generator=gen)
    def draw(n):
        labels = torch.randint(0, N_CLASSES, (n,), dtype=torch.int64, generator=gen)
        noise = torch.randint(0, 256, (n, SIDE, SIDE), dtype=torch.int32, generator=gen)
        pixels = ((prototypes[labels] + noise) // 2).to(torch.uint8)
        return normalise(pixels), labels
    return draw(n_train), draw(n_test)


# -- the network -------------------------------------------------------------

def _node(**tensors) -> nn.Module:
    """A namespace module holding parameters (nn.Parameter) and buffers (tensors)."""
    module = nn.Module()
    for name, tensor in tensors.items():
        if isinstance(tensor, nn.Parameter):
            module.register_parameter(name, tensor)
        else:
            module.register_buffer(name, tensor)
    return module


def _uniform(shape, fan_in: int) -> nn.Parameter:
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class FmnistNet(nn.Module):
    """CnnHost(fashion_mnist) with conv_light at r0c1 and attention at r0c2.

    Parameter names follow the Rust VarStores: host `block{i}.conv.weight`,
    `block{i}.bn.{weight,bias,running_mean,running_var}`,
    `classifier.{weight,bias}`; seed r0c1 `enhance.conv.weight`,
    `enhance.gn.{weight,bias}`; seed r0c2 `fc1.weight`, `fc2.{weight,bias}`.
    The forward is functional (F.*) over those tensors: no per-layer module
    call overhead in eager mode.
    """

    def __init__(self) -> None:
        super().__init__()
        host = nn.Module()
        in_channels = 1
        for index, channels in enumerate(HOST_CHANNELS):
            block = nn.Module()
            block.conv = _node(weight=_uniform((channels, in_channels, KERNEL, KERNEL), in_channels * KERNEL * KERNEL))
            block.bn = _node(weight=nn.Parameter(torch.ones(channels)), bias=nn.Parameter(torch.zeros(channels)),
                             running_mean=torch.zeros(channels), running_var=torch.ones(channels))
            host.add_module(f"block{index}", block)
            in_channels = channels
        host.classifier = _node(weight=_uniform((N_CLASSES, in_channels), in_channels),
                                bias=_uniform((N_CLASSES,), in_channels))
        self.host = host

        c1 = HOST_CHANNELS[1]
        self.gn_groups = group_norm_groups(c1)
        conv_light = nn.Module()
        conv_light.enhance = nn.Module()
        conv_light.enhance.conv = _node(weight=_uniform((c1, c1, 3, 3), c1 * 9))
        conv_light.enhance.gn = _node(weight=nn.Parameter(torch.ones(c1)), bias=nn.Parameter(torch.zeros(c1)))
        self.seed_r0c1 = conv_light

        c2 = HOST_CHANNELS[2]
        r = max(1, c2 // ATTENTION_REDUCTION)
        attention = nn.Module()
        attention.fc1 = _node(weight=_uniform((r, c2), c2))
        # Built as a Linear (uniform draws consumed), then zeroed and the bias
        # filled with the gate bias: kasmina's order of initialisation.
        fc2_weight, fc2_bias = _uniform((c2, r), r), _uniform((c2,), r)
        with torch.no_grad():
            fc2_weight.zero_()
            fc2_bias.fill_(ATTENTION_GATE_BIAS)
        attention.fc2 = _node(weight=fc2_weight, bias=fc2_bias)
        self.seed_r0c2 = attention

    def groups(self):
        """The three parameter groups: host, seed r0c1, seed r0c2."""
        return [list(self.host.parameters()), list(self.seed_r0c1.parameters()),
                list(self.seed_r0c2.parameters())]

    @staticmethod
    def _block(block, x, training: bool):
        x = F.conv2d(x, block.conv.weight, None, 1, KERNEL // 2)
        x = F.batch_norm(x, block.bn.running_mean, block.bn.running_var, block.bn.weight, block.bn.bias,
                         training, BATCH_NORM_MOMENTUM, NORM_EPS)
        # In place: BatchNorm's backward needs its input, not its output.
        return F.relu(x, inplace=True)

    def _conv_light(self, x):
        enhance = self.seed_r0c1.enhance
        r = F.conv2d(x, enhance.conv.weight, None, 1, 1)
        r = F.group_norm(r, self.gn_groups, enhance.gn.weight, enhance.gn.bias, NORM_EPS)
        return x + F.relu(r)

    def _attention(self, x):
        seed = self.seed_r0c2
        pooled = x.mean((2, 3))                                      # [B, C]
        hidden = F.relu(F.linear(pooled, seed.fc1.weight))           # [B, r]
        gate = torch.sigmoid(F.linear(hidden, seed.fc2.weight, seed.fc2.bias))
        return x * gate[:, :, None, None]

    @staticmethod
    def _blend(host, seed):
        # kasmina::blend::blend_add: the seed output in the host's dtype, lerp.
        return torch.lerp(host, seed.to(host.dtype), ALPHA)

    def forward(self, x, training: bool = True):
        host = self.host
        x = nhwc_single_channel(x)
        x = self._block(host.block0, x, training)                    # r0c0: 8 x 28 x 28
        x = F.max_pool2d(x, 2)                                       # r1c0: 8 x 14 x 14
        x = self._block(host.block1, x, training)                    # r0c1: 16 x 14 x 14
        # Gradient isolation: the seed reads the features detached. (Rust
        # also makes them contiguous, a no-op there on a contiguous tensor;
        # here they are contiguous in channels_last, so no copy either.)
        x = self._blend(x, self._conv_light(x.detach()))
        x = F.max_pool2d(x, 2)                                       # r1c1: 16 x 7 x 7
        x = self._block(host.block2, x, training)                    # r0c2: 32 x 7 x 7
        x = self._blend(x, self._attention(x.detach()))
        x = F.max_pool2d(x, 2)                                       # r1c2: 32 x 3 x 3
        pooled = x.mean((2, 3))                                      # [B, 32]
        return F.linear(pooled, host.classifier.weight, host.classifier.bias)


def nhwc_single_channel(t: torch.Tensor) -> torch.Tensor:
    """A `[N, 1, H, W]` tensor is contiguous in both layouts, so
    `.contiguous(memory_format=torch.channels_last)` leaves its NCHW strides and
    cuDNN runs the first block with NCHW kernels plus layout conversions. A view
    with NHWC strides (same memory) makes it take the NHWC kernels from the first
    layer on; the Rust side does the same (torch-ext `memory`)."""
    if t.dim() == 4 and t.shape[1] == 1 and t.is_contiguous() and t.stride(1) != 1:
        return t.as_strided(t.shape, (t.shape[2] * t.shape[3], 1, t.shape[3], 1))
    return t


def build_model(device: torch.device, channels_last: bool = True) -> FmnistNet:
    """The network with its seeded initialisation (the same in every mode)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        model = FmnistNet()
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.data = nhwc_single_channel(parameter.data)
    return model


def build_optimizers(model: FmnistNet, fused: bool):
    """One SGD over the three parameter groups, each with its own settings:
    the same update as one optimizer a group, in one step() call (fewer
    Python calls an eager step)."""
    host, seed1, seed2 = model.groups()
    kwargs = {"fused": True} if fused else {}
    return [
        torch.optim.SGD(
            [
                {"params": host, "lr": HOST_LR, "momentum": HOST_MOMENTUM},
                {"params": seed1, "lr": SEED_LR, "momentum": SEED_MOMENTUM},
                {"params": seed2, "lr": SEED_LR, "momentum": SEED_MOMENTUM},
            ],
            lr=HOST_LR,
            **kwargs,
        )
    ]


# -- training ----------------------------------------------------------------

def percentile(samples, percent):
    """Nearest-rank percentile, as leyline::baseline::percentile."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = math.ceil(percent / 100.0 * len(ordered))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


class Trainer:
    """One mode's model, optimizers, device buffers and epoch loop."""

    def __init__(self, mode: str, data, device: torch.device, steps_per_epoch: int) -> None:
        (train_x, train_y), (test_x, test_y) = data
        spec = MODES[mode]
        self.mode = mode
        self.device = device
        self.cuda = device.type == "cuda"
        self.bf16 = spec.bf16
        self.graphed = spec.graphed
        self.compiled = spec.compile_mode is not None
        self.inductor_cudagraphs = spec.inductor_cudagraphs
        if spec.needs_cuda and not self.cuda:
            raise RuntimeError(f"{spec.needs_cuda}; this run is on the CPU")
        self.model = build_model(device)
        self.optimizers = build_optimizers(self.model, fused=self.cuda)
        self.params = [p for group in self.model.groups() for p in group]
        self.train_x, self.train_y = train_x, train_y
        self.test_x, self.test_y = test_x, test_y
        self.n_train = train_x.shape[0]
        self.steps = steps_per_epoch
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(DATA_SEED)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        if self.graphed:
            # The graph's static inputs: every step gathers its batch into them.
            self.static_x = torch.empty((BATCH, *train_x.shape[1:]), dtype=train_x.dtype, device=device)
            self.static_y = torch.empty((BATCH,), dtype=train_y.dtype, device=device)
        else:
            # The epoch's shuffled copy: one gather an epoch, steps read slices.
            self.epoch_x = torch.empty_like(train_x)
            self.epoch_y = torch.empty_like(train_y)
        self.graph = None
        self.eager_steps_left = GRAPH_WARMUP_STEPS
        self.capture_ms = None
        self.first_step_s = None
        self.first_validation_s = None
        self.train_fn = self.forward_loss
        self.eval_fn = self.eval_logits
        if self.compiled:
            # Static shapes (every batch is 256, the validation batch 10,000).
            # The evaluation forward: Inductor's default mode in every
            # compiled mode (it runs once an epoch; no CUDA graphs).
            self.train_fn = torch.compile(self.forward_loss, mode=spec.compile_mode, dynamic=False)
            self.eval_fn = torch.compile(self.eval_logits, dynamic=False)

    def autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        # Captured graphs replay the casts themselves: no weight-cast cache.
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=not self.graphed)

    # the step ---------------------------------------------------------------
    def forward_loss(self, x, y):
        return F.cross_entropy(self.model(x, True), y)

    def eval_logits(self, x):
        return self.model(x, False)

    def step(self, x, y):
        if self.inductor_cudagraphs:
            # A new iteration: the previous step's graph outputs may be reused.
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast():
            loss = self.train_fn(x, y)
        loss.backward()
        for optimizer in self.optimizers:
            optimizer.step()
        loss = loss.detach()
        self.loss_sum.add_(loss)
        return loss

    def zero_grads(self):
        for p in self.params:
            p.grad = None

    def eager_step(self, x, y):
        loss = self.step(x, y)
        self.zero_grads()
        return loss

    def graph_step(self, x_index):
        """Gathers the batch into the static buffers, then eager / capture / replay."""
        torch.index_select(self.train_x, 0, x_index, out=self.static_x)
        torch.index_select(self.train_y, 0, x_index, out=self.static_y)
        if self.graph is not None:
            self.graph.replay()
        elif self.eager_steps_left > 0:
            # Warm-up on the stream the capture uses (cudnn benchmark, cuBLAS
            # handles, momentum buffers all made here).
            self.eager_steps_left -= 1
            self.eager_step(self.static_x, self.static_y)
        else:
            self.capture()

    def capture(self) -> None:
        """Captures the whole step (eager or compiled, as the mode's train_fn)
        on the current stream, then replays it as this step, checking that
        the replay trained the model in place."""
        self.zero_grads()  # grads are allocated by the captured backward, in the graph's pool
        torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream(self.device)):
            self.step(self.static_x, self.static_y)
        self.capture_ms = (time.perf_counter() - started) * 1e3
        self.graph = graph
        before = self.model_snapshot()
        graph.replay()
        self.check_trained_in_place(before)

    def model_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer (BatchNorm's running statistics) by name."""
        return {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}

    def model_snapshot(self) -> dict[str, tuple[int, torch.Tensor]]:
        return {name: (t.data_ptr(), t.detach().clone()) for name, t in self.model_tensors().items()}

    def check_trained_in_place(self, before: dict[str, tuple[int, torch.Tensor]]) -> None:
        """A replayed step must change every parameter (the SGD step) and every
        BatchNorm running statistic (the forward's buffer update) in place: a
        captured graph that wrote copies (a compiled module returning its
        buffer updates, say) would train nothing on replay."""
        stale = [name for name, t in self.model_tensors().items()
                 if t.data_ptr() != before[name][0] or torch.equal(t.detach(), before[name][1])]
        if stale:
            raise RuntimeError(f"a replay of the captured step left unchanged (or moved): {', '.join(stale)}")

    def check_static_gather(self):
        """index_select(out=) must write the static buffers in place (the graph reads them)."""
        pointers = (self.static_x.data_ptr(), self.static_y.data_ptr())
        index = torch.arange(BATCH, device=self.device)
        torch.index_select(self.train_x, 0, index, out=self.static_x)
        torch.index_select(self.train_y, 0, index, out=self.static_y)
        if pointers != (self.static_x.data_ptr(), self.static_y.data_ptr()):
            raise RuntimeError("index_select(out=) reallocated a static graph input")

    # epochs -----------------------------------------------------------------
    def epoch(self, time_first_step: bool = False):
        """One training epoch; returns (wall ms, mean train loss)."""
        started = time.perf_counter()
        perm = torch.randperm(self.n_train, device=self.device, generator=self.generator)
        self.loss_sum.zero_()
        if not self.graphed:
            torch.index_select(self.train_x, 0, perm, out=self.epoch_x)
            torch.index_select(self.train_y, 0, perm, out=self.epoch_y)
        for step in range(self.steps):
            lo = step * BATCH
            if self.graphed:
                self.graph_step(perm[lo:lo + BATCH])
            else:
                self.eager_step(self.epoch_x[lo:lo + BATCH], self.epoch_y[lo:lo + BATCH])
            if time_first_step and step == 0:
                # The first step (a compiled mode's compilation and autotuning).
                self.sync()
                self.first_step_s = time.perf_counter() - started
        loss = self.loss_sum.item() / self.steps  # the epoch's one readback (a sync)
        return (time.perf_counter() - started) * 1e3, loss

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def validate(self):
        """Loss and accuracy on the test set; returns (ms, loss, accuracy)."""
        self.sync()
        started = time.perf_counter()
        with torch.inference_mode(), self.autocast():
            logits = self.eval_fn(self.test_x)
            loss = F.cross_entropy(logits.float(), self.test_y)
            correct = (logits.argmax(1) == self.test_y).sum()
            loss_value, correct_value = torch.stack([loss, correct.float()]).tolist()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        return elapsed_ms, loss_value, correct_value / self.test_x.shape[0]

    # extras (after the measured epochs) ---------------------------------------
    def replay_us_per_step(self, replays: int = 200) -> float | None:
        if self.graph is None:
            return None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / replays

    def kernel_profile(self):
        """CUDA kernels (and their summed device time) of one training step."""
        from torch.profiler import ProfilerActivity, profile
        x, y = self.train_x[:BATCH], self.train_y[:BATCH]
        self.sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            if self.graph is not None:
                self.graph.replay()
            else:
                self.eager_step(x, y)
            self.sync()
        kernels, copies, busy_us = 0, 0, 0.0
        for event in prof.events():
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            name = event.name.lower()
            if name.startswith("memcpy") or name.startswith("memset"):
                copies += 1
            else:
                kernels += 1
            busy_us += event.time_range.elapsed_us()
        return kernels, copies, busy_us


# Compiled modes' metrics from Dynamo's counters: (group, counter) by metric.
COMPILE_COUNTERS = {
    # Graphs Inductor ran without its CUDA graphs (modes with cudagraph trees).
    "inductor_cudagraph_skips": ("inductor", "cudagraph_skips"),
    # Inductor's FX-graph cache: hits mean a shorter compile_s than cold.
    "fxgraph_cache_hits": ("inductor", "fxgraph_cache_hit"),
    "fxgraph_cache_misses": ("inductor", "fxgraph_cache_miss"),
}


def compile_counters() -> dict[str, int]:
    """COMPILE_COUNTERS' values so far in this process (empty where this
    torch keeps no such counters: they are private)."""
    try:
        from torch._dynamo.utils import counters
        return {metric: int(counters[group][name]) for metric, (group, name) in COMPILE_COUNTERS.items()}
    except Exception:
        return {}


def run_mode(mode: str, data, device: torch.device, args) -> dict:
    trainer = Trainer(mode, data, device, args.steps_per_epoch)
    metrics = {}
    counted = compile_counters()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        metrics["device_memory_at_start_bytes"] = torch.cuda.memory_allocated(device)
    stream = torch.cuda.Stream(device) if cuda else None
    epochs, validations = [], []
    last = None
    warmup_peak = 0
    with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
        if trainer.graphed:
            trainer.check_static_gather()
        for index in range(args.warmup_epochs + args.epochs):
            warm = index < args.warmup_epochs
            if cuda and index == args.warmup_epochs:
                # The warm-up's peak (cudnn benchmark tries workspaces for every
                # new shape, the first validation's batch of 10,000 among them)
                # is kept apart from the measured epochs' peak.
                warmup_peak = torch.cuda.max_memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            epoch_ms, train_loss = trainer.epoch(time_first_step=(index == 0))
            val_ms, val_loss, val_accuracy = trainer.validate()
            if index == 0:
                metrics["first_epoch_ms"] = epoch_ms
                metrics["first_validation_ms"] = val_ms
            if not warm:
                epochs.append(epoch_ms)
                validations.append(val_ms)
            last = (train_loss, val_loss, val_accuracy)
            log(f"[python {mode}] epoch {index + 1}/{args.warmup_epochs + args.epochs}"
                f"{' (warm-up)' if warm else ''}: {epoch_ms:.1f} ms, train loss {train_loss:.4f}, "
                f"val {val_ms:.1f} ms, val accuracy {val_accuracy:.4f}")
        p50 = percentile(epochs, 50)
        metrics.update(
            epoch_ms_p50=p50,
            epoch_ms_p95=percentile(epochs, 95),
            epoch_ms_mean=sum(epochs) / len(epochs) if epochs else None,
            samples_per_s=(trainer.steps * BATCH) / (p50 / 1e3) if p50 else None,
            validation_ms_p50=percentile(validations, 50),
            validation_ms_p95=percentile(validations, 95),
            capture_ms=trainer.capture_ms,
            measured_epochs=len(epochs),
            steps_per_epoch=trainer.steps,
            train_samples_per_epoch=trainer.steps * BATCH,
        )
        if trainer.compiled:
            metrics["compile_s"] = trainer.first_step_s
            metrics["compile_validation_s"] = metrics["first_validation_ms"] / 1e3
        elif trainer.first_step_s is not None:
            metrics["first_step_ms"] = trainer.first_step_s * 1e3
        if trainer.compiled:
            for metric, value in compile_counters().items():
                if metric in counted and (trainer.inductor_cudagraphs or metric != "inductor_cudagraph_skips"):
                    metrics[metric] = value - counted[metric]
        if last is not None:
            metrics["final_train_loss"], metrics["val_loss"], metrics["val_accuracy"] = last
        if cuda:
            measured_peak = torch.cuda.max_memory_allocated(device)
            metrics["peak_memory_measured_epochs_bytes"] = measured_peak
            metrics["peak_memory_bytes"] = max(measured_peak, warmup_peak)  # the whole mode
            # After the measured epochs (these extras train further).
            replay_us = trainer.replay_us_per_step()
            if replay_us is not None:
                metrics["replay_us_per_step"] = replay_us
                metrics["replay_ms_per_epoch"] = replay_us * trainer.steps / 1e3
            if args.kernels:
                try:
                    kernels, copies, busy_us = trainer.kernel_profile()
                    if kernels:
                        metrics["kernels_per_step"] = kernels
                        metrics["memcpy_memset_per_step"] = copies
                        metrics["gpu_busy_ms_per_epoch"] = busy_us * trainer.steps / 1e3
                except Exception as error:  # the profiler is an extra: never fail the mode
                    log(f"[python {mode}] kernel profile skipped: {type(error).__name__}: {error}")
    return {k: float(v) for k, v in metrics.items() if v is not None}


# -- records -----------------------------------------------------------------

def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _command(*argv) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip().splitlines()[0] or None
    except Exception:  # absent tool, no repository: the field says unknown
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def python_environment(device: torch.device) -> dict:
    return {
        "python_torch": torch.__version__,
        "python_cuda": torch.version.cuda or "n/a",
        "python_device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "python_version": sys.version.split()[0],
    }


def standalone_record(device: torch.device, label: str, params: dict, results: list) -> dict:
    cuda = device.type == "cuda"
    environment = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "n/a",
        "driver": (_command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
                   if cuda else None) or "n/a",
        "cpu": cpu_name(),
        "git_rev": _command("git", "rev-parse", "--short=12", "HEAD") or "unknown",
        "tf32": True,
        "amp": "off",  # the bf16 modes say "amp": "bf16" in their result entries
    }
    environment.update(python_environment(device))
    return {"schema": 1, "workload": WORKLOAD, "label": label, "environment": environment,
            "params": params, "results": results, "telemetry_names": []}


def write_json(path: str, value) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)


def write_records(args, device, params, results) -> None:
    if args.merge_into:
        with open(args.merge_into, encoding="utf-8") as handle:
            record = json.load(handle)
        if record.get("workload") not in (None, WORKLOAD):
            raise DataError(f"{args.merge_into} is a {record.get('workload')} record, not {WORKLOAD}")
        # This run's mode names replace the python entries of the same names,
        # so the modes can be measured in separate runs into one record.
        names = {entry["mode"] for entry in results}
        record["results"] = [r for r in record.get("results", [])
                             if r.get("impl") != "python" or r.get("mode") not in names] + results
        record.setdefault("environment", {}).update(python_environment(device))
        peer = record.setdefault("params", {}).get("python_peer") or {}
        compiled = {**peer.get("compile_modes", {}), **params.get("compile_modes", {})} \
            if isinstance(peer.get("compile_modes"), dict) else params.get("compile_modes")
        record["params"]["python_peer"] = {**params, **({"compile_modes": compiled} if compiled else {})}
        write_json(args.merge_into, record)
    if args.out:
        write_json(args.out, standalone_record(device, args.label, params, results))


TABLE = [("epoch_ms_p50", "p50 ms", 1), ("epoch_ms_p95", "p95 ms", 1), ("samples_per_s", "samples/s", 0),
         ("validation_ms_p50", "val ms", 2), ("capture_ms", "capture ms", 1), ("compile_s", "compile s", 1),
         ("replay_ms_per_epoch", "replay ms", 1), ("kernels_per_step", "kernels", 0),
         ("peak_memory_bytes", "peak MiB", -1), ("final_train_loss", "loss", 4), ("val_accuracy", "val acc", 4)]


def print_table(results: list, device_name: str) -> None:
    print(f"\n{WORKLOAD} python peer on {device_name} (torch {torch.__version__})")
    width = max([len("mode"), *(len(entry["mode"]) for entry in results)])
    print(f"{'mode':<{width}}" + "".join(f" {title:>10}" for _, title, _ in TABLE))
    for entry in results:
        line = f"{entry['mode']:<{width}}"
        if entry.get("error"):
            line += " error: " + entry["error"].splitlines()[0][:110]
        else:
            for key, _, digits in TABLE:
                value = entry["metrics"].get(key)
                if value is None:
                    line += f" {'-':>10}"
                elif digits < 0:
                    line += f" {value / 2**20:>10.1f}"
                else:
                    line += f" {value:>10.{digits}f}"
        print(line)


def compile_modes(modes: list[str]) -> dict:
    """For the record's params: each compiled mode's torch.compile mode and
    the Inductor options it sets (as this torch defines the mode)."""
    described = {}
    for mode in modes:
        compile_mode = MODES[mode].compile_mode
        if compile_mode is None:
            continue
        try:
            from torch._inductor import list_mode_options
            options = list_mode_options(compile_mode)
        except Exception:  # described by name only where this torch cannot list it
            options = None
        described[mode] = {"torch_compile_mode": compile_mode, "inductor_options": options,
                           "cuda_graphs": MODES[mode].cuda_graphs,
                           "validation": "torch.compile, mode default"}
    return described


def run_entry(mode: str, data, device: torch.device, args) -> dict:
    """One mode's result entry: its metrics, or why it has none (skipped on
    the CPU, or failed: one failing mode never loses the others)."""
    spec = MODES[mode]
    entry = {"impl": "python", "mode": mode, "amp": "bf16" if spec.bf16 else "off", "metrics": {}}
    if spec.needs_cuda and device.type != "cuda":
        entry["error"] = f"{spec.needs_cuda}; this run is on the CPU"
        log(f"[python {mode}] skipped: {entry['error']}")
        return entry
    try:
        entry["metrics"] = run_mode(mode, data, device, args)
    except Exception as error:  # recorded honestly: a failing mode is a result
        message = f"{type(error).__name__}: {error}".strip()
        first_lines = "\n".join(message.splitlines()[:6])
        log(f"[python {mode}] failed: {first_lines}")
        traceback.print_exc(limit=4, file=sys.stderr)
        entry["error"] = first_lines[:2000]
    try:
        if spec.compile_mode is not None:
            # Frees the mode's compiled code and Inductor's CUDA graph pools
            # (cudagraph trees) before the next mode's memory is measured.
            torch.compiler.reset()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as error:  # a broken mode must not hide the next ones
        log(f"[python {mode}] device left in error state: {error}")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merge-into", help="replace the python results of this baseline record")
    parser.add_argument("--out", help="write a standalone record (DESIGN section 7 shape) here")
    parser.add_argument("--label", default=f"python-{datetime.date.today().isoformat()}",
                        help="label of a standalone record")
    parser.add_argument("--data-dir", help=f"the four gzipped IDX files (default ${DIR_ENV}, then {DEFAULT_DIR})")
    parser.add_argument("--synthetic", action="store_true", help="random data of the real sizes")
    parser.add_argument("--quick", action="store_true", help="2 measured epochs after 1 warm-up")
    parser.add_argument("--epochs", type=int, help="measured epochs (default 5; --quick 2)")
    parser.add_argument("--warmup-epochs", type=int, help="warm-up epochs (default 1)")
    parser.add_argument("--steps-per-epoch", type=int,
                        help="fewer steps an epoch, for smoke tests (default: 234, all full batches)")
    parser.add_argument("--modes", default=",".join(ALL_MODES))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-kernels", dest="kernels", action="store_false",
                        help="skip the one-step kernel profile")
    args = parser.parse_args()
    args.epochs = args.epochs if args.epochs is not None else (2 if args.quick else 5)
    args.warmup_epochs = args.warmup_epochs if args.warmup_epochs is not None else 1
    full_steps = N_TRAIN // BATCH
    args.steps_per_epoch = min(args.steps_per_epoch or full_steps, full_steps)
    if args.epochs < 1 or args.warmup_epochs < 0 or args.steps_per_epoch < 1:
        parser.error("--epochs must be >= 1, --warmup-epochs >= 0, --steps-per-epoch >= 1")
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(ALL_MODES)}")

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")

    params = dict(PARAMS)
    try:
        if args.synthetic:
            source = "synthetic (seeded: class prototype plus noise, the real sizes)"
            data = synthetic_data()
        else:
            directory = data_dir(args.data_dir)
            source = f"fashion-mnist ({'--data-dir' if args.data_dir else DIR_ENV if os.environ.get(DIR_ENV) else 'default dir'})"
            data = load_fashion_mnist(directory)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    params["data"] = source
    if args.steps_per_epoch != full_steps:
        params["steps_per_epoch"] = args.steps_per_epoch
        params["train_samples_per_epoch"] = args.steps_per_epoch * BATCH
        params["note"] = "smoke run: fewer steps an epoch than the workload's 234"
    params["epochs"] = {"warmup": args.warmup_epochs, "measured": args.epochs}
    (train_x, train_y), (test_x, test_y) = data
    data = ((train_x.to(device), train_y.to(device)), (test_x.to(device), test_y.to(device)))
    log(f"[python] {WORKLOAD} on {device}: data {source}, {args.warmup_epochs} warm-up + {args.epochs} "
        f"measured epochs of {args.steps_per_epoch} steps, modes {', '.join(modes)}")

    if any(MODES[mode].compile_mode for mode in modes):
        params["compile_modes"] = compile_modes(modes)
    results = []
    for mode in modes:
        results.append(run_entry(mode, data, device, args))
        try:  # after every mode, so a run cut short keeps what it measured
            write_records(args, device, params, results)
        except (OSError, ValueError, DataError) as error:
            print(f"error: cannot write the record: {error}", file=sys.stderr)
            return 2
    if args.merge_into:
        log(f"merged {len(results)} python results into {args.merge_into}")
    if not args.merge_into and not args.out:
        json.dump(results, sys.stdout, indent=2)
        print()
    print_table(results, torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
