#!/usr/bin/env python3
"""Python peers of the `tolaria-reference` benchmark (DESIGN.md sections 6 and 7).

The same workload as `esper bench tolaria-reference`, written as plain PyTorch:
Linear(16->4), 16 samples x 16 features, batch 4 (4 steps per epoch),
cross-entropy, SGD lr 0.01 momentum 0.9, on the same seeded data and initial
parameters as the Rust trainer (SplitMix64 + Box-Muller, reproduced here).

Variants (record mode names):
  eager                     forward, loss, backward, optimizer step, grads to None
  compile-default           torch.compile(step) with mode="default"
  compile-reduce-overhead   torch.compile(step) with mode="reduce-overhead"
  graph-step                manual torch.cuda.CUDAGraph of one step, replayed per microbatch
                            (static buffers = the staging buffers' first microbatch)
  graph-epoch               manual torch.cuda.CUDAGraph of a whole epoch, replayed once
                            (accumulator reset and per-step metrics on a forked capture
                            stream: parallel branches of the graph, off the steps' path)

Staging and readback match the Rust counterparts: every step runs on a
dedicated compute stream; eager, compile and graph-step stage the epoch's
pinned host data with non-blocking copies on a staging stream between timing
events (h2d_ms), queued at the end of the previous epoch behind its steps so
that they overlap its readback; graph-epoch keeps the data resident on the
device. Loss and
correct-count accumulate on the device and are read back once per epoch
(non-blocking copy to pinned memory, then one event wait). Epoch time is host
wall time of the whole epoch, staging and readback included.

Usage:
  tolaria_reference.py [--merge-into RECORD.json | --out RESULTS.json]
                       [--quick] [--epochs N] [--warmup-epochs N] [--modes a,b]

With --merge-into, the results are appended (impl "python") to an existing
baseline record written by `esper bench`, so one JSON holds both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from peer_common import log, percentile

MASK64 = (1 << 64) - 1
INIT_STREAM = 0xA5A5A5A55A5A5A5A

REFERENCE = {
    "seed": 20251001,
    "n_samples": 16,
    "n_validation_samples": 16,
    "n_features": 16,
    "n_classes": 4,
    "batch_size": 4,
    "learning_rate": 0.01,
    "momentum": 0.9,
    "graph_warmup_steps": 3,
}

ALL_MODES = ["eager", "compile-default", "compile-reduce-overhead", "graph-step", "graph-epoch"]


class SplitMix64:
    """Bit-for-bit the generator of tolaria::data::shuffle::SplitMix64."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def next_unit(self) -> float:
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))

    def next_normal(self) -> float:
        u1 = 1.0 - self.next_unit()
        u2 = self.next_unit()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(math.tau * u2)


def generate(cfg: dict):
    """Training/validation sets and initial [C, F+1] parameters, as tolaria::data::reference."""
    n_features, n_classes = cfg["n_features"], cfg["n_classes"]
    rng = SplitMix64(cfg["seed"])
    teacher = [rng.next_normal() for _ in range(n_features * n_classes)]

    def draw(n: int):
        inputs = [rng.next_normal() for _ in range(n * n_features)]
        labels = []
        for i in range(n):
            row = inputs[i * n_features:(i + 1) * n_features]
            best, best_score = 0, -math.inf
            for c in range(n_classes):
                score = sum(row[f] * teacher[f * n_classes + c] for f in range(n_features))
                if score > best_score:
                    best, best_score = c, score
            labels.append(best)
        x = torch.tensor(inputs, dtype=torch.float64).to(torch.float32).view(n, n_features)
        return x, torch.tensor(labels, dtype=torch.int64)

    train = draw(cfg["n_samples"])
    validation = draw(cfg["n_validation_samples"])
    init_rng = SplitMix64(cfg["seed"] ^ INIT_STREAM)
    bound = 1.0 / math.sqrt(n_features)
    init = [(2.0 * init_rng.next_unit() - 1.0) * bound for _ in range(n_classes * (n_features + 1))]
    params = torch.tensor(init, dtype=torch.float64).to(torch.float32).view(n_classes, n_features + 1)
    return train, validation, params


class Workload:
    """Model, optimizer, data buffers, streams and accumulators of one variant."""

    def __init__(self, cfg: dict, device: torch.device, resident: bool) -> None:
        (x, y), (vx, vy), params = generate(cfg)
        self.cfg = cfg
        self.device = device
        self.cuda = device.type == "cuda"
        self.model = torch.nn.Linear(cfg["n_features"], cfg["n_classes"]).to(device)
        with torch.no_grad():
            self.model.weight.copy_(params[:, : cfg["n_features"]])
            self.model.bias.copy_(params[:, cfg["n_features"]])
        # The fused multi-tensor kernel on CUDA (one launch per step for every
        # parameter and momentum buffer), as the Rust side's `_fused_sgd_`:
        # the default foreach implementation launches several kernels a step.
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=cfg["learning_rate"], momentum=cfg["momentum"],
            fused=self.cuda,
        )
        self.batch = cfg["batch_size"]
        self.n_samples = x.shape[0]
        self.spans = [(s, min(self.batch, self.n_samples - s)) for s in range(0, self.n_samples, self.batch)]
        self.resident = resident
        if self.cuda:
            self.host_x = x.pin_memory()
            self.host_y = y.pin_memory()
            self.compute = torch.cuda.Stream(device)
            self.staging = torch.cuda.Stream(device)
            # Two alternating start/end pairs: the copy feeding an epoch is
            # timed at its end while the next epoch's copy is in flight.
            self.h2d = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                        for _ in range(2)]
            self.pending = None
            self.fed = None
            self.consumed = torch.cuda.Event()
            self.done = torch.cuda.Event(enable_timing=True)
            self.timing_start = torch.cuda.Event(enable_timing=True)
            # The epoch's readback waits on an event without timing (a timing
            # event records a timestamp it never needs there).
            self.read = torch.cuda.Event()
            self.readback = torch.zeros(2, dtype=torch.float32).pin_memory()
        else:
            self.host_x, self.host_y = x, y
            self.compute = None
            self.readback = torch.zeros(2, dtype=torch.float32)
        self.dev_x = self.host_x.to(device)
        self.dev_y = self.host_y.to(device)
        self.val_x, self.val_y = vx.to(device), vy.to(device)
        self.metrics = torch.zeros(2, dtype=torch.float32, device=device)
        self.loss_acc = self.metrics[0:1]
        self.correct_acc = self.metrics[1:2]
        self.slices = [(self.dev_x[s:s + b], self.dev_y[s:s + b]) for s, b in self.spans]

    # -- the step ---------------------------------------------------------
    def step(self, x, y):
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.accumulate(logits.detach(), loss.detach(), y)

    def accumulate(self, logits, loss, y):
        self.loss_acc.add_(loss)
        self.correct_acc.add_((logits.argmax(1) == y).sum())

    def step_forking_metrics(self, x, y, side, keep):
        """The step for a captured epoch: the metric kernels go to `side`.

        Captured, `side` waiting on the loss is a fork: the metric kernels
        become a branch of the graph that runs beside this step's backward and
        optimizer step and the later steps, instead of five more kernels in
        the chain of every step. `keep` holds logits and loss until the
        capture ends, so their memory is not handed to a later step's
        tensors while the branch may still read them.
        """
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        detached = (logits.detach(), loss.detach())
        keep.append(detached)
        side.wait_stream(self.compute)
        with torch.cuda.stream(side):
            self.accumulate(detached[0], detached[1], y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- epoch pieces -----------------------------------------------------
    def queue_copy(self, pair: int) -> None:
        start, end = self.h2d[pair]
        with torch.cuda.stream(self.staging):
            start.record(self.staging)
            self.dev_x.copy_(self.host_x, non_blocking=True)
            self.dev_y.copy_(self.host_y, non_blocking=True)
            end.record(self.staging)
        self.pending = pair

    def stage(self) -> bool:
        """Waits for this epoch's staged data, staging it now if no copy was queued."""
        if not self.cuda or self.resident:
            return False
        if self.pending is None:
            self.queue_copy(0 if self.fed is None else 1 - self.fed)
        self.fed, self.pending = self.pending, None
        self.compute.wait_event(self.h2d[self.fed][1])
        return True

    def h2d_ms(self) -> float:
        start, end = self.h2d[self.fed]
        return start.elapsed_time(end)

    def read_metrics(self, reset: bool = True):
        # As in Rust: the next epoch's staging copy is queued behind this
        # epoch's steps (overlapping the readback), and the accumulator reset
        # behind the readback copy, so the host waits only for that copy.
        # `reset=False` where the accumulators are reset inside the epoch
        # (the captured epoch of graph-epoch).
        if self.cuda:
            if not self.resident:
                self.consumed.record(self.compute)
                self.staging.wait_event(self.consumed)
                self.queue_copy(1 - self.fed)
            self.readback.copy_(self.metrics, non_blocking=True)
            self.read.record(self.compute)
            if reset:
                self.metrics.zero_()
            self.read.synchronize()
        else:
            self.readback.copy_(self.metrics)
            self.metrics.zero_()
        loss_sum, correct = self.readback.tolist()
        return loss_sum / len(self.spans), correct / self.n_samples

    def validate(self):
        with torch.inference_mode():
            logits = self.model(self.val_x)
            loss = F.cross_entropy(logits, self.val_y)
            correct = (logits.argmax(1) == self.val_y).sum()
            values = torch.stack([loss, correct.float()]).cpu().tolist()
        return values[0], values[1] / self.val_x.shape[0]


class Runner:
    """Runs one variant's epochs; subclasses choose how a step executes."""

    def __init__(self, mode: str, workload: Workload) -> None:
        self.mode = mode
        self.w = workload
        self.capture_ms = None
        self.run_step = workload.step

    def epoch_body(self):
        w = self.w
        for x, y in w.slices:
            self.run_step(x, y)

    def epoch(self):
        w = self.w
        started = time.perf_counter()
        if w.cuda:
            with torch.cuda.stream(w.compute):
                staged = w.stage()
                self.epoch_body()
                loss, accuracy = w.read_metrics()
        else:
            staged = False
            self.epoch_body()
            loss, accuracy = w.read_metrics()
        epoch_ms = (time.perf_counter() - started) * 1e3
        h2d_ms = w.h2d_ms() if staged else None
        return epoch_ms, h2d_ms, loss, accuracy

    def graph(self):
        return None, 1


class CompileRunner(Runner):
    def __init__(self, mode: str, workload: Workload, compile_mode: str) -> None:
        super().__init__(mode, workload)
        self.run_step = torch.compile(workload.step, mode=compile_mode)


class GraphStepRunner(Runner):
    """Warm-up on the capture stream, capture one step reading static buffers, replay."""

    def __init__(self, mode: str, workload: Workload) -> None:
        super().__init__(mode, workload)
        self.warmup_remaining = workload.cfg["graph_warmup_steps"]
        self.graph_obj = None
        batch = workload.batch
        # As in Rust: with per-epoch staging, the static buffers are the
        # staging buffers' first microbatch, so that one needs no copy and
        # later ones are copied over it after it was consumed.
        if workload.resident:
            self.static_x = torch.empty(batch, workload.cfg["n_features"], device=workload.device)
            self.static_y = torch.empty(batch, dtype=torch.int64, device=workload.device)
        else:
            self.static_x, self.static_y = workload.slices[0]

    def fill_static(self, x, y):
        if x.data_ptr() != self.static_x.data_ptr():
            self.static_x.copy_(x, non_blocking=True)
            self.static_y.copy_(y, non_blocking=True)

    def epoch_body(self):
        w = self.w
        for x, y in w.slices:
            if self.graph_obj is not None and x.shape[0] == self.static_x.shape[0]:
                self.fill_static(x, y)
                self.graph_obj.replay()
            elif self.warmup_remaining > 0 or x.shape[0] != self.static_x.shape[0]:
                self.warmup_remaining = max(0, self.warmup_remaining - 1)
                w.step(x, y)
            else:
                self.fill_static(x, y)
                w.optimizer.zero_grad(set_to_none=True)
                started = time.perf_counter()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=w.compute):
                    w.step(self.static_x, self.static_y)
                self.capture_ms = (time.perf_counter() - started) * 1e3
                self.graph_obj = graph
                graph.replay()

    def graph(self):
        return self.graph_obj, 1


class GraphEpochRunner(Runner):
    """Data resident on the device; accumulator reset plus every step as one graph.

    Why this ran 0.150-0.161 ms an epoch where an independent plain
    whole-epoch graph of the same four steps ran 0.109 ms (the same H100, one
    run): the captured epoch held, in the chain of every step, the five
    metric kernels of `Workload.step` (loss add; argmax, compare, sum, add
    for the correct count). In a graph every dependent tiny kernel costs
    ~3 us, so those 20 kernels were the gap; smaller parts: every epoch
    entered and left the compute-stream context, launched the accumulator
    memset between the readback and the wait, and waited on a timing event.

    Now, with the same metrics and the same readback: the accumulator reset
    and each step's metric kernels are captured on a second stream, forked
    from the compute stream (at the start, after each step's loss) and
    joined at the end, so in the graph they are parallel branches beside the
    backward passes and optimizer steps instead of links of the chain; the
    steady-state epoch is replay, one pinned readback, one wait on an event
    without timing, with the compute stream made current once for the whole
    run (`run_mode`).

    Measured on the H100 in one run (2026-11-23), p50 / p95 ms an epoch:
    before 0.133-0.135 / 0.141-0.143 (bare replay 0.130); the metrics
    inline but everything else as now 0.129 / 0.133 (so the per-step metric
    kernels were ~33 us of the gap, the per-epoch overheads ~4 us); now
    0.096 / 0.100-0.105 (bare replay 0.098, 22.5 us a step against 30.5).
    In the same run a plain whole-epoch graph without metrics took 0.068
    (replay and stream sync) or 0.077 (plus reading the last loss back):
    ~20 us remain. The ablation's one extra fork/join (for the reset) cost
    ~5 us of graph time, so the five forks here are the likely rest; one
    fork after the last step's loss, reducing the kept logits and losses
    of all four steps at once, would be the next thing to measure.
    """

    def __init__(self, mode: str, workload: Workload) -> None:
        super().__init__(mode, workload)
        self.warmup_remaining = workload.cfg["graph_warmup_steps"]
        self.graph_obj = None
        self.side = torch.cuda.Stream(workload.device) if workload.cuda else None

    def eager_epoch(self):
        w = self.w
        for x, y in w.slices:
            w.step(x, y)

    def captured_epoch(self):
        w = self.w
        keep = []
        self.side.wait_stream(w.compute)
        with torch.cuda.stream(self.side):
            w.metrics.zero_()
        for x, y in w.slices:
            w.step_forking_metrics(x, y, self.side, keep)
        w.compute.wait_stream(self.side)  # the join: the capture must end on one stream
        return keep

    def epoch_body(self):
        w = self.w
        if self.graph_obj is not None:
            self.graph_obj.replay()
        elif self.warmup_remaining > 0:
            self.warmup_remaining = max(0, self.warmup_remaining - len(w.slices))
            self.eager_epoch()
        else:
            w.optimizer.zero_grad(set_to_none=True)
            # The captured reset runs inside this epoch's replay: flush what the
            # warm-up left in the accumulators first.
            w.metrics.zero_()
            started = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=w.compute):
                keep = self.captured_epoch()
            del keep
            self.capture_ms = (time.perf_counter() - started) * 1e3
            self.graph_obj = graph
            graph.replay()

    def epoch(self):
        if self.graph_obj is None:
            return super().epoch()
        # Steady state: the compute stream is already current (run_mode), the
        # data resident, the accumulators reset by the graph itself.
        w = self.w
        started = time.perf_counter()
        self.graph_obj.replay()
        loss, accuracy = w.read_metrics(reset=False)
        epoch_ms = (time.perf_counter() - started) * 1e3
        return epoch_ms, None, loss, accuracy

    def graph(self):
        return self.graph_obj, len(self.w.slices)


def make_runner(mode: str, workload: Workload) -> Runner:
    if mode == "eager":
        return Runner(mode, workload)
    if mode == "compile-default":
        return CompileRunner(mode, workload, "default")
    if mode == "compile-reduce-overhead":
        return CompileRunner(mode, workload, "reduce-overhead")
    if mode == "graph-step":
        return GraphStepRunner(mode, workload)
    if mode == "graph-epoch":
        return GraphEpochRunner(mode, workload)
    raise ValueError(f"unknown mode {mode}")


def run_mode(mode: str, device: torch.device, args) -> dict:
    cfg = dict(REFERENCE)
    workload = Workload(cfg, device, resident=(mode == "graph-epoch"))
    runner = make_runner(mode, workload)
    metrics = {}
    if device.type == "cuda":
        # As in Rust: what is allocated when the peak is reset (this variant's
        # buffers plus whatever earlier variants left, e.g. cuBLAS workspaces).
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        metrics["device_memory_at_start_bytes"] = torch.cuda.memory_allocated(device)
    first = None
    epochs, h2d = [], []
    last = None
    report_every = max(1, args.epochs // 4)
    # The compute stream is made current once for all epochs (each variant's
    # epoch also enters it, which is then a no-op switch; graph-epoch's
    # steady-state epoch relies on it and enters nothing).
    with torch.cuda.stream(workload.compute) if workload.cuda else contextlib.nullcontext():
        for _ in range(args.warmup_epochs):
            epoch_ms, _, _, _ = runner.epoch()
            if first is None:
                first = epoch_ms
        for index in range(args.epochs):
            epoch_ms, h2d_ms, loss, accuracy = runner.epoch()
            epochs.append(epoch_ms)
            if h2d_ms is not None:
                h2d.append(h2d_ms)
            last = (loss, accuracy)
            if (index + 1) % report_every == 0:
                log(f"[python {mode}] measured {index + 1}/{args.epochs}")
    metrics["first_epoch_ms"] = first
    metrics.update(
        epoch_ms_p50=percentile(epochs, 50),
        epoch_ms_p95=percentile(epochs, 95),
        epoch_ms_max=percentile(epochs, 100),
        epoch_ms_mean=sum(epochs) / len(epochs) if epochs else None,
        h2d_ms_p50=percentile(h2d, 50),
        h2d_ms_p95=percentile(h2d, 95),
        capture_ms=runner.capture_ms,
        measured_epochs=len(epochs),
        steps_per_epoch=len(workload.spans),
    )
    if last is not None:
        metrics["final_train_loss"], metrics["final_train_accuracy"] = last
    metrics["validation_loss"], metrics["validation_accuracy"] = workload.validate()
    graph, steps_per_replay = runner.graph()
    if graph is not None:
        replays = 1 if mode == "graph-epoch" else len(workload.spans)
        bare = []
        with torch.cuda.stream(workload.compute):
            for _ in range(args.bare_samples):
                started = time.perf_counter()
                for _ in range(replays):
                    graph.replay()
                workload.done.record(workload.compute)
                workload.done.synchronize()
                bare.append((time.perf_counter() - started) * 1e3)
            workload.timing_start.record(workload.compute)
            for _ in range(args.timed_replays):
                graph.replay()
            workload.done.record(workload.compute)
            workload.done.synchronize()
            elapsed_ms = workload.timing_start.elapsed_time(workload.done)
        metrics["bare_replays_per_sample"] = replays
        metrics["bare_replays_ms_p50"] = percentile(bare, 50)
        metrics["bare_replays_ms_p95"] = percentile(bare, 95)
        metrics["replay_us_per_step"] = elapsed_ms * 1e3 / (args.timed_replays * steps_per_replay)
    if device.type == "cuda":
        metrics["peak_device_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    return {k: float(v) for k, v in metrics.items() if v is not None}


TABLE = [("epoch_ms_p50", "p50 ms"), ("epoch_ms_p95", "p95 ms"), ("epoch_ms_max", "max ms"),
         ("replay_us_per_step", "replay us"), ("bare_replays_ms_p50", "bare ms"),
         ("capture_ms", "capture ms"), ("h2d_ms_p50", "h2d ms"), ("peak_device_memory_bytes", "peak B")]


def print_table(record: dict) -> None:
    """The merged record as a table (the last thing a bundle run prints)."""
    env = record.get("environment", {})
    print(f"\n{record.get('workload')} on {env.get('device')} (label {record.get('label')}, "
          f"rev {env.get('git_rev')}, torch {env.get('python_torch', env.get('torch'))})")
    print(f"{'impl':<7} {'mode':<24}" + "".join(f" {title:>10}" for _, title in TABLE))
    for entry in record.get("results", []):
        line = f"{entry.get('impl', '?'):<7} {entry.get('mode', '?'):<24}"
        if entry.get("error"):
            line += " error: " + entry["error"].splitlines()[0][:100]
        else:
            for key, _ in TABLE:
                value = entry.get("metrics", {}).get(key)
                if value is None:
                    line += f" {'-':>10}"
                elif key.endswith("_bytes"):
                    line += f" {value:>10.0f}"
                else:
                    line += f" {value:>10.4f}"
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merge-into", help="append results to this baseline record")
    parser.add_argument("--out", help="write the result entries to this JSON file")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--warmup-epochs", type=int)
    parser.add_argument("--modes", default=",".join(ALL_MODES))
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    if args.epochs is None:
        args.epochs = 30 if args.quick else 300
    if args.warmup_epochs is None:
        args.warmup_epochs = 5 if args.quick else 20
    args.bare_samples = 30 if args.quick else 300
    args.timed_replays = 50 if args.quick else 500

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")

    modes = [m for m in args.modes.split(",") if m]
    results = []
    for mode in modes:
        if device.type != "cuda" and mode.startswith("graph"):
            results.append({"impl": "python", "mode": mode, "metrics": {},
                            "error": "CUDA graphs need a CUDA device; this run is on the CPU"})
            continue
        log(f"[python {mode}] {args.warmup_epochs} warm-up + {args.epochs} measured epochs on {device}")
        try:
            metrics = run_mode(mode, device, args)
            log(f"[python {mode}] epoch p50 {metrics.get('epoch_ms_p50', float('nan')):.4f} ms, "
                f"p95 {metrics.get('epoch_ms_p95', float('nan')):.4f} ms")
            results.append({"impl": "python", "mode": mode, "metrics": metrics})
        except Exception as error:  # recorded honestly: a failing mode is a result
            message = f"{type(error).__name__}: {error}".strip()
            first_lines = "\n".join(message.splitlines()[:6])
            log(f"[python {mode}] failed: {first_lines}")
            traceback.print_exc(limit=3, file=sys.stderr)
            results.append({"impl": "python", "mode": mode, "metrics": {}, "error": first_lines[:2000]})
        if device.type == "cuda":
            try:
                torch.cuda.synchronize()
            except Exception as error:  # a broken mode must not hide the next ones
                log(f"[python {mode}] device left in error state: {error}")

    python_env = {
        "python_torch": torch.__version__,
        "python_cuda": torch.version.cuda or "n/a",
        "python_device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "python_version": sys.version.split()[0],
    }
    if args.merge_into:
        with open(args.merge_into, encoding="utf-8") as handle:
            record = json.load(handle)
        record["results"] = [r for r in record["results"] if r.get("impl") != "python"] + results
        record["environment"].update(python_env)
        with open(args.merge_into, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2, sort_keys=False)
            handle.write("\n")
        log(f"merged {len(results)} python results into {args.merge_into}")
        print_table(record)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"environment": python_env, "results": results}, handle, indent=2)
            handle.write("\n")
    if not args.merge_into and not args.out:
        json.dump(results, sys.stdout, indent=2)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
