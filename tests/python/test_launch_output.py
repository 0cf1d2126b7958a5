"""python3 -m aps.launch's output: every line of every rank arrives whole,
with its rank's prefix, however the ranks write (long lines, many at once,
both streams, a last line without a newline), and a failing rank's traceback
is written whole before the launcher says that the rank failed."""

import os
import re
import subprocess
import sys
import time

import aps.daemon
from conftest import ROOT

LINES, WIDTH = 300, 3000

NOISY = f"""
import os, sys
rank = int(os.environ["RANK"])
for stream, name in ((sys.stdout, "out"), (sys.stderr, "err")):
    lines = [f"r{{rank}} {{name}} {{i}} " + "abcdefgh"[rank] * {WIDTH} for i in range({LINES})]
    stream.write("\\n".join(lines[:-1]) + "\\n")   # all at once
    stream.write(lines[-1])                        # no newline at the end
    stream.flush()
"""

DETAILS = 50  # < 128 KiB in two pipes: rank 1 exits while its reader waits on ours

FAILING = f"""
import os, sys, time
if os.environ["RANK"] == "1":
    raise ValueError("bad batch:\\n" + "\\n".join(f"detail {{i}} " + "x" * 2000
                                                  for i in range({DETAILS})))
time.sleep(60)
"""


def launch(tmp_path, source, *flags, merged=False, read_after_s=0.0):
    """The launcher's run (stdout, stderr or both merged), its output read
    after read_after_s seconds: a slow reader holds it in its writes."""
    script = tmp_path / "worker.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "worker" / "python"),
           "APSD": str(ROOT / "build" / "server" / "apsd")}
    env.pop("APS_JOB_TOKEN", None)
    p = subprocess.Popen([sys.executable, "-m", "aps.launch", *flags, str(script)], env=env,
                         stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if merged else subprocess.PIPE)
    time.sleep(read_after_s)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_ranks_never_meet_mid_line(tmp_path, apsd):
    p = launch(tmp_path, NOISY, "--nproc_per_node", "3", "--endpoint", apsd, merged=True)
    assert p.returncode == 0, p.stdout[-2000:]
    line = re.compile(rb"\[rank (\d)\] r(\d) (out|err) (\d+) ([a-h])+$")
    seen = {}
    for text in p.stdout.split(b"\n")[:-1]:
        if text.startswith(b"[launch] "):
            continue
        m = line.match(text)
        assert m and m[1] == m[2] and len(text) == len(m[0]), text[:200]
        assert text.endswith(b"abcdefgh"[int(m[1]):int(m[1]) + 1] * WIDTH), text[:200]
        seen.setdefault((int(m[1]), m[3]), []).append(int(m[4]))
    assert p.stdout.endswith(b"\n")
    assert seen == {(r, s): list(range(LINES)) for r in range(3) for s in (b"out", b"err")}


def test_a_failing_ranks_traceback_comes_whole_before_the_launchers_word(tmp_path, apsd):
    p = launch(tmp_path, FAILING, "-n", "2", "--endpoint", apsd, read_after_s=3.0)
    assert p.returncode == 1
    err = p.stderr.decode().splitlines()
    said = err.index("[launch] rank 1 exited with status 1; stopping the others")
    tb = [i for i, text in enumerate(err) if text.startswith("[rank 1] ")]
    assert err[tb[0]] == "[rank 1] Traceback (most recent call last):", err[tb[0]]
    assert tb == list(range(tb[0], tb[0] + len(tb))), "the traceback was cut by other lines"
    assert tb[-1] < said, "the launcher spoke before the traceback's end"
    assert err[tb[-1]].startswith(f"[rank 1] detail {DETAILS - 1} xxx"), err[tb[-1]]
    assert sum(text.startswith("[rank 1] detail ") for text in err) == DETAILS


REFUSED = """
import os, aps
with aps.Client.from_env(format="fp32") as c:
    try:
        aps.Client(c.endpoint, 0, 1, job=c.job, job_token="wrong", format="fp32")
    except aps.Error as e:
        print("refused:", e, flush=True)
"""


def test_apsds_own_lines_are_prefixed(tmp_path):
    # the apsd that the launcher starts writes through it too (here: a
    # warning about a hello with the wrong token)
    endpoint = aps.daemon.free_endpoint()
    p = launch(tmp_path, REFUSED, "-n", "1", "--endpoint", endpoint, merged=True)
    assert p.returncode == 0, p.stdout
    out = p.stdout.decode()
    assert "[rank 0] refused:" in out and "[apsd] " in out, out
    for text in out.splitlines():
        assert text.startswith(("[rank 0] ", "[launch] ", "[apsd] ")), text
