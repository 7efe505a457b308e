#!/usr/bin/env python3
"""Roofline floors of the `tolaria-fmnist` training epoch, from its shapes.

The workload (DESIGN.md, `tolaria::engine::bench`): the Fashion-MNIST CNN
host (conv 3x3 -> BatchNorm -> ReLU blocks of 8, 16 and 32 channels, a 2x2
max-pool after each, global average pooling, a linear classifier), the
`conv_light` seed at r0c1 (`x + ReLU(GN(conv3x3 x))`, 16 channels at 14x14)
and the `attention` seed at r0c2 (squeeze-excitation, 32 channels at 7x7),
both blending at alpha 0.5; batch 256, 234 steps an epoch; fp32.

Two floors for one epoch, printed for the H100 SXM and the H200:

- memory: every activation tensor of the step (the list below, per sample)
  crosses the device's memory a fixed number of times. `fused` counts 2
  passes (written once in the forward, read once in the backward; the
  gradient of each layer input written once and read once adds 2 more for
  the tensors that have one: 4 for those); `unfused` counts 5 (written and
  read in the forward, read in the backward, its gradient written and
  read). Parameters, gradients and optimizer state (about 12 k values) and
  the labels are left out: they are under 0.1% of the bytes.
- compute: the multiply-adds of the convolutions, the blends and the
  classifier, forward and backward (2 x the forward for the input and
  weight gradients), at fp32 rate (no tensor cores) and at dense TF32
  tensor-core rate.

Peak figures (NVIDIA's data sheets, dense): H100 SXM 3.35 TB/s HBM3, 67
TFLOP/s FP32, 494 TFLOP/s TF32 tensor core; H200 4.8 TB/s HBM3e, the same
compute.

Usage: fmnist_roofline.py [--batch 256] [--steps 234] [--json]
"""

from __future__ import annotations

import argparse
import json

BYTES = 4  # fp32

DEVICES = {
    "H100 SXM": {"bandwidth": 3.35e12, "fp32": 67e12, "tf32": 494e12},
    "H200": {"bandwidth": 4.8e12, "fp32": 67e12, "tf32": 494e12},
}


def conv_macs(c_in: int, c_out: int, hw: int, k: int = 3) -> int:
    return c_in * c_out * k * k * hw


def tensors() -> list[tuple[str, int, bool]]:
    """(name, values per sample, has a gradient that crosses memory)."""
    return [
        ("input 1x28x28", 1 * 28 * 28, False),
        ("block0 conv 8x28x28", 8 * 28 * 28, True),
        ("block0 bn+relu 8x28x28", 8 * 28 * 28, True),
        ("pool0 8x14x14", 8 * 14 * 14, True),
        ("block1 conv 16x14x14", 16 * 14 * 14, True),
        ("block1 bn+relu 16x14x14 (slot r0c1)", 16 * 14 * 14, True),
        ("seed conv_light conv 16x14x14", 16 * 14 * 14, True),
        ("seed conv_light gn+relu 16x14x14", 16 * 14 * 14, True),
        ("blend r0c1 16x14x14", 16 * 14 * 14, True),
        ("pool1 16x7x7", 16 * 7 * 7, True),
        ("block2 conv 32x7x7", 32 * 7 * 7, True),
        ("block2 bn+relu 32x7x7 (slot r0c2)", 32 * 7 * 7, True),
        ("seed attention scale 32x7x7", 32 * 7 * 7, True),
        ("blend r0c2 32x7x7", 32 * 7 * 7, True),
        ("pool2 32x3x3", 32 * 3 * 3, True),
        ("pooled 32 + logits 10", 32 + 10, True),
    ]


def forward_macs() -> int:
    return (
        conv_macs(1, 8, 28 * 28)
        + conv_macs(8, 16, 14 * 14)
        + conv_macs(16, 16, 14 * 14)  # the conv_light seed
        + conv_macs(16, 32, 7 * 7)
        + 2 * (32 * 8)  # squeeze-excitation FCs (r = C / 4 = 8)
        + 32 * 10  # classifier
    )


def floors(batch: int, steps: int) -> dict:
    items = tensors()
    values = sum(v for _, v, _ in items)
    with_grad = sum(v for _, v, g in items if g)
    fused_bytes = (2 * values + 2 * with_grad) * BYTES * batch * steps
    unfused_bytes = (5 * values) * BYTES * batch * steps
    flops = 2 * 3 * forward_macs() * batch * steps  # fwd + 2 x fwd for backward
    out = {
        "batch": batch,
        "steps": steps,
        "activation_values_per_sample": values,
        "bytes_per_epoch": {"fused": fused_bytes, "unfused": unfused_bytes},
        "flops_per_epoch": flops,
        "floors_ms": {},
    }
    for name, peak in DEVICES.items():
        out["floors_ms"][name] = {
            "memory_fused": 1e3 * fused_bytes / peak["bandwidth"],
            "memory_unfused": 1e3 * unfused_bytes / peak["bandwidth"],
            "compute_fp32": 1e3 * flops / peak["fp32"],
            "compute_tf32": 1e3 * flops / peak["tf32"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=234)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = floors(args.batch, args.steps)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"activation values per sample: {result['activation_values_per_sample']:,}")
    gb = {k: v / 1e9 for k, v in result["bytes_per_epoch"].items()}
    print(f"bytes per epoch: fused {gb['fused']:.2f} GB, unfused {gb['unfused']:.2f} GB")
    print(f"FLOPs per epoch: {result['flops_per_epoch'] / 1e9:.1f} GFLOP")
    for name, f in result["floors_ms"].items():
        print(
            f"{name}: memory {f['memory_fused']:.2f} ms (fused) / {f['memory_unfused']:.2f} ms "
            f"(unfused); compute {f['compute_fp32']:.2f} ms fp32 / {f['compute_tf32']:.3f} ms TF32"
        )


if __name__ == "__main__":
    main()
