"""Installing aps: `meson install` puts the Python package where Debian's
/usr/bin/python3 imports it, next to a record of the prefix's libdir, and the
systemd unit and sysusers.d entry under the prefix (not /lib) unless the prefix
is /usr; the wheel pip builds from pyproject.toml (meson-python, offline) holds
libaps and the package loads that copy from any directory (about 20 s on 2
cores: it compiles libaps)."""

import json
import os
import pathlib
import subprocess
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
PYTHON = "/usr/bin/python3"  # the python3 `meson install` installs for
PACKAGE = ROOT / "worker" / "python" / "aps"
MODULES = sorted(p.name for p in PACKAGE.glob("*.py"))

pytestmark = pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"no {PYTHON}")


def python_paths():
    """sys.path of /usr/bin/python3 without PYTHONPATH and user site."""
    out = subprocess.run([PYTHON, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                         capture_output=True, text=True, check=True).stdout
    return [pathlib.Path(p) for p in json.loads(out) if p]


def python_version():
    return subprocess.run([PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def meson_plan(build_dir):
    """{source or built file: absolute install path} of a configured build."""
    return json.loads((build_dir / "meson-info" / "intro-installed.json").read_text())


def configure(tmp_path, prefix):
    """A fresh build directory configured for prefix (configuring only)."""
    build_dir = tmp_path / "build"
    run = subprocess.run(["meson", "setup", str(build_dir), str(ROOT), f"--prefix={prefix}"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return meson_plan(build_dir)


def package_dir(plan):
    """The directory the aps package is installed into (its modules' parent)."""
    dirs = {pathlib.PurePath(dest).parent for src, dest in plan.items()
            if pathlib.PurePath(src).parent == PACKAGE}
    dirs |= {pathlib.PurePath(dest) for src, dest in plan.items() if src == str(PACKAGE)}
    assert len(dirs) == 1, plan
    return pathlib.Path(dirs.pop())


def installed_to(plan, name):
    found = [pathlib.PurePath(dest) for dest in plan.values() if dest.endswith("/" + name)]
    assert len(found) == 1, (name, plan)
    return found[0]


def test_usr_local_package_is_on_python3s_path(tmp_path):
    """make install's prefix: /usr/local/lib/python3.X/dist-packages, not
    /usr/local/lib/python3/dist-packages, which Debian's python3 never reads."""
    plan = configure(tmp_path, "/usr/local")
    pkg = package_dir(plan)
    assert pkg.parent == pathlib.Path(f"/usr/local/lib/python{python_version()}/dist-packages")
    assert pkg.parent in python_paths(), (pkg, python_paths())
    assert installed_to(plan, "apsd.service").parent == pathlib.Path(
        "/usr/local/lib/systemd/system")
    assert installed_to(plan, "apsd.conf").parent == pathlib.Path("/usr/local/lib/sysusers.d")


def test_home_prefix_writes_nothing_outside_it(tmp_path):
    """A --prefix=$HOME/x install: the unit, sysusers.d and the package stay
    under $HOME/x (before: /lib/systemd/system and /usr/lib/sysusers.d)."""
    prefix = tmp_path / "x"
    plan = configure(tmp_path, prefix)
    outside = [dest for dest in plan.values() if not pathlib.PurePath(dest).is_relative_to(prefix)]
    assert not outside, outside
    assert installed_to(plan, "apsd.service").parent == prefix / "lib" / "systemd" / "system"
    assert installed_to(plan, "apsd.conf").parent == prefix / "lib" / "sysusers.d"
    site = prefix / "lib" / f"python{python_version()}" / "dist-packages"
    assert package_dir(plan).parent == site


def test_usr_prefix_follows_systemd(tmp_path):
    """--prefix=/usr (a distribution package): systemd's own directories and
    Debian's /usr/lib/python3/dist-packages."""
    plan = configure(tmp_path, "/usr")
    assert str(installed_to(plan, "apsd.service").parent) in ("/lib/systemd/system",
                                                              "/usr/lib/systemd/system")
    assert installed_to(plan, "apsd.conf").parent == pathlib.Path("/usr/lib/sysusers.d")
    assert package_dir(plan) == pathlib.Path("/usr/lib/python3/dist-packages/aps")


def libaps_loaded(python, cwd, env, package_path=None):
    """Imports aps with python from cwd, does a codec round trip and returns
    (aps.__file__, the libaps file mapped into the process)."""
    code = """
import json
import numpy as np
import aps
x = np.linspace(-3, 3, 1000, dtype=np.float32)
k = aps.aps_exponent(x, "e4m3", mode="local")
y = aps.dequantize(aps.quantize(x, "e4m3", scale_exp=k), "e4m3", x.size, scale_exp=k)
assert np.allclose(x, y, rtol=0.07, atol=1e-3), (x, y)
assert callable(aps.Client)
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libaps" in line]
print(json.dumps([aps.__file__, sorted(set(maps))]))
"""
    env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "APS_LIBRARY")}
    if package_path:
        env["PYTHONPATH"] = str(package_path)
    run = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    aps_file, maps = json.loads(run.stdout.splitlines()[-1])
    assert len(maps) == 1, maps
    return pathlib.Path(aps_file), pathlib.Path(maps[0])


@pytest.mark.skipif(not (BUILD / "build.ninja").exists(), reason="build/ is not configured")
def test_destdir_install_of_the_build(tmp_path):
    """`meson install --destdir` of build/: every module of the package, where
    python3 reads that prefix's packages, and the package loads libaps from the
    prefix's libdir (here the staged copy: LIBDIR pointed into the destdir)."""
    opts = {o["name"]: o["value"] for o in
            json.loads((BUILD / "meson-info" / "intro-buildoptions.json").read_text())}
    prefix = pathlib.PurePosixPath(opts["prefix"])
    destdir = tmp_path / "dest"
    run = subprocess.run(["meson", "install", "-C", str(BUILD), "--destdir", str(destdir),
                          "--no-rebuild", "--quiet"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr

    def staged(path):
        return destdir / pathlib.PurePosixPath(path).relative_to("/")

    site = prefix / "lib" / f"python{python_version()}" / "dist-packages"
    if prefix == pathlib.PurePosixPath("/usr"):
        site = prefix / "lib" / "python3" / "dist-packages"
    if prefix in (pathlib.PurePosixPath("/usr"), pathlib.PurePosixPath("/usr/local")):
        assert pathlib.Path(site) in python_paths()
    pkg = staged(site / "aps")
    assert sorted(p.name for p in pkg.glob("*.py")) == sorted(MODULES + ["_install.py"])
    assert not (pkg / "__pycache__").exists()
    libdir = prefix / opts["libdir"]
    assert staged(libdir / "libaps.so.0").exists()
    namespace = {}
    exec((pkg / "_install.py").read_text(), namespace)
    assert namespace["LIBDIR"] == str(libdir)
    if prefix != pathlib.PurePosixPath("/usr"):
        assert staged(prefix / "lib" / "systemd" / "system" / "apsd.service").exists()
        assert staged(prefix / "lib" / "sysusers.d" / "apsd.conf").exists()
        assert not (destdir / "lib").exists()
        assert not (destdir / "usr" / "lib" / "sysusers.d").exists()

    # The staged package with its LIBDIR moved into the destdir, imported from elsewhere.
    (pkg / "_install.py").write_text(f"LIBDIR = {str(staged(libdir))!r}\n")
    aps_file, loaded = libaps_loaded(PYTHON, tmp_path, os.environ, package_path=pkg.parent)
    assert aps_file == pkg / "__init__.py"
    assert loaded.resolve() == staged(libdir / "libaps.so.0").resolve()


def has_mesonpy():
    return os.path.exists(PYTHON) and subprocess.run([PYTHON, "-c", "import mesonpy"],
                                                     capture_output=True).returncode == 0


@pytest.mark.skipif(not has_mesonpy(), reason="meson-python is not installed (python3-mesonpy)")
def test_wheel_built_offline_carries_libaps(tmp_path):
    """pip wheel --no-build-isolation --no-index in a venv that sees Debian's
    meson-python; the wheel holds aps/libaps.so and no daemon; installed, aps
    loads that copy, not build/'s, from a directory outside the repository."""
    venv = tmp_path / "v"
    subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "APS_LIBRARY")}
    wheels = tmp_path / "wheels"
    run = subprocess.run([str(py), "-m", "pip", "wheel", "--isolated", "--no-build-isolation",
                          "--no-index", "--no-deps", "-w", str(wheels), str(ROOT)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = wheels.glob("aps-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "aps/libaps.so" in names, names
    assert {f"aps/{m}" for m in MODULES} <= set(names), names
    assert "aps/_install.py" not in names, names  # it would name a libdir outside the wheel
    assert not [n for n in names if "apsd" in n.split("/")[-1] or "apsctl" in n
                or n.endswith(".h") or "systemd" in n or "__pycache__" in n], names

    run = subprocess.run([str(py), "-m", "pip", "install", "--isolated", "--no-index", str(wheel)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    aps_file, loaded = libaps_loaded(py, tmp_path, env)
    site = aps_file.parent.parent
    assert site.is_relative_to(venv), aps_file
    assert loaded == aps_file.parent / "libaps.so", loaded
    assert not loaded.is_relative_to(ROOT), loaded
