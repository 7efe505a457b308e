#!/usr/bin/env python3
"""Cross-check of the `tolaria-fmnist` Python peer against a second network.

A separately written, plain nn.Module version of the same network (module
per layer, no functional tricks, its own slot and blend code), started from
the peer's initial parameters (state_dict copied across by name), trains
side by side with the peer's own eager trainer on the CPU in fp32: 512
samples (the first ones of Fashion-MNIST when the files are there, else
seeded random ones), batches of 256, 3 SGD steps. The loss of every step, the
loss after the 3 steps and the evaluation loss (running statistics) must
agree within 1e-5, every parameter within 1e-5 of its scale
(max(1, max |value|)), BatchNorm's running statistics within 1e-3 of theirs
(see the comment where they are compared).

Usage: tolaria_fmnist_check.py [--data-dir DIR] [--synthetic]
Exit status 0 when everything agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import os
import struct
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tolaria_fmnist as peer  # noqa: E402  (the implementation under test)

TOLERANCE = 1e-5
BUFFER_TOLERANCE = 1e-3
SAMPLES = 512
BATCH = 256
STEPS = 3


# -- the second implementation ---------------------------------------------

class HostBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class ConvLight(nn.Module):
    """x + ReLU(GroupNorm(conv3x3(x)))."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        # At 16 channels kasmina's rule (at least 16 channels a group) gives 1 group.
        assert channels == 16
        self.gn = nn.GroupNorm(1, channels, eps=1e-5)

    def forward(self, x):
        return x + torch.relu(self.gn(self.conv(x)))


class SqueezeExcite(nn.Module):
    """x * sigmoid(fc2(ReLU(fc1(avgpool x)))), reduction 4."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(channels, channels // 4, bias=False)
        self.fc2 = nn.Linear(channels // 4, channels)

    def forward(self, x):
        w = torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean(dim=(2, 3))))))
        return x * w.view(x.shape[0], x.shape[1], 1, 1)


class Slot(nn.Module):
    """ADD blend at a fixed alpha, the seed fed detached host features."""

    def __init__(self, seed: nn.Module, alpha: float) -> None:
        super().__init__()
        self.seed = seed
        self.alpha = alpha

    def forward(self, h):
        s = self.seed(h.detach())
        return h + self.alpha * (s - h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b0, self.b1, self.b2 = HostBlock(1, 8), HostBlock(8, 16), HostBlock(16, 32)
        self.pool = nn.MaxPool2d(2, 2)
        self.slot1 = Slot(ConvLight(16), 0.5)
        self.slot2 = Slot(SqueezeExcite(32), 0.5)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(self.slot1(self.b1(self.pool(self.b0(x)))))
        x = self.pool(self.slot2(self.b2(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# peer name -> this network's name
NAME_MAP = {
    **{f"host.block{i}.conv.weight": f"b{i}.conv.weight" for i in range(3)},
    **{f"host.block{i}.bn.{k}": f"b{i}.bn.{k}" for i in range(3)
       for k in ("weight", "bias", "running_mean", "running_var")},
    "host.classifier.weight": "head.weight",
    "host.classifier.bias": "head.bias",
    "seed_r0c1.enhance.conv.weight": "slot1.seed.conv.weight",
    "seed_r0c1.enhance.gn.weight": "slot1.seed.gn.weight",
    "seed_r0c1.enhance.gn.bias": "slot1.seed.gn.bias",
    "seed_r0c2.fc1.weight": "slot2.seed.fc1.weight",
    "seed_r0c2.fc2.weight": "slot2.seed.fc2.weight",
    "seed_r0c2.fc2.bias": "slot2.seed.fc2.bias",
}


# -- data ----------------------------------------------------------------------

def first_samples(directory: str, n: int):
    """The first n training images and labels, read here (not through the peer)."""
    def read(name, header_ints, item):
        with gzip.open(os.path.join(directory, name), "rb") as handle:
            header = struct.unpack(f">{header_ints}I", handle.read(4 * header_ints))
            return header, handle.read(n * item)
    (magic, count, rows, cols), pixels = read("train-images-idx3-ubyte.gz", 4, 28 * 28)
    assert magic == 0x803 and rows == cols == 28 and count >= n
    (magic, count), labels = read("train-labels-idx1-ubyte.gz", 2, 1)
    assert magic == 0x801 and count >= n
    x = torch.tensor(list(pixels), dtype=torch.float32).view(n, 1, 28, 28)
    x = (x / 255.0 - 0.2860) / 0.3530
    return x, torch.tensor(list(labels), dtype=torch.int64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir")
    parser.add_argument("--synthetic", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    directory = args.data_dir or os.environ.get("ESPER_FASHION_MNIST_DIR") or "/usr/share/datasets/fashion-mnist"
    if not args.synthetic and os.path.isfile(os.path.join(directory, "train-images-idx3-ubyte.gz")):
        x, y = first_samples(directory, SAMPLES)
        source = f"the first {SAMPLES} Fashion-MNIST training samples"
    else:
        gen = torch.Generator().manual_seed(1234)
        x = torch.randn(SAMPLES, 1, 28, 28, generator=gen)
        y = torch.randint(0, 10, (SAMPLES,), generator=gen)
        source = f"{SAMPLES} seeded random samples"

    cpu = torch.device("cpu")
    data = ((x, y), (x, y))  # the evaluation set is the same 512 samples
    trainer = peer.Trainer("eager", data, cpu, steps_per_epoch=SAMPLES // BATCH)
    theirs = trainer.model

    ours = Net()
    state = theirs.state_dict()
    if set(state) != set(NAME_MAP):
        print(f"FAIL: the peer's parameter names differ: {sorted(set(state) ^ set(NAME_MAP))}")
        return 1
    ours.load_state_dict({NAME_MAP[k]: v.detach().clone().contiguous() for k, v in state.items()},
                         strict=False)
    missing = [k for k in ours.state_dict() if k not in NAME_MAP.values() and not k.endswith("num_batches_tracked")]
    if missing:
        print(f"FAIL: not initialised from the peer: {missing}")
        return 1
    optimizers = [
        torch.optim.SGD([p for n, p in ours.named_parameters() if not n.startswith("slot")], lr=0.01, momentum=0.9),
        torch.optim.SGD(ours.slot1.parameters(), lr=0.01, momentum=0.9),
        torch.optim.SGD(ours.slot2.parameters(), lr=0.01, momentum=0.9),
    ]
    loss_fn = nn.CrossEntropyLoss()

    failures = []
    print(f"data: {source}; {STEPS} SGD steps of batch {BATCH}")
    for step in range(STEPS):
        lo = (step * BATCH) % SAMPLES
        xb, yb = x[lo:lo + BATCH], y[lo:lo + BATCH]
        their_loss = trainer.eager_step(xb.contiguous(memory_format=torch.channels_last), yb).item()
        ours.train()
        loss = loss_fn(ours(xb), yb)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in optimizers:
            opt.step()
        diff = abs(loss.item() - their_loss)
        print(f"step {step + 1}: loss peer {their_loss:.7f}  second {loss.item():.7f}  |diff| {diff:.2e}")
        if not diff <= TOLERANCE:
            failures.append(f"step {step + 1} loss differs by {diff:.2e}")

    # After the 3 steps: the next forward's loss, every parameter and buffer, evaluation.
    with torch.no_grad():
        xb, yb = x[:BATCH], y[:BATCH]
        their_next = peer.F.cross_entropy(theirs(xb, True), yb).item()
        our_next = loss_fn(ours(xb), yb).item()
        diff = abs(their_next - our_next)
        print(f"loss after {STEPS} steps: peer {their_next:.7f}  second {our_next:.7f}  |diff| {diff:.2e}")
        if not diff <= TOLERANCE:
            failures.append(f"loss after {STEPS} steps differs by {diff:.2e}")
        # Tensors compared relative to their scale, max(1, max |value|).
        # BatchNorm's running statistics get a looser bound: PyTorch's CPU
        # batch norm on channels_last input (the peer's format) sums the batch
        # statistics less exactly than on NCHW (seen here: running variance
        # 9e-6 off the float64 value against 7e-8 for NCHW, on N(3, 4) data).
        our_state, their_state = ours.state_dict(), theirs.state_dict()
        for kind, bound in (("parameter", TOLERANCE), ("running statistic", BUFFER_TOLERANCE)):
            names = [k for k in NAME_MAP if ("running_" in k) == (kind != "parameter")]
            worst = max(((their_state[k] - our_state[NAME_MAP[k]]).abs().max().item()
                         / max(1.0, our_state[NAME_MAP[k]].abs().max().item()), k) for k in names)
            print(f"largest {kind} difference (relative): {worst[0]:.2e} ({worst[1]}; bound {bound:g})")
            if not worst[0] <= bound:
                failures.append(f"{worst[1]} differs by {worst[0]:.2e} (relative)")
        ours.eval()
        _, their_eval, _ = trainer.validate()
        our_eval = loss_fn(ours(x), y).item()
        diff = abs(their_eval - our_eval)
        print(f"evaluation loss (running statistics): peer {their_eval:.7f}  second {our_eval:.7f}  |diff| {diff:.2e}")
        if not diff <= TOLERANCE:
            failures.append(f"evaluation loss differs by {diff:.2e}")

    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print(f"OK: the two implementations agree within {TOLERANCE:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
