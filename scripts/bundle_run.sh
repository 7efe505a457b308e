#!/usr/bin/env bash
# run.sh: runs the Esper-rs bench bundle on the GPU machine (made by `cargo xtask bundle`).
#
#   bash bundle/run.sh [--quick] [--label LABEL] [--workload NAME]... [--no-tests] [--no-python]
#                      [--kernels] [--gpus 1,2] [--torchrun] [--no-concurrent] [--variants LIST] [--rounds N] [--ppo-epochs N]
#                      [--episode head|medium|short|N] [--seeds N] [--task NAME]
#                      [--set KEY=VALUE]... [--preset NAME] [--jobs N] [--job-devices LIST|all]
#                      [--only-seeds LIST] [--greedy-every N] [--eval-environments N]
#                      [--blueprint-room] [--policy PATH] [--train-policy ROUNDS]
#                      [--peer-modes LIST]
#
# --eval-environments N (simic-learning, a multiple of 4) evaluates the baselines and every
# learned policy on N shared environments instead of 12 (another set of baselines).
#
# --greedy-every N (simic-learning) measures the greedy learning curve every N rounds and
# evaluates the policy of its best point beside the final one (ppo-selected-*).
#
# --blueprint-room (simic-learning) trains nothing: no growth and max growth with each of the
# task's blueprints on the protocol's evaluation environments (the room each blueprint leaves).
#
# --only-seeds LIST (simic-learning with --jobs) trains and evaluates only those seeds and keeps
# the parts (no record until every seed is evaluated); carry the small parts of the evaluated
# seeds (baselines.json, seed-K.json, seed-K-evaluated.json) to finish the run on another machine.
#
# --job-devices (simic-learning with --jobs) spreads the training processes over devices;
# `all` names every GPU nvidia-smi lists (cuda:0,...,cuda:N-1).
#
# --policy PATH (simic-growth) drives the environments with a trained policy, acting greedily,
# instead of max growth: PATH is a run directory of `esper train --controller ppo` (its newest
# checkpoint) or one checkpoint folder of it.
#
# --train-policy ROUNDS (simic-growth) first trains that policy on the workload's fake CIFAR-10:
# `esper train --controller ppo --task cifar10 --preset growth-imitate` with the workload's
# environments (4, slots r0c0,r0c1,r0c2, batch 512, the episode of --episode) for ROUNDS
# rounds, in ${TMPDIR:-/tmp}/esper-growth-policy-<label> (console: train_policy.log), then drives
# with it. A run directory that exists is resumed, or taken as it is once its last round is saved.
#
# --peer-modes LIST passes `--modes LIST` to the Python peers of tolaria-fmnist and tolaria-lm
# (their Inductor max-autotune modes each spend minutes autotuning; a run can take them apart).
#
# ESPER_BIN, when set, names another esper binary to run the workloads with (an earlier
# build, for a before/after comparison in one run).
#
# Sets LD_LIBRARY_PATH from the machine's python3 torch (the binaries' rpath points at
# the build machine's `.esper-torch`, which does not exist here), runs the GPU test
# binaries, then each workload through `esper bench` (default: tolaria-reference only;
# --workload NAME, repeatable, picks others: nissa-emit, kasmina-prefetch, tolaria-fmnist, tolaria-lm), the Python peers
# merged into the tolaria-reference record, and writes everything under $OUT (default:
# bundle/out):
#   <label>.json            the tolaria-reference record (Rust and Python side by side)
#   <workload>/<label>.json the record of each other workload asked for
#   tests.log               GPU test output
#   bench_rust.log, bench_python.log, bench_<workload>.log
#   kernels.log             (--kernels) kernels and GPU time per eager epoch, via ncu
set -uo pipefail
# NVLink multicast stays off on the GPU hosts (NCCL, PyTorch, NVSHMEM), here
# and in every process the launcher starts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
esper_bin=${ESPER_BIN:-$here/esper}
out=${OUT:-$here/out}
mkdir -p "$out"

quick=""
label=""
run_tests=1
run_python=1
count_kernels=0
workloads=()
simic_args=()
rounds_args=()
learning_args=()
peer_args=()
episode=""
policy=""
train_policy=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick="--quick" ;;
    --label) label="$2"; shift ;;
    --workload) workloads+=("$2"); shift ;;
    --no-tests) run_tests=0 ;;
    --no-python) run_python=0 ;;
    --kernels) count_kernels=1 ;;
    --peer-modes) peer_args+=(--modes "$2"); shift ;;
    --gpus) simic_args+=(--gpus "$2"); shift ;;
    --torchrun) simic_args+=(--torchrun) ;;
    --no-concurrent) simic_args+=(--no-concurrent) ;;
    --variants) simic_args+=(--variants "$2"); shift ;;
    --rounds) rounds_args+=(--rounds "$2"); shift ;;
    --ppo-epochs) learning_args+=(--ppo-epochs "$2"); shift ;;
    --seeds) learning_args+=(--seeds "$2"); shift ;;
    --task) learning_args+=(--task "$2"); shift ;;
    --set) learning_args+=(--set "$2"); shift ;;
    --preset) learning_args+=(--preset "$2"); shift ;;
    --jobs) learning_args+=(--jobs "$2"); shift ;;
    --only-seeds) learning_args+=(--only-seeds "$2"); shift ;;
    --greedy-every) learning_args+=(--greedy-every "$2"); shift ;;
    --eval-environments) learning_args+=(--eval-environments "$2"); shift ;;
    --blueprint-room) learning_args+=(--blueprint-room) ;;
    --job-devices)
      devices=$2
      if [ "$devices" = all ]; then
        count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || count=0
        [ "$count" -gt 0 ] || { echo "--job-devices all: nvidia-smi lists no GPU" >&2; exit 2; }
        devices=$(seq -s, -f 'cuda:%g' 0 $((count - 1)))
      fi
      learning_args+=(--job-devices "$devices"); shift ;;
    --episode) rounds_args+=(--episode "$2"); episode=$2; shift ;;
    --policy) policy="$2"; shift ;;
    --train-policy) train_policy="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#workloads[@]} -gt 0 ] || workloads=(tolaria-reference)

torch_dir=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))') || {
  echo "python3 with torch not found" >&2; exit 1; }
export LD_LIBRARY_PATH="$torch_dir/lib:$(dirname "$torch_dir")/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ESPER_GIT_REV=${ESPER_GIT_REV:-$(cat "$here/GIT_REV" 2>/dev/null || echo unknown)}
export ESPER_TORCH_VERSION=$(python3 -c 'import torch;print(torch.__version__)')
export ESPER_DRIVER_VERSION=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
export PYTHONUNBUFFERED=1

if [ -z "$label" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu" in
    *H100*) prefix=h100 ;;
    *H200*) prefix=h200 ;;
    "") prefix=cpu ;;
    *) prefix=gpu ;;
  esac
  label="$prefix-$(date +%F)"
fi
echo "== bundle rev $ESPER_GIT_REV, torch $ESPER_TORCH_VERSION, driver $ESPER_DRIVER_VERSION, label $label"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv 2>/dev/null

status=0
if [ "$run_tests" = 1 ]; then
  # The test binaries travel xz-compressed (the carry limit); unpacked once.
  if [ -f "$here/tests.tar.xz" ] && [ ! -d "$here/tests" ]; then
    tar xJf "$here/tests.tar.xz" -C "$here" || { echo "== could not unpack tests.tar.xz"; exit 1; }
  fi
  : >"$out/tests.log"
  # The data the bundle carries, so the GPU tests that read a data set run
  # instead of skipping.
  test_env=()
  [ -d "$here/data/fashion-mnist" ] && test_env+=("ESPER_FASHION_MNIST_DIR=$here/data/fashion-mnist")
  [ -d "$here/data/fortunes" ] && test_env+=("ESPER_TEXT_CORPUS_DIR=$here/data/fortunes")
  for test_binary in "$here"/tests/*; do
    [ -x "$test_binary" ] || continue
    echo "== $(basename "$test_binary")" | tee -a "$out/tests.log"
    env "${test_env[@]}" "$test_binary" --test-threads=1 --nocapture 2>&1 | tee -a "$out/tests.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || { echo "== $(basename "$test_binary") FAILED ($rc)" | tee -a "$out/tests.log"; status=1; }
  done
fi

record="$out/$label.json"
reference=0
for workload in "${workloads[@]}"; do
  if [ "$workload" = tolaria-reference ]; then
    reference=1
    echo "== rust bench"
    "$esper_bin" bench tolaria-reference --out "$record" --label "$label" $quick 2>&1 | tee "$out/bench_rust.log"
  elif [ "$workload" = tolaria-fmnist ] || [ "$workload" = tolaria-lm ]; then
    # The general-path benches: the bundle's data set when it carries one
    # (else seeded data of the real size), then the workload's Python peer.
    if [ "$workload" = tolaria-fmnist ]; then
      data="$here/data/fashion-mnist"; data_env=ESPER_FASHION_MNIST_DIR; peer=tolaria_fmnist.py
    else
      data="$here/data/fortunes"; data_env=ESPER_TEXT_CORPUS_DIR; peer=tolaria_lm.py
    fi
    data_args=(--synthetic)
    rust_data=(--synthetic)
    if [ -d "$data" ]; then
      export "$data_env=$data"
      data_args=(--data-dir "$data")
      rust_data=()
    fi
    echo "== rust bench $workload"
    "$esper_bin" bench "$workload" --out "$out/$workload/$label.json" --label "$label" $quick \
      "${rust_data[@]}" 2>&1 | tee "$out/bench_$workload.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    if [ "$run_python" = 1 ] && [ -f "$here/$peer" ] && [ -f "$out/$workload/$label.json" ]; then
      echo "== python peers ($workload)"
      python3 "$here/$peer" --merge-into "$out/$workload/$label.json" "${data_args[@]}" \
        "${peer_args[@]}" $quick 2>&1 | tee "$out/bench_python_$workload.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
    continue
  else
    [ -d "$here/data/fortunes" ] && export ESPER_TEXT_CORPUS_DIR="$here/data/fortunes"
    [ -d "$here/data/fashion-mnist" ] && export ESPER_FASHION_MNIST_DIR="$here/data/fashion-mnist"
    if { [ "$workload" = simic-cifar ] || [ "$workload" = simic-growth ]; } && [ -z "${ESPER_CIFAR10_DIR:-}" ] && [ -f "$here/make_fake_cifar.py" ]; then
      # The fake CIFAR-10 at real size (DESIGN.md §5), generated here rather than carried.
      cifar_root="${TMPDIR:-/tmp}/esper-fake-cifar"
      [ -d "$cifar_root" ] || python3 "$here/make_fake_cifar.py" "$cifar_root" >"$out/make_fake_cifar.log" 2>&1
      export ESPER_CIFAR10_DIR="$cifar_root"
    fi
    extra=()
    if [ "$workload" = simic-growth ] && [ -n "$train_policy" ]; then
      # The policy that drives, trained on the workload's environments (see --train-policy).
      policy="${TMPDIR:-/tmp}/esper-growth-policy-$label"
      last="$policy/checkpoints/round-$(printf %06d "$train_policy")"
      train_args=(train --controller ppo --task cifar10 --data-dir "$ESPER_CIFAR10_DIR"
        --slots r0c0,r0c1,r0c2 --envs 4 --batch-size 512 --rounds "$train_policy"
        --preset growth-imitate --device cuda --run-dir "$policy")
      case "$episode" in
        "") ;;
        short) train_args+=(--episode short) ;;
        medium) train_args+=(--episode medium) ;;
        head) train_args+=(--episode head) ;;
        *) train_args+=(--epochs "$episode") ;;
      esac
      if [ -d "$last" ]; then
        echo "== the growth policy: $last exists"
      elif [ -d "$policy" ]; then
        echo "== the growth policy: resuming $policy" | tee -a "$out/train_policy.log"
        "$esper_bin" train --resume "$policy" 2>&1 | tee -a "$out/train_policy.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      else
        echo "== the growth policy: esper ${train_args[*]}" | tee "$out/train_policy.log"
        "$esper_bin" "${train_args[@]}" 2>&1 | tee -a "$out/train_policy.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      fi
    fi
    case "$workload" in
      simic-growth) extra=("${simic_args[@]}" "${rounds_args[@]}")
        [ -n "$policy" ] && extra+=(--policy "$policy") ;;
      simic-throughput|simic-cifar|simic-lm) extra=("${simic_args[@]}" "${rounds_args[@]}") ;;
      simic-learning) extra=("${rounds_args[@]}" "${learning_args[@]}") ;;
    esac
    echo "== rust bench $workload ${extra[*]}"
    "$esper_bin" bench "$workload" --out "$out/$workload/$label.json" --label "$label" $quick \
      "${extra[@]}" 2>&1 | tee "$out/bench_$workload.log"
  fi
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done

if [ "$run_python" = 1 ] && [ "$reference" = 1 ] && [ -f "$record" ]; then
  echo "== python peers"
  python3 "$here/tolaria_reference.py" --merge-into "$record" $quick 2>&1 | tee "$out/bench_python.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "$count_kernels" = 1 ] && command -v ncu >/dev/null; then
  # Kernels per eager epoch = kernels(2 epochs) - kernels(1 epoch), so set-up work cancels.
  echo "== kernels per eager epoch (ncu)" | tee "$out/kernels.log"
  count() {
    ncu --clock-control none --metrics gpu__time_duration.sum --csv "$@" 2>/dev/null \
      | python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 3 and r[-3] == "gpu__time_duration.sum"]
total = sum(float(r[-1].replace(",", "")) for r in rows)
unit = rows[0][-2] if rows else "?"
print(len(rows), "kernels", round(total, 1), unit)'
  }
  scratch=$(mktemp -d)
  for variant in eager eager-autograd; do
    one=$(count "$esper_bin" bench tolaria-reference --out "$scratch/k1.json" --modes "$variant" --epochs 1 --warmup-epochs 0)
    two=$(count "$esper_bin" bench tolaria-reference --out "$scratch/k2.json" --modes "$variant" --epochs 2 --warmup-epochs 0)
    echo "rust $variant: 1 epoch -> $one ; 2 epochs -> $two " | tee -a "$out/kernels.log"
  done
  if [ "$run_python" = 1 ]; then
    one=$(count python3 "$here/tolaria_reference.py" --out "$scratch/p1.json" --modes eager --epochs 1 --warmup-epochs 0)
    two=$(count python3 "$here/tolaria_reference.py" --out "$scratch/p2.json" --modes eager --epochs 2 --warmup-epochs 0)
    echo "python eager: 1 epoch -> $one ; 2 epochs -> $two " | tee -a "$out/kernels.log"
  fi
fi

ls -la "$out"
exit $status
