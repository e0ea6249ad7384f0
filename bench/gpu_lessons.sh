#!/usr/bin/env bash
# Every solution notebook, top to bottom in a fresh kernel, on a chosen device; prints one line per lesson and a
# markdown table of wall times. For a machine with a GPU (the course's tests only ever run the CPU path):
#
#   bench/gpu_lessons.sh                 # DECODER_COURSE_DEVICE=cuda, full runs (lesson 07 trains for real)
#   DEVICE=cpu bench/gpu_lessons.sh      # the same on the CPU, to compare
#   GRADING=1 bench/gpu_lessons.sh       # as grading runs them (training cut to 3 s: NBGRADER_EXECUTION)
#   bench/gpu_lessons.sh 07-training 09-kv-cache    # some lessons only
#
# Needs the course's .venv (./course setup; on a GPU machine COURSE_TORCH=cuda ./course setup for the CUDA build).
# Fails first if the device is cuda and torch cannot see a GPU. Each lesson runs with
# `python -m decoder_course check`, which executes the notebook in its own folder and exits non-zero when a
# visible check fails; the exit status of each lesson is in the table.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEVICE=${DEVICE:-cuda}
export DECODER_COURSE_DEVICE=$DEVICE
[ -n "${GRADING:-}" ] && export NBGRADER_EXECUTION=autograde

"$PY" - <<'EOF' || exit 2
import sys, torch, decoder_course
d = decoder_course.device()
print(f"torch {torch.__version__}, device {d}" + (f" ({torch.cuda.get_device_name(d)})" if d.type == "cuda" else ""))
if d.type == "cuda" and not torch.cuda.is_available():
    sys.exit("DECODER_COURSE_DEVICE=cuda but torch sees no GPU (a CPU build of torch?)")
EOF

if [ $# -gt 0 ]; then lessons=("$@"); else
  mapfile -t lessons < <(ls solutions/*.py | xargs -n1 basename | sed 's/\.py$//' | sort)
fi
rows=()
for lesson in "${lessons[@]}"; do
  nb=solutions/$lesson/$lesson.ipynb
  [ -f "$nb" ] || { echo "no $nb" >&2; continue; }
  start=$EPOCHREALTIME
  "$PY" -m decoder_course check "$nb" --timeout 900 > "/tmp/gpu_lessons.$lesson.log" 2>&1
  rc=$?
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  printf '%-20s %7s s  exit %d  (log /tmp/gpu_lessons.%s.log)\n' "$lesson" "$seconds" "$rc" "$lesson"
  rows+=("| $lesson | $seconds s | $rc |")
done
echo
echo "| lesson | wall ($DEVICE${GRADING:+, graded run}) | exit |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
