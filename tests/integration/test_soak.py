"""A short soak (tests/soak/soak.py): 2 jobs x 8 real workers for 25 s under
kill -9 of workers, a daemon restart by SIGTERM and one by SIGKILL, and a
rogue peer; every delivered result is checked bit for bit. `make soak` runs
the long version, with the RSS check."""

import json
import subprocess
import sys

from conftest import BUILD, ROOT


def test_short_soak_has_no_wrong_result(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "soak" / "soak.py"),
                          "--seconds", "25", "--kill-every", "3", "--build", str(BUILD),
                          "--out", str(out), "--no-rss-check"],
                         capture_output=True, text=True, timeout=240)
    assert out.exists(), run.stdout + run.stderr
    report = json.loads(out.read_text())
    failed = [name for name, ok in report["checks"].items() if not ok]
    assert not failed, run.stdout + run.stderr
    assert report["wrong_results"] == 0 and report["results_verified"] > 100  # ASan: ~650
    assert report["faults"]["worker_kill9"] >= 1  # a job is spared while a restart settles
    assert report["faults"]["daemon_sigterm"] + report["faults"]["daemon_sigkill"] == 3
    assert run.returncode == 0, run.stdout
