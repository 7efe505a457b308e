#!/usr/bin/env python3
"""Python peer of the `tolaria-lm` benchmark (DESIGN.md sections 6 and 7).

The workload, as the Rust crates define it:

  host  kasmina::host::transformer::TransformerHost, GPT-style, causal: byte
        tokens (vocab 256), width C = 128, 4 heads (head dim 32), 3 layers in
        3 segments, block (context) 64, no dropout.
        embed  x = wte[tokens] + wpe[:T], wte [256, 128] and wpe [64, 128]
               drawn from N(0, 0.02);
        block  (pre-norm, one per layer g = 0, 1, 2)
               x = x + attn_proj(SDPA(q, k, v, is_causal)) where
               q, k, v = qkv(ln1 x).split(C, -1), Linear(C, 3C), each
               reshaped [B, T, 4, 32].transpose(1, 2), the output transposed
               back, made contiguous, reshaped [B, T, C], attn_proj
               Linear(C, C); then x = x + mlp_proj(GELU(fc(ln2 x))), fc
               Linear(C, 4C), exact GELU, mlp_proj Linear(4C, C); every
               Linear with bias, every LayerNorm eps 1e-5 with weight and
               bias;
        slot   r0c{g} after layer g;
        head   logits = ln_f(x) @ wte.T ([B, T, 256], tied to the token
               embedding).
        636,032 parameters: 256 C + 64 C + 3 (12 C^2 + 13 C) + 2 C
        (TransformerHostConfig::param_count).
  seeds two, both blending with ADD at a constant alpha 0.5,
        `h + 0.5 (s - h)` (torch.lerp, as kasmina::blend::blend_add), each
        seeing the live host features (transformer seeds are not gradient
        isolated: the host also gets gradient through the seed branch):
        r0c0: mlp_small, `h + fc2(GELU(fc1 h))`, fc1 Linear(C, 2C), fc2
              Linear(2C, C), both with bias, fc2 zero at birth
              (4 C^2 + 3 C = 65,920 parameters);
        r0c1: attention, `h + proj(causal SDPA(qkv h))`, 4 heads, qkv
              Linear(C, 3C), proj Linear(C, C) zero at birth, both with
              bias, no norm (4 C^2 + 4 C = 66,048 parameters);
        r0c2: empty (the identity).
  init  PyTorch's defaults, as kasmina::layers: Linear weights and biases
        uniform in +-1/sqrt(fan_in) (nn.Linear's own initialisation);
        LayerNorm weights 1, biases 0; embeddings N(0, 0.02).
  optim three parameter groups (host, seed r0c0, seed r0c1) in one AdamW
        (one step() call a step): lr 1e-3, betas (0.9, 0.999), eps 1e-8,
        weight decay 0.01 on every parameter; the fused kernel on CUDA
        (capturable in the modes that capture it).
  loss  softmax cross-entropy over the 256 tokens, mean over all B x T
        target tokens.
  step  what the Rust general step (tolaria::engine::model_step, ModelStep::
        run and tapped_backward) does while seeds feed the host's gradient,
        as Esper's Tolaria: the host gradient split into a teacher part and
        one contribution per seed, recombined with PCGrad
        (tolaria::grad_agg::GradAggregator) before the optimizer step:
        taps      the forward hands each seed a distinct view of the host
                  features (`h.view_as(h)`, kasmina's SeedSlot::
                  forward_tapped); the blend still takes `h` itself, so the
                  gradient at the view is what reaches the host through that
                  seed's branch alone;
        backward  grads = autograd.grad(loss, host + seed parameters + taps,
                  retain_graph); per tap i, per_seed_i = autograd.grad((tap_i
                  * grad_i.detach()).sum(), host parameters) (zero where a
                  tap does not reach a parameter: the later layers, ln_f);
        teacher   the total host gradient less the sum of the seeds' parts
                  (as Rust's GradAggregator::aggregate_total, in the rows);
        PCGrad    (2 or more seeds) in the fixed ascending order, each
                  seed's part projected off the *original* part of every
                  other seed whose dot product with it (over all host
                  parameters flattened together) is negative; the teacher
                  neither projected nor projected against; the host's .grad
                  = teacher + the projected parts (one seed: teacher + seed;
                  none: the total). As Rust: one [k + 1, numel] row buffer,
                  the Gram matrix as one matmul (TF32 where TF32 is on, as
                  Rust's), the aggregate as the rows weighted and summed
                  elementwise in fp32, the k x k coefficients in float64, `(dot < 0)` a float multiplier: no readback, no
                  branch on a device value (see GradAggregator);
        seeds     their .grad the plain gradients of the first autograd.grad.
        No grad scaler (Rust's scales fp16 only), no gradient clipping (off
        by default, and in the Rust benchmark). The Rust step also gathers
        gradient norms every 10th step and the aggregation's conflict counts
        (telemetry, read once an epoch, no change to the update); this peer
        does not. With --no-aggregation the step is one plain
        loss.backward() instead (not the Rust step; the record's mode names
        get the suffix -plain), so a record can show what the aggregation
        costs.
  data  Debian's `fortunes` corpus (tolaria::data::text): the regular,
        non-hidden files of the folder whose names have no extension (the
        package keeps `.dat` indexes and `.u8` links beside each file), in
        name order, split at lines that are exactly `%`, each document
        stripped of ASCII whitespace at both ends, empty ones dropped. The
        documents in a seeded order; the first tenth (rounded half away
        from zero, at least one) validates, the rest trains. Each part is
        joined with "\\n\\n" into one byte stream, every byte a token, cut
        into windows of 64: window i has inputs stream[64 i : 64 i + 64]
        and targets stream[64 i + 1 : 64 i + 65]; the tail short of a
        window is dropped. The order is leyline's SplitMix64 Fisher-Yates
        (tolaria::data::shuffle::permutation, mirrored here) seeded with
        --split-seed, by default 20261128, the Rust benchmark's SEED
        (engine::bench::lm): both sides then hold out the same documents
        and cut the same windows (fortunes 1:1.99.1-7.3: 15,217 documents,
        1,522 of them validate; 36,106 training windows, 282 steps an
        epoch; 3,903 validation windows). Should the Rust side change its
        seed, the splits differ slightly; the record's params carry this
        side's seed and counts. --quick keeps the first 8,192 training
        windows, as the Rust side does. Everything lives on
        the device as int64. Every epoch a device-side permutation
        (torch.randperm) of the training windows, batch 128 windows (8,192
        tokens), the last partial batch dropped; validation on every
        validation window in batches of 1,024 under torch.inference_mode:
        mean token loss, token accuracy (argmax), perplexity exp(loss).

Modes (record mode names; TF32 on for matmuls and cuDNN in all of them):
  eager               fp32, plain PyTorch (functional forward, fused AdamW)
  eager-bf16          as eager under bf16 autocast
  graph               the whole training step (forward, loss, the backward
                      passes and the aggregation, the fused capturable AdamW
                      step, loss accumulation)
                      captured once as a torch.cuda.CUDAGraph on a side
                      stream after a few eager warm-up steps; every step
                      gathers its batch with index_select into the graph's
                      static input buffers, then replays
  graph-bf16          as graph under bf16 autocast (weight-cast cache off,
                      as capture requires)
  compile             torch.compile(mode="default") of forward + loss (the
                      backward compiled with it by AOTAutograd), the
                      aggregation and fused AdamW eager; validation compiled
                      separately
  inductor-graph      forward + loss through torch.compile(mode=
                      "max-autotune-no-cudagraphs") (Inductor's fused Triton
                      kernels, autotuned GEMMs, backward by AOTAutograd),
                      and the whole step (compiled forward and backward
                      passes, the aggregation, the fused capturable AdamW,
                      loss accumulation) captured by
                      hand in one torch.cuda.CUDAGraph after the warm-up
                      steps (compilation and autotuning); static gathers as
                      in graph
  inductor-graph-bf16 as inductor-graph under bf16 autocast
  max-autotune        torch.compile(mode="max-autotune") (Inductor's own
                      CUDA graphs, cudagraph trees, a step begun before
                      every forward) of forward + loss, the aggregation and
                      fused AdamW eager;
                      inductor_cudagraph_skips counts the graphs Inductor
                      declined to run as CUDA graphs
Every compiled mode compiles with static shapes and fullgraph (a graph break
fails the mode instead of running part of it eagerly): the forward + loss in
three graphs cut at the two taps (embedding and layer 0; slot r0c0 and layer
1; slot r0c1, layer 2, head and loss), so that autograd can take gradients
at the views between them; the backward of each by AOTAutograd, run once for
the loss and again for every tap whose root's gradient crosses it (the
autograd.grad calls themselves, the views and the aggregation run eagerly
between the compiled graphs, or inside the hand-captured CUDA graph); with
--no-aggregation forward + loss as one graph and one loss.backward(). Each
validates with torch.compile (mode "default") of the validation
step (forward, summed loss, correct count). The record's params
(compile_modes) keep each compiled mode's Inductor options. A hand-captured
graph's first replay checks that every parameter changed in place.
The CUDA-only modes are recorded as skipped on the CPU, with the reason.
Every mode starts from the same weights and sees the same batches (the
permutation generator is seeded alike), so their losses should agree
closely; a loss that is not finite fails the mode. A failing mode is
recorded with its error and the run goes on. (The Rust side first trains
its seeds into BLENDING through the lifecycle on a subset; this peer starts
them at birth, already blending at 0.5: the speed figures compare, the
losses only roughly.)

Epoch time is host wall time of the whole epoch: permutation, gathers,
every step, and the one readback of the epoch's summed loss (the only sync).
Validation runs after every epoch and is timed apart. compile_s is the first
training step's seconds (compilation and autotuning), compile_validation_s
the first validation's, both apart from the epoch times (the first epoch, a
warm-up, holds them). Inductor's on-disk caches (TORCHINDUCTOR_CACHE_DIR)
from earlier runs, and autotuning results of earlier modes of this run,
shorten compile times (the metrics fxgraph_cache_hits / _misses say which);
Dynamo is reset after every compiled mode.

This file holds the workload (data, model, step, validation, params); the
epoch loop, the hand-captured graph, the metrics and the records are
peer_common.py's, beside it.

Usage:
  tolaria_lm.py [--merge-into RECORD.json] [--out RECORD.json]
                [--data-dir DIR | --synthetic] [--quick]
                [--epochs N] [--warmup-epochs N] [--modes a,b] [--no-kernels]
                [--no-aggregation]

Defaults: 2 warm-up and 5 measured epochs; --quick: at most 8,192 training
windows (the first ones), 1 warm-up and 2 measured epochs. --data-dir
defaults to $ESPER_TEXT_CORPUS_DIR, then /usr/share/games/fortunes.
--synthetic draws a seeded text of about the real window counts (35,800
training, 4,200 validation), each token followed by its fixed successor nine
times in ten and by a random token otherwise (the same kind of text as
tolaria::data::text::synthetic, drawn with torch's generator), for machines
without the corpus. (The Rust side's synthetic text is lm-synthetic's 2,048
training and 256 validation windows: compare per-window figures then.)
With --merge-into, the results (impl "python") replace the python results of
the same mode names in an existing record written by `esper bench
tolaria-lm` (so a --no-aggregation run's -plain entries join the others; its
params go to params.python_peer_plain, the aggregating run's to
params.python_peer); --out writes a standalone record of the same shape.
Both targets are checked before the first mode runs (a record that does not
exist, or of another workload, is refused with exit code 2); a record that
cannot be written later leaves the entries measured so far on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from peer_common import (GRAPH_WARMUP_STEPS, HAND_GRAPH, DataError, Mode, StepTrainer, as_metrics,
                         describe_compile_mode, log, measure_mode, pick_device, run_entry, write_all)

WORKLOAD = "tolaria-lm"
DIR_ENV = "ESPER_TEXT_CORPUS_DIR"
DEFAULT_DIR = "/usr/share/games/fortunes"
MAX_CORPUS_BYTES = 64 << 20  # tolaria::data::text::MAX_CORPUS_BYTES
SEPARATOR = b"\n\n"
ASCII_WHITESPACE = b" \t\n\r\x0c"  # Rust's u8::is_ascii_whitespace (no vertical tab)
VALIDATION_FRACTION = 0.1
SYNTHETIC_TRAIN_WINDOWS = 35_800
SYNTHETIC_VALIDATION_WINDOWS = 4_200
SYNTHETIC_SUCCESSOR_SHARE = 0.9

VOCAB = 256
WIDTH = 128
HEADS = 4
HEAD_DIM = WIDTH // HEADS
LAYERS = 3
CONTEXT = 64
EMBEDDING_INIT_STD = 0.02
NORM_EPS = 1e-5
ALPHA = 0.5
TAPPED_SLOTS = ("r0c0", "r0c1")  # the seeds that feed the host gradient (not isolated), in execution order
MLP_SMALL_EXPANSION = 2
SEED_HEADS = 4

BATCH = 128
VALIDATION_BATCH = 1024
QUICK_TRAIN_WINDOWS = 8192
LR, BETAS, ADAM_EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
INIT_SEED = 20251001
DATA_SEED = 20251002
SPLIT_SEED = 20_261_128  # tolaria::engine::bench::lm::SEED (the Rust benchmark's document split)

HOST_PARAMS = VOCAB * WIDTH + CONTEXT * WIDTH + LAYERS * (12 * WIDTH**2 + 13 * WIDTH) + 2 * WIDTH
MLP_SMALL_PARAMS = 4 * WIDTH**2 + 3 * WIDTH
ATTENTION_PARAMS = 4 * WIDTH**2 + 4 * WIDTH



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
PLAIN_SUFFIX = "-plain"


def entry_mode(mode: str, aggregation: bool) -> str:
    """The record's mode name: `mode`, or `mode-plain` for the plain step."""
    return mode if aggregation else f"{mode}{PLAIN_SUFFIX}"


GRADIENT_AGGREGATION = "teacher + PCGrad over per-seed contributions, as tolaria::grad_agg"
PLAIN_STEP = (f"none: one plain loss.backward() (--no-aggregation; modes suffixed {PLAIN_SUFFIX}), "
              "not what the Rust step does")
COMPILED_TAP_STEP = ("three: the forward cut at the two gradient taps (the last stage with the loss), "
                     "backward by AOTAutograd; the views, the autograd.grad calls (each re-running the "
                     "compiled backward of the stages it crosses), the aggregation and AdamW eager between "
                     "and after them")
PARAMS = {
    "host": {"config": "TransformerHostConfig {vocab 256, width 128, 4 heads, 3 layers, block 64, 3 segments}",
             "vocab_size": VOCAB, "n_embd": WIDTH, "n_head": HEADS, "n_layer": LAYERS, "block_size": CONTEXT,
             "num_segments": LAYERS, "tied_head": True, "dropout": 0.0, "param_count": HOST_PARAMS},
    "seeds": [
        {"slot": "r0c0", "blueprint": "mlp_small", "expansion": MLP_SMALL_EXPANSION, "blend": "add",
         "alpha": ALPHA, "gradient_isolation": False, "param_count": MLP_SMALL_PARAMS},
        {"slot": "r0c1", "blueprint": "attention", "heads": SEED_HEADS, "causal": True, "blend": "add",
         "alpha": ALPHA, "gradient_isolation": False, "param_count": ATTENTION_PARAMS},
        {"slot": "r0c2", "blueprint": None},
    ],
    "optimizers": {"adamw": {"learning_rate": LR, "betas": list(BETAS), "eps": ADAM_EPS,
                             "weight_decay": WEIGHT_DECAY},
                   "groups": ["host", "seed r0c0", "seed r0c1"], "fused_on_cuda": True,
                   "capturable": "in graph and inductor-graph modes",
                   "python": "one torch.optim.AdamW with the three groups"},
    "loss": "softmax cross-entropy over 256 tokens, mean over all batch x context tokens",
    "batch_size": BATCH,
    "tokens_per_batch": BATCH * CONTEXT,
    "context": CONTEXT,
    "drop_last": True,
    "validation_batch": VALIDATION_BATCH,
    "shuffle": "torch.randperm on the device every epoch",
    "tf32": True,
    "init_seed": INIT_SEED,
    "graph_warmup_steps": GRAPH_WARMUP_STEPS,
    "gradient_aggregation": GRADIENT_AGGREGATION,
    "gradient_step": {
        "taps": "each seed fed a distinct view of the host features (kasmina forward_tapped)",
        "backward": "autograd.grad of the loss over host, seed parameters and taps; per tap "
                    "autograd.grad of (tap * tap_grad).sum() over the host parameters",
        "teacher": "host gradient less the sum of the seeds' parts",
        "pcgrad": "2+ seeds, fixed ascending order, against the original seed gradients, dot products "
                  "over all host parameters flattened; Gram matrix as a matmul (TF32 where on), "
                  "aggregate as the rows weighted and summed elementwise, k x k coefficients in float64",
        "seed_gradients": "plain (from the first autograd.grad)",
        "plain_modes": PLAIN_STEP,
    },
    "grad_scaler": "none (fp32 and bf16; Rust's GradScaler scales fp16 only)",
    "gradient_clipping": "off (the Rust default, as its benchmark)",
    "gradient_telemetry": "not computed (Rust gathers gradient norms every 10th step and the "
                          "aggregation's conflict counts: telemetry only, no change to the update)",
}


# -- data ------------------------------------------------------------------

HINT = (f"Install Debian's fortunes package (`cargo xtask provision` does), point --data-dir or ${DIR_ENV} "
        "at a folder of text files whose documents are separated by lines holding `%`, or pass --synthetic.")


def data_dir(arg: str | None) -> str:
    return arg or os.environ.get(DIR_ENV) or DEFAULT_DIR


def corpus_files(directory: str) -> list[str]:
    """Regular, non-hidden files without an extension, in name (byte) order;
    symbolic links are not regular files (as Rust's DirEntry::file_type)."""
    if not os.path.isdir(directory):
        raise DataError(f"text corpus folder {directory} not found. {HINT}")
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries
                     if entry.is_file(follow_symlinks=False) and not entry.name.startswith(".")
                     and "." not in entry.name]
    except OSError as error:
        raise DataError(f"{directory}: cannot be listed ({error}). {HINT}") from None
    return [os.path.join(directory, name) for name in sorted(names, key=os.fsencode)]


def split_documents(data: bytes) -> list[bytes]:
    """A file's documents: split at lines that are exactly `%` (without the
    newline), stripped of ASCII whitespace at both ends, empty ones dropped."""
    documents, lines = [], []
    for line in data.split(b"\n"):
        if line == b"%":
            documents.append(b"\n".join(lines).strip(ASCII_WHITESPACE))
            lines = []
        else:
            lines.append(line)
    documents.append(b"\n".join(lines).strip(ASCII_WHITESPACE))
    return [document for document in documents if document]


def read_documents(directory: str) -> list[bytes]:
    documents, total = [], 0
    for path in corpus_files(directory):
        try:
            total += os.path.getsize(path)
            if total > MAX_CORPUS_BYTES:
                raise DataError(f"the corpus in {directory} exceeds {MAX_CORPUS_BYTES} bytes")
            with open(path, "rb") as handle:
                documents.extend(split_documents(handle.read()))
        except OSError as error:
            raise DataError(f"{path}: cannot be read ({error}). {HINT}") from None
    if not documents:
        raise DataError(f"{directory} holds no document. {HINT}")
    return documents


MASK64 = (1 << 64) - 1
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def splitmix_permutation(n: int, seed: int) -> list[int]:
    """leyline's SplitMix64 Fisher-Yates (tolaria::data::shuffle::permutation),
    with Lemire's unbiased `below`."""
    state = seed & MASK64

    def next_u64() -> int:
        nonlocal state
        state = (state + GOLDEN) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * MIX1) & MASK64
        z = ((z ^ (z >> 27)) * MIX2) & MASK64
        return z ^ (z >> 31)

    def below(bound: int) -> int:
        threshold = ((1 << 64) - bound) % bound
        while True:
            product = next_u64() * bound
            if (product & MASK64) >= threshold:
                return product >> 64

    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = min(below(i + 1), i)
        order[i], order[j] = order[j], order[i]
    return order


def windows(name: str, documents: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents joined into one byte stream, cut into windows of CONTEXT
    inputs and their next-token targets; int64 [n, CONTEXT] each."""
    stream = SEPARATOR.join(documents)
    count = (len(stream) - 1) // CONTEXT if stream else 0
    if count < 1:
        raise DataError(f"{name}: {len(stream)} tokens make no window of {CONTEXT + 1} tokens")
    tokens = torch.frombuffer(bytearray(stream), dtype=torch.uint8).to(torch.int64)
    inputs = tokens[:count * CONTEXT].view(count, CONTEXT)
    targets = tokens[1:count * CONTEXT + 1].view(count, CONTEXT)
    return inputs.clone(), targets.clone()


def load_corpus(directory: str, split_seed: int):
    """((train inputs, targets), (validation inputs, targets)), counts."""
    documents = read_documents(directory)
    n = len(documents)
    order = splitmix_permutation(n, split_seed)
    held_out = math.floor(n * VALIDATION_FRACTION + 0.5)  # f64::round, half away from zero
    held_out = min(max(held_out, 1), max(n - 1, 1))
    validation = [documents[i] for i in order[:held_out]]
    train = [documents[i] for i in order[held_out:]]
    counts = {"documents": n, "train_documents": len(train), "validation_documents": len(validation),
              "corpus_bytes": sum(len(d) for d in documents), "split_seed": split_seed}
    return (windows("fortunes-train", train), windows("fortunes-validation", validation)), counts


def synthetic_stream(n_tokens: int, gen: torch.Generator) -> torch.Tensor:
    """A seeded token stream: each token followed by its fixed successor (a
    seeded permutation) nine times in ten, by a uniform random token otherwise."""
    successor = torch.randperm(VOCAB, generator=gen)
    random_tokens = torch.randint(0, VOCAB, (n_tokens,), generator=gen)
    fresh = torch.rand(n_tokens, generator=gen) >= SYNTHETIC_SUCCESSOR_SHARE
    fresh[0] = True
    index = torch.arange(n_tokens)
    start = torch.where(fresh, index, torch.zeros_like(index)).cummax(0).values
    offset = index - start
    tokens = random_tokens[start]
    for k in range(int(offset.max())):  # successor^offset of each run's first token
        active = offset > k
        tokens = torch.where(active, successor[tokens], tokens)
    return tokens


def synthetic_data():
    gen = torch.Generator().manual_seed(DATA_SEED)
    n_train, n_val = SYNTHETIC_TRAIN_WINDOWS, SYNTHETIC_VALIDATION_WINDOWS
    stream = synthetic_stream((n_train + n_val) * CONTEXT + 2, gen)

    def cut(part: torch.Tensor, count: int):
        return (part[:count * CONTEXT].reshape(count, CONTEXT).clone(),
                part[1:count * CONTEXT + 1].reshape(count, CONTEXT).clone())

    train = cut(stream[:n_train * CONTEXT + 1], n_train)
    validation = cut(stream[n_train * CONTEXT + 1:], n_val)
    return (train, validation), {"synthetic_successor_share": SYNTHETIC_SUCCESSOR_SHARE}


# -- the network -------------------------------------------------------------

def _linear(in_features: int, out_features: int, zero: bool = False) -> nn.Linear:
    """nn.Linear with its own (PyTorch default) initialisation; `zero` zeroes
    weight and bias after the draws (kasmina's Linear::zero_ at birth)."""
    layer = nn.Linear(in_features, out_features, bias=True)
    if zero:
        with torch.no_grad():
            layer.weight.zero_()
            layer.bias.zero_()
    return layer


def _embedding(rows: int) -> nn.Module:
    module = nn.Module()
    module.weight = nn.Parameter(torch.empty(rows, WIDTH).normal_(0.0, EMBEDDING_INIT_STD))
    return module


def _layer_norm() -> nn.LayerNorm:
    return nn.LayerNorm(WIDTH, eps=NORM_EPS)


def _norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, (WIDTH,), norm.weight, norm.bias, NORM_EPS)


def causal_self_attention(x: torch.Tensor, qkv: nn.Linear, proj: nn.Linear, heads: int) -> torch.Tensor:
    """kasmina::layers::causal_self_attention: [B, T, C] -> [B, T, C]."""
    batch, time_, width = x.shape
    head_dim = width // heads
    q, k, v = F.linear(x, qkv.weight, qkv.bias).split(width, dim=2)
    q = q.reshape(batch, time_, heads, head_dim).transpose(1, 2)
    k = k.reshape(batch, time_, heads, head_dim).transpose(1, 2)
    v = v.reshape(batch, time_, heads, head_dim).transpose(1, 2)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
    merged = attended.transpose(1, 2).contiguous().reshape(batch, time_, width)
    return F.linear(merged, proj.weight, proj.bias)


class LmNet(nn.Module):
    """TransformerHost (vocab 256, width 128, 4 heads, 3 layers, block 64)
    with mlp_small at r0c0 and attention at r0c1, r0c2 empty.

    Parameter names follow the Rust VarStores: host `wte.weight`,
    `wpe.weight`, `h{i}.{ln1,qkv,attn_proj,ln2,fc,mlp_proj}.{weight,bias}`,
    `ln_f.{weight,bias}`; seed r0c0 `fc1`, `fc2`; seed r0c1 `qkv`, `proj`.
    The forward is functional (F.*) over those tensors: no per-layer module
    call overhead in eager mode.
    """

    def __init__(self) -> None:
        super().__init__()
        host = nn.Module()
        host.wte = _embedding(VOCAB)
        host.wpe = _embedding(CONTEXT)
        for layer in range(LAYERS):
            block = nn.Module()
            block.ln1 = _layer_norm()
            block.qkv = _linear(WIDTH, 3 * WIDTH)
            block.attn_proj = _linear(WIDTH, WIDTH)
            block.ln2 = _layer_norm()
            block.fc = _linear(WIDTH, 4 * WIDTH)
            block.mlp_proj = _linear(4 * WIDTH, WIDTH)
            host.add_module(f"h{layer}", block)
        host.ln_f = _layer_norm()
        self.host = host

        mlp_small = nn.Module()
        mlp_small.fc1 = _linear(WIDTH, MLP_SMALL_EXPANSION * WIDTH)
        mlp_small.fc2 = _linear(MLP_SMALL_EXPANSION * WIDTH, WIDTH, zero=True)
        self.seed_r0c0 = mlp_small

        attention = nn.Module()
        attention.qkv = _linear(WIDTH, 3 * WIDTH)
        attention.proj = _linear(WIDTH, WIDTH, zero=True)
        self.seed_r0c1 = attention
        self.blocks = [getattr(host, f"h{layer}") for layer in range(LAYERS)]

    def groups(self):
        """The three parameter groups: host, seed r0c0, seed r0c1."""
        return [list(self.host.parameters()), list(self.seed_r0c0.parameters()),
                list(self.seed_r0c1.parameters())]

    @staticmethod
    def _block(block, x: torch.Tensor) -> torch.Tensor:
        x = x + causal_self_attention(_norm(x, block.ln1), block.qkv, block.attn_proj, HEADS)
        hidden = F.gelu(F.linear(_norm(x, block.ln2), block.fc.weight, block.fc.bias))
        return x + F.linear(hidden, block.mlp_proj.weight, block.mlp_proj.bias)

    def _mlp_small(self, h: torch.Tensor) -> torch.Tensor:
        seed = self.seed_r0c0
        hidden = F.gelu(F.linear(h, seed.fc1.weight, seed.fc1.bias))
        return h + F.linear(hidden, seed.fc2.weight, seed.fc2.bias)

    def _attention(self, h: torch.Tensor) -> torch.Tensor:
        seed = self.seed_r0c1
        return h + causal_self_attention(h, seed.qkv, seed.proj, SEED_HEADS)

    @staticmethod
    def _blend(host: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
        # kasmina::blend::blend_add: the seed output in the host's dtype, lerp.
        return torch.lerp(host, seed.to(host.dtype), ALPHA)

    # The forward in three stages, cut at the two seeded slots, so the
    # gradient-tap step can hand each seed a distinct view of the host
    # features between them (and a compiled mode compiles each stage).
    def stage_r0c0(self, tokens: torch.Tensor) -> torch.Tensor:
        """int64 [B, T] -> the host features at r0c0 (embedding, layer 0)."""
        host = self.host
        x = F.embedding(tokens, host.wte.weight) + host.wpe.weight[:tokens.shape[1]]
        return self._block(self.blocks[0], x)

    def stage_r0c1(self, h: torch.Tensor, seed_input: torch.Tensor) -> torch.Tensor:
        """Slot r0c0 (the host features `h`, mlp_small fed `seed_input`),
        layer 1 -> the host features at r0c1."""
        x = self._blend(h, self._mlp_small(seed_input))  # no detach: not isolated
        return self._block(self.blocks[1], x)

    def stage_logits(self, h: torch.Tensor, seed_input: torch.Tensor) -> torch.Tensor:
        """Slot r0c1 (attention fed `seed_input`), layer 2 (r0c2 is empty),
        the tied head -> logits [B, T, 256]."""
        x = self._blend(h, self._attention(seed_input))
        x = self._block(self.blocks[2], x)
        return F.linear(_norm(x, self.host.ln_f), self.host.wte.weight)  # h @ wte.T

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """int64 [B, T] -> logits [B, T, 256]; each seed sees the host
        features themselves (no taps)."""
        h0 = self.stage_r0c0(tokens)
        h1 = self.stage_r0c1(h0, h0)
        return self.stage_logits(h1, h1)


def param_counts(model: LmNet) -> dict:
    """Parameters of the host and each seed, checked against the Rust formulas."""
    host, mlp_small, attention = (sum(p.numel() for p in group) for group in model.groups())
    counts = {"host": host, "seed_r0c0_mlp_small": mlp_small, "seed_r0c1_attention": attention}
    expected = {"host": HOST_PARAMS, "seed_r0c0_mlp_small": MLP_SMALL_PARAMS,
                "seed_r0c1_attention": ATTENTION_PARAMS}
    if counts != expected:
        raise RuntimeError(f"parameter counts {counts} differ from the workload's {expected}")
    return counts


def build_model(device: torch.device) -> LmNet:
    """The network with its seeded initialisation (the same in every mode)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        model = LmNet()
    param_counts(model)
    return model.to(device)


def build_optimizer(model: LmNet, fused: bool, capturable: bool) -> torch.optim.Optimizer:
    """One AdamW over the three parameter groups (the same update as one
    optimizer a group, in one step() call)."""
    kwargs = {"fused": True, "capturable": capturable} if fused else {}
    host, seed0, seed1 = model.groups()
    return torch.optim.AdamW(
        [{"params": host}, {"params": seed0}, {"params": seed1}],
        lr=LR, betas=BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY, **kwargs)


# -- gradient aggregation (tolaria::engine::model_step, tolaria::grad_agg) ------

def split_host_gradient(loss: torch.Tensor, taps: list[torch.Tensor], host: list[torch.Tensor],
                        seeds: list[torch.Tensor]):
    """ModelStep::tapped_backward's autograd part: the loss's gradients of
    the host parameters (the total), of the seed parameters, and one
    per-seed part of the host gradient per tap, the host gradient through
    that seed's branch alone: the gradient of `(tap * tap_grad).sum()`
    (tap_grad detached) with respect to the host parameters. A host
    parameter that a tap does not reach (above its slot) has None there
    (Rust: undefined; the aggregator zeroes those rows)."""
    grads = torch.autograd.grad(loss, [*host, *seeds, *taps], retain_graph=True)
    host_total = grads[:len(host)]
    seed_grads = grads[len(host):len(host) + len(seeds)]
    per_seed = []
    for tap, tap_grad in zip(taps, grads[len(host) + len(seeds):]):
        root = (tap * tap_grad.detach()).sum()
        per_seed.append(torch.autograd.grad(root, host, retain_graph=True, allow_unused=True))
    return host_total, seed_grads, per_seed


def _flat_views(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of the 1-D `flat` shaped like each tensor of `like`, one after another."""
    views, offset = [], 0
    for tensor in like:
        views.append(flat[offset:offset + tensor.numel()].view(tensor.shape))
        offset += tensor.numel()
    return views


class GradAggregator:
    """tolaria::grad_agg::GradAggregator (its aggregate_total) for one
    layout (the host parameters' gradients `out`) and a fixed number of
    seeds: writes `teacher + Σ seeds'` into `out`, the teacher being the
    total host gradient less the sum of the seeds' parts.

    0 seeds: the total passes through. 1 seed: teacher + seed, elementwise
    (Rust's single-seed fast path; its general path, taken when attribution
    does not confirm the one seed, forms the same weighted sum; this
    workload has two seeds).
    2 or more: PCGrad in the fixed ascending order: each seed's gradient
    g_i' loses its component along the *original* g_j of every other seed j
    whose dot product with g_i' (over all host parameters together) is
    negative; the teacher is neither projected nor projected against.

    As Rust's device-only form: one preallocated [k + 1, numel] buffer of
    rows (teacher, seed 1..k), filled by one _foreach_copy_ (a seed's
    undefined gradients zero their part of its row: one _foreach_zero_),
    then row 0 -= the sum of the seed rows (the teacher); the Gram
    matrix D = G Gᵀ in one matmul (in the matmul precision in force: TF32
    where enabled), then in float64 a coefficient matrix C (identity at the
    start, g_i' = Σ_m C[i, m] g_m, so g_i'·g_j = (C D)[i, j]) updated one
    column j at a time with `(dot < 0)` as a float multiplier (no branch on a
    device value, no readback: CUDA-graph capturable); the aggregate is
    (1ᵀ C) G, the rows weighted and summed elementwise in the gradients'
    precision, copied into `out` by one _foreach_copy_. Rust's aggregation telemetry (conflicts, teacher
    share; read once an epoch) changes no gradient and is not computed."""

    def __init__(self, out: list[torch.Tensor], seeds: int) -> None:
        if seeds < 0 or not out:
            raise ValueError(f"GradAggregator: {seeds} seeds over {len(out)} gradients")
        self.out = list(out)
        self.seeds = seeds
        rows = seeds + 1
        first = self.out[0]
        numel = sum(tensor.numel() for tensor in self.out)
        self.rows = torch.zeros((rows, numel), dtype=first.dtype, device=first.device)
        self.row_views = [_flat_views(self.rows[row], self.out) for row in range(rows)]
        self.aggregate = torch.zeros((1, numel), dtype=first.dtype, device=first.device)
        self.aggregate_views = _flat_views(self.aggregate[0], self.out)
        f64 = {"dtype": torch.float64, "device": first.device}
        self.eye = torch.eye(rows, **f64)
        self.coef = torch.zeros((rows, rows), **f64)
        # allowed[j, i] = 1 when seed row i may be projected off row j.
        self.allowed = torch.tensor([[1.0 if i >= 1 and i != j else 0.0 for i in range(rows)]
                                     for j in range(rows)], **f64)
        self.tiny = torch.finfo(torch.float64).tiny  # Rust's f64::MIN_POSITIVE

    def __call__(self, total, per_seed) -> None:
        """`total`: the host gradient, one tensor per entry of `out`;
        `per_seed`: per seed, one tensor or None (not reached: zero) per
        entry of `out`. Nothing is read back."""
        if len(per_seed) != self.seeds:
            raise ValueError(f"GradAggregator: {len(per_seed)} seed parts, built for {self.seeds}")
        if self.seeds == 0:
            torch._foreach_copy_(self.out, list(total))
            return
        self._fill_rows(total, per_seed)
        if self.seeds == 1:
            torch.add(self.rows[0], self.rows[1], out=self.aggregate[0])
        else:
            self._pcgrad()
        torch._foreach_copy_(self.out, self.aggregate_views)

    def _fill_rows(self, total, per_seed) -> None:
        """Rows: the total in row 0 and each seed's part in its row (one
        _foreach_copy_; undefined parts zeroed by one _foreach_zero_), then
        row 0 -= the sum of the seed rows: the teacher."""
        dst, src, zero = list(self.row_views[0]), list(total), []
        for row, grads in enumerate(per_seed, start=1):
            for view, grad in zip(self.row_views[row], grads):
                if grad is None:
                    zero.append(view)
                else:
                    dst.append(view)
                    src.append(grad)
        torch._foreach_copy_(dst, src)
        if zero:
            torch._foreach_zero_(zero)
        self.rows[0].sub_(self.rows[1:].sum(0))

    def _pcgrad(self) -> None:
        rows = self.rows
        gram = torch.mm(rows, rows.t()).double()
        coef = self.coef
        coef.copy_(self.eye)
        for j in range(1, self.seeds + 1):
            column = gram[:, j]
            dots = torch.mv(coef, column)  # g_i'·g_j for every row i
            mask = (dots < 0).double() * self.allowed[j]
            coef[:, j].sub_(dots * mask / column[j].clamp_min(self.tiny))
        weights = coef.sum(0, keepdim=True).to(rows.dtype)
        # Σ_i w_i g_i elementwise in the gradients' precision, as Rust does
        # (a matmul would round every element to TF32 where TF32 is on).
        torch.sum(rows * weights.t(), dim=0, keepdim=True, out=self.aggregate)


# -- training ----------------------------------------------------------------

class Trainer(StepTrainer):
    """One mode's model and optimizer around peer_common's epoch loop; with
    `aggregation` the step is Rust's gradient-tap step (teacher + PCGrad),
    without it one plain backward (the record's mode name gets `-plain`)."""

    def __init__(self, mode: str, data, device: torch.device, steps_per_epoch: int,
                 aggregation: bool = True) -> None:
        spec = MODES[mode]
        super().__init__(entry_mode(mode, aggregation), spec, data, device, steps_per_epoch, BATCH, DATA_SEED)
        self.aggregation = aggregation
        self.model = build_model(device)
        self.optimizer = build_optimizer(self.model, fused=self.cuda, capturable=self.graphed)
        host, seed_r0c0, seed_r0c1 = self.model.groups()
        self.host_params, self.seed_params = host, seed_r0c0 + seed_r0c1
        self.params = self.host_params + self.seed_params
        if aggregation:
            # Gradients live for the whole run (as Rust's materialised ones,
            # zeroed before a tap step): every step writes them in place, so
            # a captured step writes tensors that outlive the graph.
            for p in self.params:
                p.grad = torch.zeros_like(p)
            self.aggregator = GradAggregator([p.grad for p in self.host_params], seeds=len(TAPPED_SLOTS))
        self.train_fn = self.forward_loss
        self.stages = (self.model.stage_r0c0, self.model.stage_r0c1, self.stage_loss)
        self.eval_fn = self.eval_sums
        if self.compiled:
            # Static shapes (every batch is 128 windows; validation batches
            # of 1,024 and one shorter last one, compiled once each),
            # fullgraph (a graph break fails the mode rather than running
            # part of it eagerly): the plain step's forward + loss as one
            # graph; the tap step's forward as three, cut at the taps (the
            # views between them are the seeds' inputs, so autograd can
            # take gradients at them). The validation step: Inductor's
            # default mode in every compiled mode (it runs once an epoch;
            # no CUDA graphs).
            def compiled(fn):
                return torch.compile(fn, mode=spec.compile_mode, dynamic=False, fullgraph=True)

            if aggregation:
                self.stages = tuple(compiled(stage) for stage in self.stages)
            else:
                self.train_fn = compiled(self.forward_loss)
            self.eval_fn = torch.compile(self.eval_sums, dynamic=False, fullgraph=True)

    # the step ---------------------------------------------------------------
    @staticmethod
    def loss(logits, y):
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def forward_loss(self, x, y):
        return self.loss(self.model(x), y)

    def stage_loss(self, h, seed_input, y):
        return self.loss(self.model.stage_logits(h, seed_input), y)

    def tapped_loss(self, x, y):
        """kasmina's forward_tapped: at each slot with a live, non-isolated
        seed the seed's input is a distinct view of the host features (the
        tap); the blend still takes the features themselves. Returns the
        loss and the taps (execution order)."""
        stage_r0c0, stage_r0c1, stage_loss = self.stages
        h0 = stage_r0c0(x)
        tap_r0c0 = h0.view_as(h0)
        h1 = stage_r0c1(h0, tap_r0c0)
        tap_r0c1 = h1.view_as(h1)
        return stage_loss(h1, tap_r0c1, y), [tap_r0c0, tap_r0c1]

    def aggregated_gradients(self, x, y):
        """ModelStep::tapped_backward: the host gradient split into the
        teacher and one part per seed, aggregated (GradAggregator) into the
        host parameters' .grad; the seeds' .grad their plain gradients.
        Returns the loss."""
        with self.autocast():
            loss, taps = self.tapped_loss(x, y)
        host_total, seed_grads, per_seed = split_host_gradient(loss, taps, self.host_params, self.seed_params)
        self.aggregator(host_total, per_seed)
        torch._foreach_copy_([p.grad for p in self.seed_params], list(seed_grads))
        return loss

    def eval_sums(self, x, y):
        """Summed token loss (fp32) and correct argmax predictions of a batch."""
        logits = self.model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1), reduction="sum")
        correct = (logits.argmax(-1) == y).sum()
        return loss, correct

    def step(self, x, y):
        if self.inductor_cudagraphs:
            # A new iteration: the previous step's graph outputs may be reused.
            torch.compiler.cudagraph_mark_step_begin()
        if self.aggregation:
            loss = self.aggregated_gradients(x, y)
        else:
            with self.autocast():
                loss = self.train_fn(x, y)
            loss.backward()
        self.optimizer.step()
        loss = loss.detach()
        self.loss_sum.add_(loss)
        return loss

    def zero_grads(self):
        """The plain step's gradients to None (its backward writes fresh
        ones; a captured one in the graph's pool). The tap step's persist:
        every step overwrites them."""
        if not self.aggregation:
            super().zero_grads()

    def validate(self):
        """Token loss and accuracy on the validation windows; returns (ms, loss, accuracy)."""
        self.sync()
        started = time.perf_counter()
        n = self.val_x.shape[0]
        with torch.inference_mode(), self.autocast():
            loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
            correct = torch.zeros((), dtype=torch.int64, device=self.device)
            for lo in range(0, n, VALIDATION_BATCH):
                batch_loss, batch_correct = self.eval_fn(self.val_x[lo:lo + VALIDATION_BATCH],
                                                         self.val_y[lo:lo + VALIDATION_BATCH])
                loss_sum += batch_loss
                correct += batch_correct
            loss_value, correct_value = torch.stack([loss_sum, correct.float()]).tolist()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        tokens = n * CONTEXT
        return elapsed_ms, loss_value / tokens, correct_value / tokens


def run_mode(mode: str, data, device: torch.device, args) -> dict:
    trainer, metrics = measure_mode(
        lambda: Trainer(mode, data, device, args.steps_per_epoch, aggregation=args.aggregation),
        entry_mode(mode, args.aggregation), device, args,
        lambda loss, accuracy: f"val loss {loss:.4f}, accuracy {accuracy:.4f}, perplexity {math.exp(loss):.3f}")
    samples_per_s = metrics["samples_per_s"]
    metrics.update(
        tokens_per_s=samples_per_s * CONTEXT if samples_per_s else None,
        train_tokens_per_epoch=trainer.steps * BATCH * CONTEXT,
        validation_samples=trainer.val_x.shape[0],
    )
    if metrics.get("val_loss") is not None:
        metrics["val_perplexity"] = math.exp(metrics["val_loss"])
    return as_metrics(metrics)


# -- records -----------------------------------------------------------------

TABLE = [("epoch_ms_p50", "p50 ms", 1), ("epoch_ms_p95", "p95 ms", 1), ("tokens_per_s", "tokens/s", 0),
         ("validation_ms_p50", "val ms", 2), ("capture_ms", "capture ms", 1), ("compile_s", "compile s", 1),
         ("replay_ms_per_epoch", "replay ms", 1), ("kernels_per_step", "kernels", 0),
         ("peak_memory_bytes", "peak MiB", -1), ("final_train_loss", "loss", 4), ("val_loss", "val loss", 4),
         ("val_perplexity", "val ppl", 3), ("val_accuracy", "val acc", 4)]


def merge_params(record_params: dict, params: dict) -> None:
    """This run's params: the record's python_peer (the aggregating step)
    or python_peer_plain (--no-aggregation)."""
    plain = params.get("gradient_aggregation") == PLAIN_STEP
    record_params["python_peer_plain" if plain else "python_peer"] = params


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merge-into", help="replace the python results of this baseline record")
    parser.add_argument("--out", help="write a standalone record (DESIGN section 7 shape) here")
    parser.add_argument("--label", default=f"python-{datetime.date.today().isoformat()}",
                        help="label of a standalone record")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data-dir", help=f"the text corpus folder (default ${DIR_ENV}, then {DEFAULT_DIR})")
    source.add_argument("--synthetic", action="store_true", help="a seeded synthetic text of about the real size")
    parser.add_argument("--split-seed", type=int, default=SPLIT_SEED,
                        help=f"seed of the documents' order (default {SPLIT_SEED}, the Rust benchmark's)")
    parser.add_argument("--quick", action="store_true",
                        help=f"at most {QUICK_TRAIN_WINDOWS} training windows, 2 measured epochs after 1 warm-up")
    parser.add_argument("--epochs", type=int, help="measured epochs (default 5; --quick 2)")
    parser.add_argument("--warmup-epochs", type=int, help="warm-up epochs (default 2; --quick 1)")
    parser.add_argument("--steps-per-epoch", type=int,
                        help="fewer steps an epoch, for smoke tests (default: every full batch)")
    parser.add_argument("--modes", default=",".join(ALL_MODES))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-kernels", dest="kernels", action="store_false",
                        help="skip the one-step kernel profile")
    parser.add_argument("--no-aggregation", dest="aggregation", action="store_false",
                        help=f"one plain backward instead of the gradient-tap step with teacher + PCGrad "
                             f"(record modes get the suffix {PLAIN_SUFFIX})")
    args = parser.parse_args()
    args.epochs = args.epochs if args.epochs is not None else (2 if args.quick else 5)
    args.warmup_epochs = args.warmup_epochs if args.warmup_epochs is not None else (1 if args.quick else 2)
    if args.epochs < 1 or args.warmup_epochs < 0 or (args.steps_per_epoch is not None and args.steps_per_epoch < 1):
        parser.error("--epochs must be >= 1, --warmup-epochs >= 0, --steps-per-epoch >= 1")
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in args.modes if m not in ALL_MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(ALL_MODES)}")
    return args


def load_data(args) -> tuple:
    """((train x, y), (validation x, y)) on the CPU, the source's description and counts."""
    if args.synthetic:
        data, counts = synthetic_data()
        return data, "synthetic (seeded successor text, about the real window counts)", counts
    directory = data_dir(args.data_dir)
    origin = "--data-dir" if args.data_dir else DIR_ENV if os.environ.get(DIR_ENV) else "default dir"
    data, counts = load_corpus(directory, args.split_seed)
    return data, f"fortunes ({origin}: {directory})", counts


def compile_modes(modes: list[str], aggregation: bool) -> dict:
    """For the record's params: each compiled mode's torch.compile mode and
    the Inductor options it sets (as this torch defines the mode)."""
    described = {}
    graphs = (COMPILED_TAP_STEP if aggregation
              else "one: forward + loss (backward by AOTAutograd); loss.backward() and AdamW eager")
    for mode in modes:
        description = describe_compile_mode(MODES[mode])
        if description is not None:
            described[entry_mode(mode, aggregation)] = {
                **description, "fullgraph": True, "training_graphs": graphs,
                "validation": "torch.compile, mode default"}
    return described


def main() -> int:
    args = parse_args()
    device = pick_device(args.device)

    try:
        data, source, counts = load_data(args)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    (train_x, train_y), (val_x, val_y) = data
    counts.update(train_windows_all=train_x.shape[0], validation_windows=val_x.shape[0])
    if args.quick and train_x.shape[0] > QUICK_TRAIN_WINDOWS:
        train_x, train_y = train_x[:QUICK_TRAIN_WINDOWS], train_y[:QUICK_TRAIN_WINDOWS]
    full_steps = train_x.shape[0] // BATCH
    if full_steps < 1:
        print(f"error: {train_x.shape[0]} training windows make no batch of {BATCH}", file=sys.stderr)
        return 2
    args.steps_per_epoch = min(args.steps_per_epoch or full_steps, full_steps)

    params = dict(PARAMS)
    if not args.aggregation:
        params["gradient_aggregation"] = PLAIN_STEP
    params["data"] = source
    params["data_counts"] = counts
    params["train_samples"] = train_x.shape[0]
    params["validation_samples"] = val_x.shape[0]
    params["steps_per_epoch"] = args.steps_per_epoch
    params["train_samples_per_epoch"] = args.steps_per_epoch * BATCH
    if args.steps_per_epoch != full_steps:
        params["note"] = f"smoke run: fewer steps an epoch than the data's {full_steps}"
    params["epochs"] = {"warmup": args.warmup_epochs, "measured": args.epochs}
    if any(MODES[mode].compile_mode for mode in args.modes):
        params["compile_modes"] = compile_modes(args.modes, args.aggregation)
    data = ((train_x.to(device), train_y.to(device)), (val_x.to(device), val_y.to(device)))
    log(f"[python] {WORKLOAD} on {device}: data {source}, {train_x.shape[0]} train / {val_x.shape[0]} "
        f"validation windows, {args.warmup_epochs} warm-up + {args.epochs} measured epochs of "
        f"{args.steps_per_epoch} steps, modes {', '.join(args.modes)}")

    return write_all(WORKLOAD, args, device, params, args.modes, lambda mode: run_entry(
        entry_mode(mode, args.aggregation), MODES[mode], device, lambda: run_mode(mode, data, device, args)),
        TABLE, merge_params)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
