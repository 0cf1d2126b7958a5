"""The Debian packages of debian/ (make deb): built, or taken from build/deb/
when they are newer than every source file; installed with apt-get; their
files listed by dpkg -L; the apsd user made by the postinst; the installed
/usr/sbin/apsd run on a loopback port (systemd only where it is PID 1) with
a worker of the installed aps package from /tmp and apsctl; a C program
built against libaps-dev; then purged, and the machine checked to be as
before: no file, no apsd process, no libaps in ld.so's cache, the apsd user
gone unless it was there before, and build/'s libaps still the one the
developer tree loads (while the packages are installed as well).

Needs root (apt-get, dpkg), and debhelper when it has to build (about 30 s
on 2 cores; the whole file about 45 s, 10 s with fresh packages in
build/deb/). Skipped where any of the packages is installed already, or an
unpackaged apsd is under /usr (make install with PREFIX=/usr): purging would
take them away. One run at a time per machine (a lock), since the packages
are installed system-wide.
"""

import fcntl
import grp
import json
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEB_DIR = ROOT / "build" / "deb"
BUILD = ROOT / "build"
PACKAGES = ("apsd", "libaps0", "libaps-dev", "python3-aps")
LOCK = ("/run/lock" if os.path.isdir("/run/lock") else "/tmp") + "/apsd-test-deb.lock"
PYTHON = "/usr/bin/python3"
MULTIARCH = "x86_64-linux-gnu"
LIBDIR = f"/usr/lib/{MULTIARCH}"
SITE = "/usr/lib/python3/dist-packages/aps"
MODULES = sorted(p.name for p in (ROOT / "worker" / "python" / "aps").glob("*.py"))

# What each package must hold (dpkg -L); a missing file fails the test by name.
EXPECTED = {
    "apsd": ["/usr/sbin/apsd", "/usr/bin/apsctl", "/lib/systemd/system/apsd.service",
             "/usr/lib/sysusers.d/apsd.conf", "/etc/apsd/apsd.conf",
             "/usr/share/doc/apsd/copyright"],
    "libaps0": [f"{LIBDIR}/libaps.so.0", f"{LIBDIR}/libaps.so.0.1.0"],
    "libaps-dev": ["/usr/include/aps.h", "/usr/include/aps_errors.h", f"{LIBDIR}/libaps.so",
                   f"{LIBDIR}/pkgconfig/libaps.pc"],
    "python3-aps": [f"{SITE}/{m}" for m in MODULES + ["_install.py"]],
}
# Files that belong to another package (or none) and must not be in this one.
FORBIDDEN = {
    "apsd": [f"{LIBDIR}/libaps.so.0", "/usr/include/aps.h"],
    "libaps0": [f"{LIBDIR}/libaps.so", "/usr/include/aps.h", "/usr/sbin/apsd"],
    "libaps-dev": [f"{LIBDIR}/libaps.so.0.1.0"],
    "python3-aps": [f"{LIBDIR}/libaps.so.0", f"{SITE}/libaps.so"],
}
# What must be gone after the purge (besides every file dpkg -L listed).
LEFTOVERS = ["/etc/apsd", SITE, "/etc/systemd/system/multi-user.target.wants/apsd.service",
             "/var/lib/systemd/deb-systemd-helper-enabled/apsd.service.dsh-also",
             "/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/apsd.service"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root: installs and purges Debian packages")


def run(args, timeout=300, check=True, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert p.returncode == 0, f"{args} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def clean_env(**extra):
    """The environment of a user's shell: no PYTHONPATH, APS_LIBRARY or APS_*."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "APS_LIBRARY", "PYTHONHOME") and not k.startswith("APS_")}
    env.update(extra)
    return env


def package_state(name):
    """dpkg's status of a package: 'installed', 'config-files', 'not-installed'."""
    p = run(["dpkg-query", "-W", "-f=${db:Status-Status}", name], check=False)
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else "not-installed"


def user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def group_exists(name):
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def apsd_processes():
    """Pids of processes running /usr/sbin/apsd (also once the file is deleted)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                exe = os.readlink(entry / "exe")
            except OSError:
                continue
            if exe.split(" (deleted)")[0] == "/usr/sbin/apsd":
                found.append(int(entry.name))
    return found


def newest_source_mtime():
    """The newest modification time of any file that goes into the packages:
    the tree without build directories, version control, caches and tests/."""
    newest = 0.0
    for top in ROOT.iterdir():
        if top.name.startswith(("build", ".git", ".mesonpy-", ".pytest_cache")) or \
                top.name == "tests":
            continue
        paths = [top] if top.is_file() else (p for p in top.rglob("*") if p.is_file())
        for p in paths:
            if "__pycache__" not in p.parts:
                newest = max(newest, p.lstat().st_mtime)
    return newest


def deb_files():
    """{package: its .deb in build/deb/} for the packages found there."""
    found = {}
    for name in PACKAGES:
        debs = sorted(DEB_DIR.glob(f"{name}_*.deb"))
        if len(debs) == 1:
            found[name] = debs[0]
    return found


def fresh_debs():
    """The four .deb files, built now unless build/deb/ has them newer than the sources."""
    debs = deb_files()
    if len(debs) == len(PACKAGES) and \
            min(d.stat().st_mtime for d in debs.values()) > newest_source_mtime():
        print(f"using the packages in {DEB_DIR} (newer than every source file)")
        return debs
    if shutil.which("dh") is None or shutil.which("dpkg-buildpackage") is None:
        pytest.skip("debhelper or dpkg-dev is not installed (deploy/install-deps.sh, make deb)")
    start = time.monotonic()
    p = run([str(ROOT / "deploy" / "build-deb.sh"), str(DEB_DIR)], timeout=900, check=False)
    assert p.returncode == 0, "make deb failed:\n" + (p.stdout + p.stderr)[-6000:]
    print(f"built the packages in {time.monotonic() - start:.0f} s")
    debs = deb_files()
    assert sorted(debs) == sorted(PACKAGES), (debs, sorted(DEB_DIR.iterdir()))
    return debs


def apt_get(*args):
    return run(["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", *args], timeout=600,
               env=clean_env(DEBIAN_FRONTEND="noninteractive"))


def unpackaged_install():
    """Files of an apsd install under /usr that no package owns."""
    paths = ["/usr/sbin/apsd", "/usr/bin/apsctl", SITE, f"{LIBDIR}/libaps.so.0",
             "/usr/include/aps.h", "/lib/systemd/system/apsd.service"]
    return [p for p in paths if os.path.lexists(p)]


def purge():
    apt_get("purge", *PACKAGES)


class Machine:
    """What the test changes on this machine, to put it back."""

    def __init__(self):
        self.had_user = user_exists("apsd")
        self.had_group = group_exists("apsd")
        self.procs = []
        self.listed = {}

    def restore(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        if any(package_state(n) != "not-installed" for n in PACKAGES):
            purge()
        if not self.had_user and user_exists("apsd"):
            run(["userdel", "apsd"])
        if not self.had_group and group_exists("apsd"):
            run(["groupdel", "apsd"])


@pytest.fixture(scope="module")
def machine():
    """The packages installed for the module's tests, purged at its end."""
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get: not a Debian system")
    with open(LOCK, "w") as lock:
        deadline = time.monotonic() + 600
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.skip(f"another run holds {LOCK} for 10 minutes")
                time.sleep(1)
        installed = [n for n in PACKAGES if package_state(n) != "not-installed"]
        if installed:
            pytest.skip(f"{', '.join(installed)} already on this machine: purging would "
                        "remove them")
        if unpackaged_install():
            pytest.skip(f"an unpackaged apsd is under /usr ({', '.join(unpackaged_install())}): "
                        "the packages would overwrite it and the purge remove it")
        debs = fresh_debs()
        m = Machine()
        try:
            apt_get("install", "--no-install-recommends", *(str(debs[n]) for n in PACKAGES))
            for name in PACKAGES:
                m.listed[name] = run(["dpkg", "-L", name]).stdout.split("\n")
            yield m
        finally:
            m.restore()


def test_every_package_holds_its_files(machine):
    problems = []
    for name in PACKAGES:
        listed = set(machine.listed[name])
        missing = [f for f in EXPECTED[name] if f not in listed]
        stray = [f for f in FORBIDDEN[name] if f in listed]
        if missing:
            problems.append(f"package {name} misses {missing}")
        if stray:
            problems.append(f"package {name} holds {stray}, which belong elsewhere")
        problems += [f"package {name}: {f} listed but absent" for f in EXPECTED[name]
                     if f in listed and not os.path.lexists(f)]
    assert not problems, "\n".join(problems)
    conffiles = run(["dpkg-query", "-W", "-f=${Conffiles}", "apsd"]).stdout
    assert "/etc/apsd/apsd.conf " in conffiles, f"apsd.conf is not a conffile: {conffiles!r}"
    assert (pathlib.Path(SITE) / "_install.py").read_text().count(f'"{LIBDIR}"') == 1
    assert os.readlink(f"{LIBDIR}/libaps.so") == "libaps.so.0"
    assert "libaps.so.0 " in run(["ldconfig", "-p"]).stdout


def test_postinst_made_the_apsd_user_and_enabled_the_unit(machine):
    user = pwd.getpwnam("apsd")
    assert grp.getgrgid(user.pw_gid).gr_name == "apsd"
    assert user.pw_uid < 1000 and user.pw_dir == "/var/lib/apsd", user
    assert user.pw_shell in ("/usr/sbin/nologin", "/sbin/nologin"), user
    # dh_installsystemd's postinst enables the unit, with or without a running systemd.
    wants = pathlib.Path("/etc/systemd/system/multi-user.target.wants/apsd.service")
    assert wants.is_symlink() and os.readlink(wants) == "/lib/systemd/system/apsd.service"
    if shutil.which("systemd-analyze"):
        p = run(["systemd-analyze", "verify", "/lib/systemd/system/apsd.service"], check=False)
        assert p.returncode == 0 and (p.stdout + p.stderr).strip() == "", p.stdout + p.stderr


def systemd_is_running():
    if not os.path.isdir("/run/systemd/system") or shutil.which("systemctl") is None:
        return False
    p = run(["systemctl", "is-system-running"], check=False)
    return p.stdout.strip() in ("running", "degraded", "starting")


@pytest.mark.skipif(not systemd_is_running(), reason="systemd is not PID 1 here "
                    "(systemctl is-system-running): the installed apsd runs directly instead")
def test_systemd_runs_the_installed_unit(machine):
    """Where systemd runs, the postinst started apsd.service (loopback, port 5555)."""
    p = run(["systemctl", "is-active", "apsd"], check=False)
    if p.stdout.strip() != "active":
        log = run(["journalctl", "-u", "apsd", "-n", "30", "--no-pager"], check=False).stdout
        pytest.fail(f"apsd.service is {p.stdout.strip()} after the install:\n{log}")
    out = run(["/usr/bin/apsctl", "--stats", "/run/apsd/stats.sock", "stats"]).stdout
    assert out.startswith("apsd 0.1.0 at tcp://127.0.0.1:5555"), out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKER = """
import json, sys
import numpy as np
import aps
x = np.array([1.0, -2.0, 0.5, 0.25, -0.125, 3.0, 0.0, -1.5], dtype=np.float32)
want = x.copy()
with aps.Client(sys.argv[1], rank=0, world_size=1, job="deb-test", timeout_ms=20000) as c:
    c.allreduce("w", x)
    c.allreduce("w", x)
    maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libaps" in l})
    print(json.dumps({"file": aps.__file__, "version": aps.__version__, "maps": maps,
                      "result": x.tolist(), "want": want.tolist()}), flush=True)
    sys.stdin.readline()  # the test reads apsctl jobs while the job is connected
"""


def start_apsd(machine, tmp):
    """The installed apsd as the apsd user on a free loopback port, its stats
    socket in tmp/run (tmp must be reachable by apsd: not pytest's 0700 tmp_path)."""
    run_dir = tmp / "run"
    run_dir.mkdir()
    shutil.chown(run_dir, "apsd", "apsd")
    stats = run_dir / "stats.sock"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    log = tmp / "apsd.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["/usr/sbin/apsd", "--config", "/etc/apsd/apsd.conf", "--listen",
                                 endpoint, "--stats", str(stats)], stdout=out, stderr=out,
                                user="apsd", group="apsd", extra_groups=[], cwd="/",
                                env=clean_env())
    machine.procs.append(proc)
    deadline = time.monotonic() + 10
    while "listening" not in log.read_text():
        assert proc.poll() is None, f"apsd exited {proc.returncode}: {log.read_text()}"
        assert time.monotonic() < deadline, "apsd did not listen: " + log.read_text()
        time.sleep(0.05)
    return proc, endpoint, stats, log


def test_installed_daemon_serves_the_installed_python_package(machine):
    work = pathlib.Path(tempfile.mkdtemp(prefix="apsd-deb-", dir="/tmp"))
    try:
        work.chmod(0o755)
        proc, endpoint, stats, log = start_apsd(machine, work)
        worker = subprocess.Popen([PYTHON, "-c", WORKER, endpoint], cwd=work, env=clean_env(),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        machine.procs.append(worker)
        line = worker.stdout.readline()
        assert line, "the worker failed:\n" + worker.communicate(timeout=30)[1]
        got = json.loads(line)
        jobs = json.loads(run(["/usr/bin/apsctl", "--stats", str(stats), "jobs", "--json"],
                              cwd=work, env=clean_env()).stdout)["jobs"]
        worker.stdin.write("\n")
        worker.stdin.flush()
        _, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        rounds = json.loads(run(["/usr/bin/apsctl", "--stats", str(stats), "stats",
                                 "--json"]).stdout)["counters"]["rounds"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log.read_text()
    finally:
        shutil.rmtree(work)
    assert got["file"] == f"{SITE}/__init__.py", got
    assert got["maps"] == [f"{LIBDIR}/libaps.so.0.1.0"], got
    assert got["version"] == "0.1.0"
    # world size 1, values exact in e4m3 after APS scaling: the mean is x itself.
    assert got["result"] == got["want"], got
    assert [(j["name"], j["world_size"], j["connected"]) for j in jobs] == [("deb-test", 1, 1)]
    assert rounds == 2
    helped = run(["/usr/bin/apsctl", "--help"], check=False)
    assert (helped.stdout + helped.stderr).startswith("usage: apsctl"), helped


C_PROGRAM = r"""
#include <aps.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
	printf("%s %s\n", aps_version(), aps_err_name(APS_EINVAL));
	return strcmp(aps_version(), "0.1.0") != 0;
}
"""


def resolved_libaps(program):
    """The file ld.so loads for program's libaps.so.0 (ldd), symlinks resolved
    (/lib is /usr/lib on a merged-/usr system)."""
    ldd = run(["ldd", str(program)], env=clean_env()).stdout
    lines = [l.split() for l in ldd.splitlines() if l.split()[:2] == ["libaps.so.0", "=>"]]
    assert len(lines) == 1, ldd
    return os.path.realpath(lines[0][2])


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_libaps_dev_builds_a_program(machine, tmp_path):
    (tmp_path / "v.c").write_text(C_PROGRAM)
    flags = run(["pkg-config", "--cflags", "--libs", "libaps"], env=clean_env()).stdout.split()
    assert "-laps" in flags, flags
    run(["cc", "-o", str(tmp_path / "v"), str(tmp_path / "v.c"), *flags])
    out = run([str(tmp_path / "v")], env=clean_env()).stdout
    assert out == "0.1.0 APS_EINVAL\n", out
    assert resolved_libaps(tmp_path / "v") == os.path.realpath(f"{LIBDIR}/libaps.so.0")


def developer_library_loaded(env_extra):
    """The libaps file a developer's `import aps` (worker/python) maps, from /tmp."""
    code = ("import aps; print(sorted({l.split()[-1] for l in open('/proc/self/maps') "
            "if 'libaps' in l}))")
    env = clean_env(PYTHONPATH=str(ROOT / "worker" / "python"), **env_extra)
    return run([PYTHON, "-c", code], cwd="/tmp", env=env).stdout.strip()


@pytest.mark.skipif(not (BUILD / "worker" / "libaps.so.0").exists(), reason="no build/")
def test_installed_packages_do_not_shadow_the_build_tree(machine):
    """While the packages are installed, the tests still load build/'s libaps:
    with APS_LIBRARY (tests/run-tests.sh), without it (worker/python's aps finds
    build/worker/libaps.so.0 before the system's), and build/'s programs by
    their RUNPATH."""
    want = str(BUILD / "worker" / "libaps.so.0.1.0")
    assert developer_library_loaded({}) == repr([want])
    lib = str(BUILD / "worker" / "libaps.so.0")
    assert developer_library_loaded({"APS_LIBRARY": lib}) == repr([want])
    if (BUILD / "worker" / "apsctl").exists():
        assert resolved_libaps(BUILD / "worker" / "apsctl") == os.path.realpath(lib)


def test_purge_leaves_the_machine_as_before(machine):
    purge()
    assert [n for n in PACKAGES if package_state(n) != "not-installed"] == []
    listed = [f for name in PACKAGES for f in machine.listed[name]
              if f.startswith("/") and not os.path.isdir(f) and os.path.lexists(f)]
    left = [p for p in LEFTOVERS if os.path.lexists(p)]
    assert not listed and not left, f"left after the purge: {listed + left}"
    assert "libaps" not in run(["ldconfig", "-p"]).stdout
    for p in machine.procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert apsd_processes() == [], "an apsd still runs"
    machine.restore()
    assert user_exists("apsd") == machine.had_user
    assert group_exists("apsd") == machine.had_group
    if (BUILD / "worker" / "libaps.so.0").exists():
        assert developer_library_loaded({}) == repr([str(BUILD / "worker" / "libaps.so.0.1.0")])
