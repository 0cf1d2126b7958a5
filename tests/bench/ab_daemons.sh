#!/bin/bash
# A/B of two build trees of the daemon (issue 17's malloc rows): the same
# bench_allreduce job, NEW_BUILD's workers, run alternately against each tree's
# apsd, REPS times each, one line per run (tests/bench/ab_builds.sh with AB_VARY=apsd).
#
#   tests/bench/ab_daemons.sh OLD_BUILD NEW_BUILD REPS WORLD -- BENCH_ARGS...
#   e.g. tests/bench/ab_daemons.sh /tmp/old/build build 3 2 -- --format e4m3 \
#       --tensors 67108864 --steps 8 --warmup 2
AB_VARY=apsd exec "$(dirname "$0")/ab_builds.sh" "$@"
