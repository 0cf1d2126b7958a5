#!/bin/sh
# Runs every default suite (cmocka unit tests, Python tests, the unit tests again
# under ASan and UBSan) and ends with one line "N passed, N failed" counting every
# case. Builds must exist (make test builds them). Exit status 0 only if all pass.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}

rm -f build/meson-logs/testlog.* build-asan/meson-logs/testlog.* build/pytest.junit.xml

echo "== unit (cmocka)"
meson test -C build --suite unit --no-rebuild --print-errorlogs -q

echo "== python (pytest)"
APS_LIBRARY="$PWD/build/worker/libaps.so.0" PYTHONPATH="$PWD/worker/python" \
	"$PYTHON" -m pytest -q -p no:cacheprovider tests/python --junitxml=build/pytest.junit.xml

echo "== unit under ASan+UBSan"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	meson test -C build-asan --suite unit --no-rebuild --print-errorlogs -q

echo "== summary"
exec "$PYTHON" tests/summary.py unit=build python=build/pytest.junit.xml asan=build-asan
