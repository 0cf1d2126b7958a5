#!/bin/bash
# A/B of two build trees of the client (issue 17's before/after rows): the same
# bench_allreduce job run alternately with each tree's bench_allreduce and libaps
# against one apsd (the second tree's), REPS times each, one line per run.
#
#   tests/bench/ab_builds.sh OLD_BUILD NEW_BUILD REPS WORLD -- BENCH_ARGS...
#
# e.g. the old tree of a commit:
#   git worktree add /tmp/old COMMIT && meson setup /tmp/old/build /tmp/old && ninja -C /tmp/old/build
#   tests/bench/ab_builds.sh /tmp/old/build build 3 1 -- --format e4m3 --tensors 67108864 \
#       --steps 8 --warmup 2 --codec-threads 1
#   tests/bench/ab_builds.sh /tmp/old/build build 3 4 -- --format e4m3 --tensors resnet50 \
#       --steps 20 --warmup 2
# Prints rank 0's step p50 and min (us) and its CPU per step (ms, every thread of the
# worker process), and apsd's CPU per step (ms, every thread, over the whole run: timed
# and warm-up steps) and its minor page faults, from /proc/PID/stat. Ports 6400 and up
# on 127.0.0.1. With AB_VARY=apsd (tests/bench/ab_daemons.sh) the trees' daemons
# alternate instead, each against NEW_BUILD's workers.
set -eu
if [ $# -lt 5 ] || [ "$5" != "--" ]; then
	sed -n '2,18p' "$0" >&2
	exit 2
fi
old=$1 new=$2 reps=$3 world=$4
shift 5
steps=$(echo "$@" | grep -o -- '--steps [0-9]*' | awk '{print $2}')
warmup=$(echo "$@" | grep -o -- '--warmup [0-9]*' | awk '{print $2}')
total=$((${steps:-1} + ${warmup:-0}))
tick=$(getconf CLK_TCK)
port=6400
for rep in $(seq 1 "$reps"); do
	for tree in "$old" "$new"; do
		port=$((port + 1))
		apsd="$new/server/apsd" workers=$tree
		if [ "${AB_VARY:-client}" = apsd ]; then
			apsd="$tree/server/apsd" workers=$new
		fi
		"$apsd" --listen "tcp://127.0.0.1:$port" --log_level warn &
		daemon=$!
		sleep 0.3
		ranks=()
		for r in $(seq 1 $((world - 1))); do
			"$workers/tests/bench/bench_allreduce" --endpoint "tcp://127.0.0.1:$port" \
				--rank "$r" --world "$world" "$@" >/dev/null 2>&1 &
			ranks+=($!)
		done
		out=$("$workers/tests/bench/bench_allreduce" --endpoint "tcp://127.0.0.1:$port" \
			--rank 0 --world "$world" "$@" 2>&1 | grep '^RESULT what=step' || true)
		for pid in "${ranks[@]}"; do wait "$pid" || true; done
		stat=$(awk -v t="$tick" -v n="$total" \
			'{printf "apsd_cpu_ms_per_step=%.1f apsd_minflt=%d", ($14 + $15) * 1000 / t / n, $10}' \
			"/proc/$daemon/stat")
		kill "$daemon"
		wait "$daemon" || true
		echo "$tree run $rep: $(echo "$out" | grep -o 'p50_us=[0-9.]*\|min_us=[0-9.]*\|cpu_ms_per_sample=[0-9.]*' | tr '\n' ' ')$stat"
	done
done
