#!/bin/sh
# Runs every default suite and ends with one line "N passed, N failed" counting
# every case: cmocka unit tests, Python tests, integration tests (the real apsd
# and real worker processes), the systemd unit and sd_notify tests, the Debian
# packages (built, installed, run and purged; as root, else skipped), the unit and
# integration suites again under ASan+UBSan (leaks fail them), and 20 s of
# libFuzzer per harness. Builds must exist (make test builds them; the fuzz
# stage builds build-fuzz/ itself). Exit status 0 only if all pass.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}

rm -f build/meson-logs/testlog.* build-asan/meson-logs/testlog.* build/*.junit.xml \
	build-asan/*.junit.xml

pytest_suite() { # junit-file directory [env...]
	junit=$1 dir=$2
	shift 2
	env "$@" "$PYTHON" -m pytest -q -p no:cacheprovider "$dir" --junitxml="$junit"
}

echo "== unit (cmocka)"
meson test -C build --suite unit --no-rebuild --print-errorlogs -q

echo "== python (pytest)"
pytest_suite build/pytest.junit.xml tests/python \
	APS_LIBRARY="$PWD/build/worker/libaps.so.0" PYTHONPATH="$PWD/worker/python"

echo "== integration (real apsd, real workers)"
pytest_suite build/integration.junit.xml tests/integration APS_BUILD=build

echo "== systemd (unit file, sd_notify, reload)"
pytest_suite build/systemd.junit.xml tests/systemd APS_BUILD=build

echo "== packaging (Debian packages: built, installed, run, purged; as root)"
pytest_suite build/packaging.junit.xml tests/packaging

echo "== unit under ASan+UBSan"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	meson test -C build-asan --suite unit --no-rebuild --print-errorlogs -q

echo "== integration under ASan+UBSan"
pytest_suite build-asan/integration.junit.xml tests/integration APS_BUILD=build-asan \
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

echo "== fuzz (libFuzzer under ASan+UBSan, about 20 s per harness)"
tests/fuzz/run-fuzz.sh 20

echo "== summary"
exec "$PYTHON" tests/summary.py unit=build python=build/pytest.junit.xml \
	integration=build/integration.junit.xml systemd=build/systemd.junit.xml \
	packaging=build/packaging.junit.xml asan-unit=build-asan \
	asan-integration=build-asan/integration.junit.xml fuzz=build-fuzz/fuzz.junit.xml
