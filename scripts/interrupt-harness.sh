#!/usr/bin/env bash
# Interrupts a 3-stage run again and again and checks that nothing is lost (docs/run-directory.md,
# "Interruption harness"): KILLS kill -9 (every second one while a checkpoint write is in flight,
# seen by its temporary file), then SIGINTS Ctrl-Cs at random moments, resuming after each. Checks:
#   - every checkpoint file reads back whole (`baton inspect`) after every interruption;
#   - every checkpoint a Ctrl-C announces exists;
#   - every resume succeeds, and the finished run's params_sha256 and metrics.jsonl (line for line,
#     samples_per_s aside) equal those of the same run never interrupted.
# A run that finishes between interruptions is checked the same way and started again (--fresh).
# Usage: scripts/interrupt-harness.sh [KILLS=50] [SIGINTS=20]   (needs build/baton; ~6 minutes on 2 cores)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BATON="${BATON_BUILD_DIR:-$ROOT/build}/baton"
KILLS="${1:-50}"
SIGINTS="${2:-20}"
[ -x "$BATON" ] || { echo "interrupt-harness: $BATON not built" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
RANDOM=$$

cat > "$WORK/c.toml" <<'EOF'
[run]
name = "harness"
seed = 3
threads = 2
max_duration = "4ep"
checkpoint_every = "10ba"
keep_checkpoints = 3
[model]
name = "small_cnn"
[datasets.train]
kind = "fashion-mnist"
split = "train"
limit = 4000
[datasets.test]
kind = "fashion-mnist"
split = "test"
limit = 1000
[defaults]
data = "train"
batch_size = 50
eval = { sets = ["test"] }
optimizer = { name = "sgd", lr = 0.05, momentum = 0.9 }
[[stages]]
name = "warmup"
duration = "1ep"
optimizer = { name = "sgd", lr = 0.01 }
[[stages]]
name = "main"
duration = "2ep"
[[stages]]
name = "finetune"
duration = "1ep"
batch_size = 100
optimizer = { name = "adam", lr = 0.001 }
optimizer_carry = "fresh"
EOF

metrics() { sed -E 's/"(samples_per_s|seconds)":[^,}]*,?//g' "$1/metrics.jsonl"; }
sha() { "$BATON" inspect "$1/final.baton" 2>/dev/null | sed -n 's/.*params_sha256[": ]*\([0-9a-f]\{64\}\).*/\1/p' | head -1; }

"$BATON" run "$WORK/c.toml" --run-dir "$WORK/whole" > /dev/null 2>&1 || { echo "the uninterrupted run failed" >&2; exit 1; }
EXPECTED_SHA="$(sha "$WORK/whole")"
metrics "$WORK/whole" > "$WORK/whole.metrics"
[ -n "$EXPECTED_SHA" ] || { echo "no params_sha256 from baton inspect" >&2; exit 1; }

RUN="$WORK/run"
unreadable=0 resumes=0 finished=0 mismatches=0 in_write=0 announced=0 missing=0 sigint_finished=0 failures=0
check_checkpoints() {
  for f in "$RUN"/checkpoints/ckpt-*.baton; do
    [ -e "$f" ] || continue
    "$BATON" inspect "$f" > /dev/null 2>&1 || { unreadable=$((unreadable + 1)); echo "unreadable: $f" >&2; }
  done
}
check_finished() {  # the run reached its end: compare, then start over
  finished=$((finished + 1))
  if [ "$(sha "$RUN")" != "$EXPECTED_SHA" ] || ! cmp -s <(metrics "$RUN") "$WORK/whole.metrics"; then
    mismatches=$((mismatches + 1))
    echo "mismatch after a finished run (round $finished)" >&2
    diff <(metrics "$RUN") "$WORK/whole.metrics" | head -5 >&2
  fi
  rm -rf "$RUN"
}
start() { "$BATON" run "$WORK/c.toml" --run-dir "$RUN" > "$WORK/log" 2>&1 & PID=$!; }
ended() { ! kill -0 "$PID" 2>/dev/null; }

for ((k = 1; k <= KILLS; ++k)); do
  [ -d "$RUN" ] && resumes=$((resumes + 1))
  start
  if ((k % 2 == 0)); then  # inside a checkpoint write: kill when its temporary file appears
    for ((i = 0; i < 200000; ++i)); do
      compgen -G "$RUN/checkpoints/.ckpt-*.tmp-*" > /dev/null && break
      ended && break
    done
    compgen -G "$RUN/checkpoints/.ckpt-*.tmp-*" > /dev/null && in_write=$((in_write + 1))
  else
    sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
    sleep "$((RANDOM % 3))"
  fi
  kill -9 "$PID" 2>/dev/null
  wait "$PID" 2>/dev/null
  rc=$?
  check_checkpoints
  if [ -f "$RUN/final.baton" ] && [ "$rc" = 0 ]; then check_finished; fi
done

for ((k = 1; k <= SIGINTS; ++k)); do
  [ -d "$RUN" ] && resumes=$((resumes + 1))
  start
  sleep "$((1 + RANDOM % 3)).$((RANDOM % 10))$((RANDOM % 10))"
  kill -INT "$PID" 2>/dev/null
  wait "$PID" 2>/dev/null
  rc=$?
  check_checkpoints
  if [ "$rc" = 3 ]; then
    announced=$((announced + 1))
    path="$(sed -n 's/.*checkpoint written to \(.*\)\.$/\1/p' "$WORK/log" | head -1)"
    if [ -z "$path" ] || [ ! -f "$path" ]; then missing=$((missing + 1)); echo "announced but missing: '$path'" >&2; fi
  elif [ "$rc" = 0 ]; then
    sigint_finished=$((sigint_finished + 1))
    check_finished
  else
    failures=$((failures + 1)); echo "exit $rc after SIGINT:" >&2; tail -3 "$WORK/log" >&2
  fi
done

# Finish the last round uninterrupted.
[ -d "$RUN" ] && resumes=$((resumes + 1))
if "$BATON" run "$WORK/c.toml" --run-dir "$RUN" > "$WORK/log" 2>&1; then check_finished; else
  failures=$((failures + 1)); echo "the final resume failed:" >&2; tail -3 "$WORK/log" >&2
fi

echo "interrupt-harness: $KILLS kill -9 ($in_write inside a checkpoint write), $SIGINTS SIGINT" \
     "($announced announced a checkpoint, $sigint_finished came after the run's end); $resumes resumes;" \
     "$finished finished runs compared"
echo "interrupt-harness: unreadable checkpoints $unreadable, announced checkpoints missing $missing," \
     "failed resumes $failures, finished runs differing from the uninterrupted one $mismatches"
[ $((unreadable + missing + failures + mismatches)) = 0 ] && [ "$finished" -gt 0 ]
