#!/bin/sh
# Installs every Debian package apsd needs to build, test, run the demo and the
# benchmarks, and to build its own Debian packages (make deb: debhelper,
# dh-python). Idempotent: prints nothing and exits 0 when everything is present.
set -eu

PACKAGES="
build-essential pkg-config meson ninja-build clang libclang-rt-14-dev
libuv1-dev libzmq3-dev libsodium-dev libprotobuf-c-dev protobuf-c-compiler libopenblas-dev
libcmocka-dev libjansson-dev debhelper dh-python
python3 python3-numpy python3-torch python3-pytest python3-matplotlib python3-zmq
python3-venv python3-mesonpy
dataset-fashion-mnist fortunes
valgrind hyperfine clang-format iproute2 tmux prometheus curl systemd strace
slurm-wlm slurmctld slurmd slurm-client munge python3-yaml
"

missing=""
for p in $PACKAGES; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "install-deps: done"
