"""What the PyTorch peers of the tolaria benchmarks share.

`tolaria_fmnist.py` and `tolaria_lm.py` train different models the same
way; this module holds that way once:

  Mode           how a record mode runs the step (bf16, the whole step
                 captured by hand, a torch.compile mode, why it needs CUDA);
  StepTrainer    a mode's epoch loop around the workload's step: the
                 shuffled gathers, the hand-captured whole-step CUDA graph
                 (warm-up steps, capture, the check that a replay trains in
                 place), the replay timing and the one-step kernel profile;
  measure_mode   warm-up and measured epochs, memory, compile counters and
                 the extras after the measured epochs, as one mode's metrics;
  run_entry      one mode's result entry: metrics, skipped, or failed (a
                 failing mode never loses the others);
  records        the record's environment, a standalone record, merging into
                 a record that `esper bench` wrote, the console table.

A peer keeps its workload: the data, the model, its step and validation,
its params and its command line. Nothing here is specific to one of them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

GRAPH_WARMUP_STEPS = 3
HAND_GRAPH = "CUDA graphs need a CUDA device"


class DataError(Exception):
    """A data problem the user can act on (printed without a traceback)."""


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


def percentile(samples, percent):
    """Nearest-rank percentile, as leyline::baseline::percentile."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = math.ceil(percent / 100.0 * len(ordered))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the epoch loop ----------------------------------------------------------

class StepTrainer:
    """One mode's device buffers and epoch loop around the workload's step.

    A subclass builds `self.model` and its optimizer after calling
    `__init__`, and defines `step(x, y)` (one training step: forward, loss,
    backward, the optimizer step, `self.loss_sum += loss`; returns the
    detached loss) and `validate()`
    (returns (ms, loss, accuracy)). Eager modes gather the epoch's shuffled
    samples once and step on slices; graphed modes gather each batch into
    static buffers and, after GRAPH_WARMUP_STEPS eager steps on the same
    stream, capture the whole step once and replay it."""

    def __init__(self, name: str, spec: Mode, data, device: torch.device, steps_per_epoch: int,
                 batch: int, data_seed: int) -> None:
        (train_x, train_y), (val_x, val_y) = data
        self.mode = name
        self.device = device
        self.cuda = device.type == "cuda"
        self.bf16 = spec.bf16
        self.graphed = spec.graphed
        self.compiled = spec.compile_mode is not None
        self.inductor_cudagraphs = spec.inductor_cudagraphs
        if spec.needs_cuda and not self.cuda:
            raise RuntimeError(f"{spec.needs_cuda}; this run is on the CPU")
        if self.compiled:
            torch.compiler.reset()  # fresh caches: no recompile limit carried over from another mode
        self.batch = batch
        self.train_x, self.train_y = train_x, train_y
        self.val_x, self.val_y = val_x, val_y
        self.n_train = train_x.shape[0]
        self.steps = steps_per_epoch
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(data_seed)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        if self.graphed:
            # The graph's static inputs: every step gathers its batch into them.
            self.static_x = torch.empty((batch, *train_x.shape[1:]), dtype=train_x.dtype, device=device)
            self.static_y = torch.empty((batch, *train_y.shape[1:]), dtype=train_y.dtype, device=device)
        else:
            # The epoch's shuffled copy: one gather an epoch, steps read slices
            # (in the data's own layout).
            used = self.steps * batch
            self.epoch_x = torch.empty_like(train_x[:used])
            self.epoch_y = torch.empty_like(train_y[:used])
        self.graph = None
        self.eager_steps_left = GRAPH_WARMUP_STEPS
        self.capture_ms = None
        self.first_step_s = None
        self.params: list[torch.Tensor] = []  # the subclass's, for zero_grads

    def autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        # Captured graphs replay the casts themselves: no weight-cast cache.
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=not self.graphed)

    # the step ---------------------------------------------------------------
    def step(self, x, y) -> torch.Tensor:
        """One training step; returns the detached loss."""
        raise NotImplementedError

    def validate(self):
        raise NotImplementedError

    def zero_grads(self):
        """Gradients to None: the next backward writes fresh ones (a captured
        one in the graph's pool)."""
        for p in self.params:
            p.grad = None

    def eager_step(self, x, y) -> torch.Tensor:
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
            # handles, optimizer state, and in the compiled modes compilation
            # and autotuning: never under capture).
            self.eager_steps_left -= 1
            self.eager_step(self.static_x, self.static_y)
        else:
            self.capture()

    def capture(self) -> None:
        """Captures the whole step (eager or compiled) on the current stream,
        then replays it as this step, checking that the replay trained the
        model in place."""
        self.zero_grads()
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
        """What a training step must change in place, by name: every
        parameter (a subclass adds buffers that the forward updates)."""
        return dict(self.model.named_parameters())

    def model_snapshot(self) -> dict[str, tuple[int, torch.Tensor]]:
        return {name: (t.data_ptr(), t.detach().clone()) for name, t in self.model_tensors().items()}

    def check_trained_in_place(self, before: dict[str, tuple[int, torch.Tensor]]) -> None:
        """A replayed step must change every tensor of model_tensors() in
        place: a captured graph that wrote copies (a compiled module
        returning its buffer updates, say) would train nothing on replay."""
        stale = [name for name, t in self.model_tensors().items()
                 if t.data_ptr() != before[name][0] or torch.equal(t.detach(), before[name][1])]
        if stale:
            raise RuntimeError(f"a replay of the captured step left unchanged (or moved): {', '.join(stale)}")

    def check_static_gather(self):
        """index_select(out=) must write the static buffers in place (the graph reads them)."""
        pointers = (self.static_x.data_ptr(), self.static_y.data_ptr())
        index = torch.arange(self.batch, device=self.device)
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
        batch = self.batch
        if not self.graphed:
            used = perm[:self.steps * batch]
            torch.index_select(self.train_x, 0, used, out=self.epoch_x)
            torch.index_select(self.train_y, 0, used, out=self.epoch_y)
        for step in range(self.steps):
            lo = step * batch
            if self.graphed:
                self.graph_step(perm[lo:lo + batch])
            else:
                self.eager_step(self.epoch_x[lo:lo + batch], self.epoch_y[lo:lo + batch])
            if time_first_step and step == 0:
                # The first step (a compiled mode's compilation and autotuning).
                self.sync()
                self.first_step_s = time.perf_counter() - started
        loss = self.loss_sum.item() / self.steps  # the epoch's one readback (a sync)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if not math.isfinite(loss):
            raise RuntimeError(f"{self.mode}: the epoch's mean training loss is {loss}")
        return elapsed_ms, loss

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

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
        x, y = self.train_x[:self.batch], self.train_y[:self.batch]
        if self.graphed:
            self.static_x.copy_(x)
            self.static_y.copy_(y)
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


# -- one mode ------------------------------------------------------------------

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


def measure_mode(make_trainer: Callable[[], StepTrainer], name: str, device: torch.device, args,
                 describe_validation: Callable[[float, float], str]) -> tuple[StepTrainer, dict]:
    """Runs args.warmup_epochs + args.epochs epochs (each followed by a
    validation) of the trainer `make_trainer()` builds, on a side stream;
    returns the trainer and the mode's metrics (None where a metric does not
    apply). The warm-up's peak memory (compilation, autotuning, capture, the
    first validation) is kept apart from the measured epochs'; the replay
    timing and the kernel profile run after the measured epochs (they train
    further)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    trainer = make_trainer()
    metrics = {}
    if cuda:
        metrics["device_memory_at_start_bytes"] = torch.cuda.memory_allocated(device)
    counted = compile_counters()
    stream = torch.cuda.Stream(device) if cuda else None
    epochs, validations = [], []
    last = None
    warmup_peak = 0
    total = args.warmup_epochs + args.epochs
    with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
        if trainer.graphed:
            trainer.check_static_gather()
        for index in range(total):
            warm = index < args.warmup_epochs
            if cuda and index == args.warmup_epochs:
                warmup_peak = torch.cuda.max_memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            epoch_ms, train_loss = trainer.epoch(time_first_step=(index == 0))
            val_ms, val_loss, val_accuracy = trainer.validate()
            if not math.isfinite(val_loss):
                raise RuntimeError(f"{name}: the validation loss is {val_loss}")
            if index == 0:
                metrics["first_epoch_ms"] = epoch_ms
                metrics["first_validation_ms"] = val_ms
            if not warm:
                epochs.append(epoch_ms)
                validations.append(val_ms)
            last = (train_loss, val_loss, val_accuracy)
            log(f"[python {name}] epoch {index + 1}/{total}{' (warm-up)' if warm else ''}: "
                f"{epoch_ms:.1f} ms, train loss {train_loss:.4f}, val {val_ms:.1f} ms, "
                f"{describe_validation(val_loss, val_accuracy)}")
        p50 = percentile(epochs, 50)
        metrics.update(
            epoch_ms_p50=p50,
            epoch_ms_p95=percentile(epochs, 95),
            epoch_ms_mean=sum(epochs) / len(epochs) if epochs else None,
            samples_per_s=(trainer.steps * trainer.batch) / (p50 / 1e3) if p50 else None,
            validation_ms_p50=percentile(validations, 50),
            validation_ms_p95=percentile(validations, 95),
            capture_ms=trainer.capture_ms,
            measured_epochs=len(epochs),
            steps_per_epoch=trainer.steps,
            train_samples_per_epoch=trainer.steps * trainer.batch,
        )
        if trainer.compiled:
            metrics["compile_s"] = trainer.first_step_s
            metrics["compile_validation_s"] = metrics["first_validation_ms"] / 1e3
            for metric, value in compile_counters().items():
                if metric in counted and (trainer.inductor_cudagraphs or metric != "inductor_cudagraph_skips"):
                    metrics[metric] = value - counted[metric]
        elif trainer.first_step_s is not None:
            metrics["first_step_ms"] = trainer.first_step_s * 1e3
        if last is not None:
            metrics["final_train_loss"], metrics["val_loss"], metrics["val_accuracy"] = last
        if cuda:
            measured_peak = torch.cuda.max_memory_allocated(device)
            metrics["peak_memory_measured_epochs_bytes"] = measured_peak
            metrics["peak_memory_bytes"] = max(measured_peak, warmup_peak)  # the whole mode
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
                    log(f"[python {name}] kernel profile skipped: {type(error).__name__}: {error}")
    return trainer, metrics


def as_metrics(metrics: dict) -> dict:
    """The record's metrics: floats, without the ones that do not apply."""
    return {k: float(v) for k, v in metrics.items() if v is not None}


def describe_compile_mode(spec: Mode) -> dict | None:
    """For the record's params: a compiled mode's torch.compile mode and the
    Inductor options it sets (as this torch defines the mode); None for an
    eager mode."""
    if spec.compile_mode is None:
        return None
    try:
        from torch._inductor import list_mode_options
        options = list_mode_options(spec.compile_mode)
    except Exception:  # described by name only where this torch cannot list it
        options = None
    return {"torch_compile_mode": spec.compile_mode, "inductor_options": options,
            "cuda_graphs": spec.cuda_graphs}


def run_entry(name: str, spec: Mode, device: torch.device, run: Callable[[], dict]) -> dict:
    """One mode's result entry: the metrics `run()` measures, or why it has
    none (skipped on the CPU, or failed: one failing mode never loses the
    others). Frees the mode's compiled code and memory afterwards."""
    entry = {"impl": "python", "mode": name, "amp": "bf16" if spec.bf16 else "off", "metrics": {}}
    if spec.needs_cuda and device.type != "cuda":
        entry["error"] = f"{spec.needs_cuda}; this run is on the CPU"
        log(f"[python {name}] skipped: {entry['error']}")
        return entry
    try:
        entry["metrics"] = run()
    except Exception as error:  # recorded honestly: a failing mode is a result
        message = f"{type(error).__name__}: {error}".strip()
        first_lines = "\n".join(message.splitlines()[:6])
        log(f"[python {name}] failed: {first_lines}")
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
        log(f"[python {name}] device left in error state: {error}")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def pick_device(arg: str) -> torch.device:
    """--device: `auto` is CUDA where there is one; TF32 matmuls either way."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if arg == "auto" else arg)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    return device


# -- records -------------------------------------------------------------------

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


def standalone_record(workload: str, device: torch.device, label: str, params: dict, results: list) -> dict:
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
    return {"schema": 1, "workload": workload, "label": label, "environment": environment,
            "params": params, "results": results, "telemetry_names": []}


def write_json(path: str, value) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)


def write_records(workload: str, args, device: torch.device, params: dict, results: list,
                  merge_params: Callable[[dict, dict], None]) -> None:
    """--merge-into: this run's entries replace the record's python entries
    of the same mode names (so modes measured in separate runs meet in one
    record), and `merge_params(record_params, params)` puts this run's
    params into the record's; --out: a standalone record."""
    if args.merge_into:
        record = read_record(workload, args.merge_into)
        names = {entry["mode"] for entry in results}
        record["results"] = [r for r in record.get("results", [])
                             if r.get("impl") != "python" or r.get("mode") not in names] + results
        record.setdefault("environment", {}).update(python_environment(device))
        merge_params(record.setdefault("params", {}), params)
        write_json(args.merge_into, record)
    if args.out:
        write_json(args.out, standalone_record(workload, device, args.label, params, results))


def read_record(workload: str, path: str) -> dict:
    """The --merge-into record at `path`, which must be one of `workload`."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        raise DataError(f"--merge-into {path}: not a readable record ({error}); merge into "
                        "the Rust bench's record of this run, or use --out") from error
    if not isinstance(record, dict) or record.get("workload") not in (None, workload):
        raise DataError(f"--merge-into {path}: not a {workload} record")
    return record


def write_all(workload: str, args, device: torch.device, params: dict, modes: list[str],
              run_one: Callable[[str], dict], table: list,
              merge_params: Callable[[dict, dict], None]) -> int:
    """Checks the record targets, then runs every mode (`run_one(mode)` gives
    its entry), writing the records after each so that a run cut short keeps
    what it measured; prints the entries (when no record is asked for, or one
    cannot be written: nothing measured is lost) and the table. Returns the
    exit code."""
    try:  # before anything is measured
        if args.merge_into:
            read_record(workload, args.merge_into)
        if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
            raise DataError(f"--out {args.out}: its folder does not exist")
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results = []
    for mode in modes:
        results.append(run_one(mode))
        try:
            write_records(workload, args, device, params, results, merge_params)
        except (OSError, ValueError, DataError) as error:
            print(f"error: cannot write the record: {error}; the entries measured so far:", file=sys.stderr)
            json.dump(results, sys.stdout, indent=2)
            print()
            return 2
    if args.merge_into:
        log(f"merged {len(results)} python results into {args.merge_into}")
    if not args.merge_into and not args.out:
        json.dump(results, sys.stdout, indent=2)
        print()
    print_table(workload, table, results, torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    return 0


def print_table(workload: str, table: list, results: list, device_name: str) -> None:
    """One line a mode: (metric, title, digits) columns of `table`
    (digits < 0: bytes as MiB), or the mode's error."""
    print(f"\n{workload} python peer on {device_name} (torch {torch.__version__})")
    width = max([len("mode"), *(len(entry["mode"]) for entry in results)])
    print(f"{'mode':<{width}}" + "".join(f" {title:>10}" for _, title, _ in table))
    for entry in results:
        line = f"{entry['mode']:<{width}}"
        if entry.get("error"):
            line += " error: " + entry["error"].splitlines()[0][:110]
        else:
            for key, _, digits in table:
                value = entry["metrics"].get(key)
                if value is None:
                    line += f" {'-':>10}"
                elif digits < 0:
                    line += f" {value / 2**20:>10.1f}"
                else:
                    line += f" {value:>10.{digits}f}"
        print(line)
