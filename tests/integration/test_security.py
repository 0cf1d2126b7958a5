"""CURVE between workers and the daemon, the allowlist, and the rule that gradients
leave the host only encrypted unless the operator says otherwise."""

import subprocess

from conftest import APSD, BUILD, free_port, run_workers
from test_daemon import assert_all_ok

APSCTL = BUILD / "worker" / "apsctl"


def keygen(tmp_path, name):
    subprocess.run([str(APSCTL), "keygen", str(tmp_path / name)], check=True,
                   capture_output=True, timeout=10)
    key = lambda ext: (tmp_path / f"{name}.{ext}").read_text().split("\n")[1]  # noqa: E731
    return key("pub"), key("key")


def test_curve_lets_in_allowed_keys_only(daemon_factory, tmp_path):
    server_pub, _ = keygen(tmp_path, "server")
    worker_pub, worker_key = keygen(tmp_path, "worker")
    stranger_pub, stranger_key = keygen(tmp_path, "stranger")
    assert (tmp_path / "server.key").stat().st_mode & 0o777 == 0o600
    (tmp_path / "allow").write_text(f"# the workers of job default\n{worker_pub}\n")
    d = daemon_factory(extra=["--curve_secret_key_file", str(tmp_path / "server.key"),
                              "--curve_allow_file", str(tmp_path / "allow")])
    allowed = {"APS_CURVE_SERVER_KEY": server_pub, "APS_CURVE_PUBLIC_KEY": worker_pub,
               "APS_CURVE_SECRET_KEY": worker_key}
    assert_all_ok(run_workers(d.endpoint, 2, [7, 4097], steps=2, env=allowed), 2, 2)
    stranger = {**allowed, "APS_CURVE_PUBLIC_KEY": stranger_pub,
                "APS_CURVE_SECRET_KEY": stranger_key}
    out = run_workers(d.endpoint, 1, [7], steps=1, timeout_ms=1500, job="other",
                      env=stranger)[0][1]
    assert "APS_ETIMEDOUT" in out, out
    out = run_workers(d.endpoint, 1, [7], steps=1, timeout_ms=1500, job="plain")[0][1]
    assert "APS_ETIMEDOUT" in out, out  # no CURVE at all: no handshake
    log = d.log_path.read_text()
    assert "CURVE on allowed_keys=1" in log and "its key is not allowed" in log, log


def test_listening_beyond_loopback_needs_curve_or_insecure(daemon_factory, tmp_path):
    port = free_port()
    p = subprocess.run([str(APSD), "--listen", f"tcp://0.0.0.0:{port}"], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 2 and "without CURVE would send gradients in clear" in p.stderr
    d = daemon_factory(extra=["--insecure", "yes"])
    d.proc.terminate()
    d.proc.wait(timeout=10)
    # the fixture's own endpoint is loopback: try the real thing in a daemon of its own
    log = tmp_path / "insecure.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([str(APSD), "--listen", f"tcp://0.0.0.0:{port}", "--insecure",
                                 "yes", "--stats", str(tmp_path / "s.sock")], stderr=f)
        try:
            import time
            for _ in range(100):
                if "listening" in log.read_text():
                    break
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    assert "insecure: listening on" in log.read_text()


def test_bad_key_files_are_config_errors(tmp_path):
    (tmp_path / "bad.key").write_text("not a key\n")
    (tmp_path / "allow").write_text("")
    p = subprocess.run([str(APSD), "--curve_secret_key_file", str(tmp_path / "bad.key"),
                        "--curve_allow_file", str(tmp_path / "allow")], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 2 and "bad.key:1: not a Z85 key of 40 characters" in p.stderr
    p = subprocess.run([str(APSD), "--curve_secret_key_file", str(tmp_path / "bad.key")],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "needs both" in p.stderr, p.stderr
