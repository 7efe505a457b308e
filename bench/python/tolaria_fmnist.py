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

This file holds the workload (data, model, step, validation, params); the
epoch loop, the hand-captured graph, the metrics and the records are
peer_common.py's, beside it.

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
of the same shape. Both targets are checked before the first mode runs (a
record that does not exist, or of another workload, is refused with exit code
2); a record that cannot be written later leaves the entries measured so far
on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from peer_common import (GRAPH_WARMUP_STEPS, HAND_GRAPH, DataError, Mode, StepTrainer, as_metrics,
                         describe_compile_mode, log, measure_mode, pick_device, run_entry, write_all)

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

class Trainer(StepTrainer):
    """One mode's model and optimizer around peer_common's epoch loop."""

    def __init__(self, mode: str, data, device: torch.device, steps_per_epoch: int) -> None:
        spec = MODES[mode]
        super().__init__(mode, spec, data, device, steps_per_epoch, BATCH, DATA_SEED)
        self.model = build_model(device)
        self.optimizers = build_optimizers(self.model, fused=self.cuda)
        self.params = [p for group in self.model.groups() for p in group]
        self.train_fn = self.forward_loss
        self.eval_fn = self.eval_logits
        if self.compiled:
            # Static shapes (every batch is 256, the validation batch 10,000).
            # The evaluation forward: Inductor's default mode in every
            # compiled mode (it runs once an epoch; no CUDA graphs).
            self.train_fn = torch.compile(self.forward_loss, mode=spec.compile_mode, dynamic=False)
            self.eval_fn = torch.compile(self.eval_logits, dynamic=False)

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

    def model_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter (the SGD step) and buffer (BatchNorm's running
        statistics, the forward's update) by name."""
        return {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}

    def validate(self):
        """Loss and accuracy on the test set; returns (ms, loss, accuracy)."""
        self.sync()
        started = time.perf_counter()
        with torch.inference_mode(), self.autocast():
            logits = self.eval_fn(self.val_x)
            loss = F.cross_entropy(logits.float(), self.val_y)
            correct = (logits.argmax(1) == self.val_y).sum()
            loss_value, correct_value = torch.stack([loss, correct.float()]).tolist()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        return elapsed_ms, loss_value, correct_value / self.val_x.shape[0]


def run_mode(mode: str, data, device: torch.device, args) -> dict:
    _, metrics = measure_mode(lambda: Trainer(mode, data, device, args.steps_per_epoch), mode, device, args,
                              lambda loss, accuracy: f"val accuracy {accuracy:.4f}")
    return as_metrics(metrics)


# -- records -----------------------------------------------------------------

TABLE = [("epoch_ms_p50", "p50 ms", 1), ("epoch_ms_p95", "p95 ms", 1), ("samples_per_s", "samples/s", 0),
         ("validation_ms_p50", "val ms", 2), ("capture_ms", "capture ms", 1), ("compile_s", "compile s", 1),
         ("replay_ms_per_epoch", "replay ms", 1), ("kernels_per_step", "kernels", 0),
         ("peak_memory_bytes", "peak MiB", -1), ("final_train_loss", "loss", 4), ("val_accuracy", "val acc", 4)]


def compile_modes(modes: list[str]) -> dict:
    """For the record's params: each compiled mode's torch.compile mode and
    the Inductor options it sets (as this torch defines the mode)."""
    described = {}
    for mode in modes:
        description = describe_compile_mode(MODES[mode])
        if description is not None:
            described[mode] = {**description, "validation": "torch.compile, mode default"}
    return described


def merge_params(record_params: dict, params: dict) -> None:
    """The record's python_peer params become this run's; its compiled
    modes' descriptions add to the ones already there."""
    peer = record_params.get("python_peer") or {}
    compiled = {**peer.get("compile_modes", {}), **params.get("compile_modes", {})} \
        if isinstance(peer.get("compile_modes"), dict) else params.get("compile_modes")
    record_params["python_peer"] = {**params, **({"compile_modes": compiled} if compiled else {})}


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

    device = pick_device(args.device)
    torch.backends.cudnn.benchmark = True

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
    return write_all(WORKLOAD, args, device, params, modes,
                     lambda mode: run_entry(mode, MODES[mode], device, lambda: run_mode(mode, data, device, args)),
                     TABLE, merge_params)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
