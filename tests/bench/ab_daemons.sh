#!/bin/bash
# A/B of two build trees of the daemon (issue 17's malloc rows): the same
# bench_allreduce job, NEW_BUILD's workers, run alternately against each tree's
# apsd, REPS times each, one line per run.
#
#   tests/bench/ab_daemons.sh OLD_BUILD NEW_BUILD REPS WORLD -- BENCH_ARGS...
#
# e.g. the old tree of a commit:
#   git worktree add /tmp/old COMMIT && meson setup /tmp/old/build /tmp/old && ninja -C /tmp/old/build
#   tests/bench/ab_daemons.sh /tmp/old/build build 3 2 -- --format e4m3 --tensors 67108864 \
#       --steps 8 --warmup 2
# Prints rank 0's step p50 (us), and apsd's CPU per step (ms, every thread, over the
# whole run: timed and warm-up steps) and minor page faults over the whole run, from
# /proc/PID/stat. Ports 6500 and up on 127.0.0.1.
set -eu
if [ $# -lt 5 ] || [ "$5" != "--" ]; then
	sed -n '2,14p' "$0" >&2
	exit 2
fi
old=$1 new=$2 reps=$3 world=$4
shift 5
steps=$(echo "$@" | grep -o -- '--steps [0-9]*' | awk '{print $2}')
warmup=$(echo "$@" | grep -o -- '--warmup [0-9]*' | awk '{print $2}')
total=$((${steps:-1} + ${warmup:-0}))
tick=$(getconf CLK_TCK)
port=6500
for rep in $(seq 1 "$reps"); do
	for tree in "$old" "$new"; do
		port=$((port + 1))
		"$tree/server/apsd" --listen "tcp://127.0.0.1:$port" --log_level warn &
		daemon=$!
		sleep 0.3
		ranks=()
		for r in $(seq 1 $((world - 1))); do
			"$new/tests/bench/bench_allreduce" --endpoint "tcp://127.0.0.1:$port" \
				--rank "$r" --world "$world" "$@" >/dev/null 2>&1 &
			ranks+=($!)
		done
		out=$("$new/tests/bench/bench_allreduce" --endpoint "tcp://127.0.0.1:$port" \
			--rank 0 --world "$world" "$@" 2>&1 | grep '^RESULT what=step' || true)
		for pid in "${ranks[@]}"; do wait "$pid" || true; done
		stat=$(awk -v t="$tick" -v n="$total" \
			'{printf "apsd_cpu_ms_per_step=%.1f apsd_minflt=%d", ($14 + $15) * 1000 / t / n, $10}' \
			"/proc/$daemon/stat")
		kill "$daemon"
		wait "$daemon" || true
		echo "$tree apsd run $rep: $(echo "$out" | grep -o 'p50_us=[0-9.]*') $stat"
	done
done
