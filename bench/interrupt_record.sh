#!/bin/bash
# Ctrl-C at a random moment of five recordings (issue 38): SIGINT to record's process group,
# as a terminal sends it, 0-4 s after the ranks' first step; prints how long record took to
# end after the signal and diagnose's [interrupted] line of each bundle.
#   bash bench/interrupt_record.sh [RUNS]
cd "$(dirname "$0")/.." || exit 1
work=$(mktemp -d /tmp/prism-interrupt.XXXXXX)
for i in $(seq 1 "${1:-5}"); do
  d=$work/r$i; mkdir -p "$d/markers"
  setsid .venv/bin/prism-rr record --nproc 2 -o "$d/run.prism" -- .venv/bin/python tests/recorder/scripts/pausing.py "$d/markers" > "$d/record.log" 2>&1 &
  pid=$!
  until [ -e "$d/markers/step-1-0" ] || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
  sleep "$((RANDOM % 4)).$((RANDOM % 10))"
  t0=$(date +%s.%N); kill -INT -- -$pid; wait $pid; rc=$?; t1=$(date +%s.%N)
  printf "run %d: record exit %d, %.2f s after the signal; " "$i" "$rc" "$(echo "$t1 - $t0" | bc)"
  if [ -f "$d/run.prism" ]; then
    .venv/bin/prism-rr diagnose "$d/run.prism" > "$d/diagnose.txt" 2>&1
    echo "diagnose exit $?: $(grep -m1 -o 'The recording was interrupted: [^;]*' "$d/diagnose.txt")"
  else
    echo "no bundle: $(tail -1 "$d/record.log")"
  fi
done
echo "(bundles and logs in $work)"
