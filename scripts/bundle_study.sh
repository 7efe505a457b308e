#!/usr/bin/env bash
# study.sh: a `simic-learning` run longer than one device call, on a warm GPU machine
# (made by `cargo xtask bundle` from scripts/bundle_study.sh).
#
#   bash bundle/study.sh LABEL SECONDS [run.sh option]...
#
# Runs `run.sh --no-tests --no-python --workload simic-learning --label LABEL [option]...` with
# its output kept in ${ESPER_STUDY_DIR:-/tmp/esper-study}/LABEL, outside $OUT (which every call
# starts empty), and stops it after SECONDS. What `esper bench simic-learning --jobs` finishes is
# durable in its parts folder (a seed in training after every round), so the same line again on
# the same warm machine goes on where the last call stopped. Every call copies back to $OUT:
#   console.log              this call's console
#   LABEL.json(.png,.svg)    the record, once every seed is evaluated
#   parts.tgz                the parts folder's small files (baselines.json, seed-K.json,
#                            seed-K-evaluated.json, partial.json with its picture); the trained policies stay
#                            behind (too large to come back), so carry these to finish the
#                            run's other seeds in a later session
#
# PARTS=DIR (a folder inside the bundle, or a path) fills the parts folder from DIR on the first
# call, with the small parts of an earlier session; the run keeps what fits its setup and
# measures the rest.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { sed -n 2,22p "$0" >&2; exit 2; }
label=$1
budget=$2
shift 2
case "$budget" in
  ''|*[!0-9]*) echo "study.sh: SECONDS must be a whole number, not '$budget'" >&2; exit 2 ;;
esac
returned=${OUT:-$here/out}
study=${ESPER_STUDY_DIR:-/tmp/esper-study}/$label
parts="$study/simic-learning/$label.json.parts"
mkdir -p "$returned" "$study/simic-learning"
: >"$returned/console.log"

if [ -n "${PARTS:-}" ] && [ ! -d "$parts" ]; then
  from=$PARTS
  [ -d "$from" ] || from="$here/$PARTS"
  [ -d "$from" ] || { echo "study.sh: PARTS=$PARTS is not a folder" >&2; exit 2; }
  mkdir -p "$parts"
  cp "$from"/*.json "$parts"/
  echo "== study.sh: the parts folder starts from $PARTS: $(ls "$parts" | tr '\n' ' ')" |
    tee -a "$returned/console.log"
fi

echo "== study.sh: $label, at most $budget s this call, kept in $study" | tee -a "$returned/console.log"
OUT="$study" timeout "$budget" bash "$here/run.sh" --no-tests --no-python \
  --workload simic-learning --label "$label" "$@" 2>&1 | tee -a "$returned/console.log"
rc=${PIPESTATUS[0]}
case "$rc" in
  0) echo "== study.sh: the run finished" ;;
  124) echo "== study.sh: stopped after $budget s; the same line again goes on" ;;
  *) echo "== study.sh: the run failed ($rc)" ;;
esac | tee -a "$returned/console.log"

for file in "$study/simic-learning/$label".json "$study/simic-learning/$label".png \
  "$study/simic-learning/$label".svg; do
  [ -f "$file" ] && cp "$file" "$returned/"
done
if [ -d "$parts" ]; then
  # The pooled picture of the seeds evaluated so far comes back beside them.
  (cd "$parts" && ls ./*.json >/dev/null 2>&1 &&
    tar czf "$returned/parts.tgz" ./*.json $(ls ./partial.png ./partial.svg 2>/dev/null))
fi
# A stop at the budget is this script working as meant, not a failure.
[ "$rc" = 124 ] && exit 0
exit "$rc"
