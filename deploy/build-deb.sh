#!/bin/sh
# Builds the Debian packages of debian/ (apsd, libaps0, libaps-dev,
# python3-aps) with dpkg-buildpackage on a copy of the source tree, so that
# nothing is written in the tree itself or in the developers' build/: the copy
# and debhelper's build directory are OUT/src/, removed on success. Leaves
# OUT/*.deb (default build/deb), the .buildinfo and .changes files beside
# them and the debug symbols in OUT/debug/*-dbgsym_*.deb, so that
# `apt-get install ./build/deb/*.deb` installs the four packages alone.
# The project's test suites are not run (nocheck; `make test` runs them).
set -eu
cd "$(dirname "$0")/.."
OUT=${1:-build/deb}

version=$(dpkg-parsechangelog -S Version)
upstream=$(sed -n "s/^  version: '\(.*\)',\$/\1/p" meson.build)
if [ "${version%-*}" != "$upstream" ]; then
	echo "build-deb: debian/changelog says $version, meson.build $upstream" >&2
	exit 1
fi
src=$OUT/src/apsd-$upstream
rm -rf "$OUT"
mkdir -p "$src" "$OUT/debug"

# Every file but version control, build directories and caches.
tar -c -f - --exclude-vcs --exclude=__pycache__ --exclude='*.pyc' --exclude=.pytest_cache \
	--anchored --exclude='./build*' --exclude='./.mesonpy-*' . | tar -x -f - -C "$src"

(cd "$src" && DEB_BUILD_OPTIONS="nocheck ${DEB_BUILD_OPTIONS:-}" \
	dpkg-buildpackage --build=binary --no-sign --jobs-try=auto)

mv "$OUT"/src/*-dbgsym_*.deb "$OUT/debug/" 2>/dev/null || true
mv "$OUT"/src/*.deb "$OUT"/src/*.buildinfo "$OUT"/src/*.changes "$OUT/"
rm -rf "$OUT/src"
ls -l "$OUT"/*.deb
