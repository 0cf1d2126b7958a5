#!/bin/sh
# Builds the libFuzzer harnesses in build-fuzz/ (clang, ASan+UBSan) and runs
# each for SECONDS (default 20), side by side, from its seed corpus and its
# regression inputs. New corpus entries and crash artifacts go to
# build-fuzz/fuzz-work/NAME/ (wiped first), never into the repository. Writes
# build-fuzz/fuzz.junit.xml, one case per harness, failed when it crashed,
# leaked, hung or did not run (tests/summary.py reads it). Exit status 0 only
# when every harness ran clean.
# Usage: tests/fuzz/run-fuzz.sh [SECONDS]    (make fuzz FUZZ_SECONDS=600)
# FUZZ_FLAGS adds libFuzzer flags to both runs (FUZZ_FLAGS=-use_value_profile=1).
set -u
cd "$(dirname "$0")/../.." || exit 2
PYTHON=${PYTHON:-/usr/bin/python3}
SECS=${1:-20}
B=build-fuzz
HARNESSES="validate config daemon"
# Every object is instrumented for coverage; only the harnesses link libFuzzer's main.
SETUP="-Dfuzz=true -Dtests=false -Db_sanitize=address,undefined -Db_lundef=false
-Dc_args=-fsanitize=fuzzer-no-link"

rm -f $B/fuzz.junit.xml
log=$(mktemp)
# A build-fuzz/ set up by hand without the harnesses is set up again.
[ -f $B/build.ninja ] && ! grep -q fuzz_validate $B/build.ninja && rm -rf $B
# shellcheck disable=SC2086
if [ ! -f $B/build.ninja ] &&
	! CC=clang meson setup $B $SETUP >"$log" 2>&1; then
	cat "$log"
	rm -rf $B
fi
built=no
if [ -f $B/build.ninja ] &&
	ninja -C $B tests/fuzz/fuzz_validate tests/fuzz/fuzz_config tests/fuzz/fuzz_daemon \
		tests/fuzz/make_seeds tests/fuzz/make_daemon_seeds >"$log" 2>&1; then
	built=yes
else
	cat "$log"
fi
rm -f "$log"

export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
pids=""
for h in $HARNESSES; do
	work=$B/fuzz-work/$h
	rm -rf "$work"
	mkdir -p "$work/corpus"
	[ $built = yes ] || continue
	set -- "$work/corpus" "tests/fuzz/corpus/$h" # new inputs go to the first directory only
	[ -d "tests/fuzz/regressions/$h" ] && set -- "$@" "tests/fuzz/regressions/$h"
	[ -f "tests/fuzz/$h.dict" ] && set -- "-dict=tests/fuzz/$h.dict" "$@"
	# The daemon's ZeroMQ threads free what an input allocated after it ends, which
	# libFuzzer's per-input leak check takes for leaks: the ASan suites check those.
	[ "$h" = daemon ] && set -- "-detect_leaks=0" "$@"
	(
		# shellcheck disable=SC2086
		$B/tests/fuzz/fuzz_$h -max_total_time="$SECS" -timeout=10 -print_final_stats=1 \
			-artifact_prefix="$work/" ${FUZZ_FLAGS:-} "$@" >"$work/log" 2>&1
		echo $? >"$work/status"
	) &
	pids="$pids $!"
done
# shellcheck disable=SC2086
[ -z "$pids" ] || wait $pids

# shellcheck disable=SC2086
exec "$PYTHON" tests/fuzz/fuzz_junit.py $B/fuzz.junit.xml $B/fuzz-work $HARNESSES
