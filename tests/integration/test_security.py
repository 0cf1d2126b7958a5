"""CURVE between workers and the daemon, the allowlist, and the rule that gradients
leave the host only encrypted unless the operator says otherwise."""

import os
import subprocess
import time

import numpy as np
import pytest

import aps
from conftest import APSD, BUILD, free_port, run_workers
from peers import HELLO, Peer, ready_bomb
from test_daemon import assert_all_ok

ECONN = -10  # common/err.h

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
    # A key not in the allowlist is told so at once (it waited for its deadline and
    # read "is the daemon running?" before).
    start = time.monotonic()
    out = run_workers(d.endpoint, 1, [7], steps=1, timeout_ms=20000, job="other",
                      env=stranger)[0][1]
    assert "APS_EACCES" in out and "authentication failed" in out, out
    assert time.monotonic() - start < 10, out
    # A client without CURVE is told why every time: libzmq 4.3.4 says so only when the
    # daemon's greeting came before its close (7 runs in 8), so the client asks the
    # daemon's greeting itself (worker/zmtp_probe.c). 5 of 40 runs failed before.
    start = time.monotonic()
    for i in range(12):
        out = run_workers(d.endpoint, 1, [7], steps=1, timeout_ms=20000, job=f"plain{i}")[0][1]
        assert "APS_EACCES" in out and "the daemon uses CURVE and this client does not" in out, out
    assert time.monotonic() - start < 12, out
    log = d.log_path.read_text()
    assert "CURVE on allowed_keys=1" in log and "its key is not allowed" in log, log


def test_a_curve_client_of_a_plain_daemon_is_told_so(daemon, tmp_path):
    server_pub, _ = keygen(tmp_path, "server")
    worker_pub, worker_key = keygen(tmp_path, "worker")
    env = {"APS_CURVE_SERVER_KEY": server_pub, "APS_CURVE_PUBLIC_KEY": worker_pub,
           "APS_CURVE_SECRET_KEY": worker_key}
    start = time.monotonic()
    for i in range(6):
        out = run_workers(daemon.endpoint, 1, [7], steps=1, timeout_ms=20000, job=f"c{i}",
                          env=env)[0][1]
        assert "APS_EACCES" in out and "this client uses CURVE and the daemon does not" in out, out
    assert time.monotonic() - start < 10, out


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


def test_curve_keys_join_only_the_jobs_their_line_names(daemon_factory, tmp_path):
    server_pub, _ = keygen(tmp_path, "server")
    train_pub, train_key = keygen(tmp_path, "train")
    any_pub, any_key = keygen(tmp_path, "any")
    (tmp_path / "allow").write_text(f"{train_pub} train-* eval  # the trainers\n{any_pub}\n")
    d = daemon_factory(extra=["--curve_secret_key_file", str(tmp_path / "server.key"),
                              "--curve_allow_file", str(tmp_path / "allow")])
    trainer = {"APS_CURVE_SERVER_KEY": server_pub, "APS_CURVE_PUBLIC_KEY": train_pub,
               "APS_CURVE_SECRET_KEY": train_key}
    anyone = {**trainer, "APS_CURVE_PUBLIC_KEY": any_pub, "APS_CURVE_SECRET_KEY": any_key}
    assert_all_ok(run_workers(d.endpoint, 2, [7], steps=1, job="train-3", env=trainer), 1, 1)
    assert_all_ok(run_workers(d.endpoint, 1, [7], steps=1, job="eval", env=trainer), 1, 1)
    out = run_workers(d.endpoint, 1, [7], steps=1, job="other", env=trainer)[0][1]
    assert "APS_EACCES" in out and "may not join this job" in out, out
    assert_all_ok(run_workers(d.endpoint, 1, [7], steps=1, job="other", env=anyone), 1, 1)
    assert d.counter("refused_token") == 1


def test_allowlist_job_names_are_checked(tmp_path):
    server_pub, _ = keygen(tmp_path, "server")
    key, _ = keygen(tmp_path, "w")
    (tmp_path / "allow").write_text(f"{key} {'x' * 65}\n")
    p = subprocess.run([str(APSD), "--curve_secret_key_file", str(tmp_path / "server.key"),
                        "--curve_allow_file", str(tmp_path / "allow")], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 2 and "allow:1: a job name is longer than 64 bytes" in p.stderr, \
        p.stderr


def from_address(endpoint, ip):
    """endpoint, connected from source address ip (ZeroMQ's "tcp://SRC:0;DST")."""
    return endpoint.replace("tcp://", f"tcp://{ip}:0;")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ipv6_listens_and_lets_in_what_allow_from_says(daemon_factory):
    # Before: apsd could not listen on IPv6 ("cannot listen endpoint=tcp://[::1]:P
    # reason=No such device": libzmq needs ZMQ_IPV6), libaps could not connect to
    # one, and an IPv6 network in allow_from ("10.0.0.0/8, fd00::/8", as the docs
    # write it) stopped apsd at start ("libzmq takes no accept filter fd00::/8").
    port = free_port()
    d = daemon_factory(endpoint=f"tcp://[::]:{port}",
                       extra=["--insecure", "yes", "--allow_from", "127.0.0.2, fd00::/8"])
    # tcp://[::] takes IPv6 and IPv4 (as ::ffff:127.0.0.2): the host's own, and
    # the networks listed
    for endpoint in (f"tcp://[::1]:{port}", f"tcp://127.0.0.1:{port}",
                     from_address(f"tcp://127.0.0.1:{port}", "127.0.0.2")):
        with aps.Client(endpoint, 0, 1, job=f"in-{len(endpoint)}", timeout_ms=10000) as c:
            x = np.arange(5, dtype=np.float32)
            c.allreduce("x", x)
            assert x.tolist() == [0, 1, 2, 3, 4]
    # anyone else is closed at accept (an IPv4 filter read as IPv6 would have
    # matched every IPv4 peer: the ZAP handler refused it, after the handshake)
    with pytest.raises(aps.Error) as refused:
        aps.Client(from_address(f"tcp://127.0.0.1:{port}", "127.0.0.3"), 0, 1, job="out",
                   timeout_ms=20000)
    assert refused.value.code == ECONN and "allow_from" in str(refused.value), refused.value
    assert d.counter("accepts_closed") >= 1 and d.counter("handshakes_not_allowed") == 0
    assert aps.daemon.is_listening(f"tcp://[::1]:{port}")
    # an IPv4 daemon with an IPv6 network in allow_from starts, and lets in the IPv4 ones
    v4 = daemon_factory(extra=["--allow_from", "127.0.0.2, fd00::/8"])
    aps.Client(from_address(v4.endpoint, "127.0.0.2"), 0, 1, timeout_ms=10000).close()
    # an IPv6 network that holds the IPv4-mapped addresses (::/0) is every IPv6
    # peer, no IPv4 one, at accept as at the handshake (before: its filter let
    # every IPv4 peer past accept, and the ZAP handler refused it after parsing
    # its handshake: 8 of 4 MB took another job's step to 0.4 s)
    port = free_port()
    wide = daemon_factory(endpoint=f"tcp://[::]:{port}", extra=["--insecure", "yes",
                                                                "--allow_from", "::/0"])
    aps.Client(f"tcp://[::1]:{port}", 0, 1, job="v6", timeout_ms=10000).close()
    with pytest.raises(aps.Error, match="allow_from"):
        aps.Client(from_address(f"tcp://127.0.0.1:{port}", "127.0.0.3"), 0, 1, job="v4",
                   timeout_ms=20000)
    assert wide.counter("accepts_closed") >= 1
    assert wide.counter("handshakes_not_allowed") == 0


def test_allow_from_closes_other_networks_at_accept(daemon_factory):
    # Before: anyone who reached the port could start jobs, and a stranger with
    # max_jobs / max_jobs_per_address addresses (4) held every job slot. With
    # allow_from, libzmq closes a connection from elsewhere at accept, before it
    # reads a byte: a refusal at the handshake (ZAP) came after libzmq had parsed
    # the handshake, and 4 MB of its properties cost 0.7 s of libzmq's I/O thread.
    d = daemon_factory(extra=["--allow_from", "127.0.0.2, 127.0.0.16/30",
                              "--max_jobs", "8", "--max_jobs_per_address", "2"])
    # the host's own address (127.0.0.1, always let in) and the networks listed
    assert_all_ok(run_workers(d.endpoint, 2, [7, 4097], steps=2), 2, 2)
    for ip in ("127.0.0.2", "127.0.0.16", "127.0.0.19"):
        aps.Client(from_address(d.endpoint, ip), rank=0, world_size=1, job=f"in-{ip}",
                   timeout_ms=10000).close()
    # anyone else: refused within seconds, told what to look at
    for ip in ("127.0.0.3", "127.0.0.15", "127.0.0.20"):
        began = time.monotonic()
        with pytest.raises(aps.Error) as refused:
            aps.Client(from_address(d.endpoint, ip), rank=0, world_size=1, job="out",
                       timeout_ms=20000)
        assert time.monotonic() - began < 10
        assert refused.value.code == ECONN, refused.value
        assert "allow_from" in str(refused.value), refused.value
    # the stranger with 4 addresses that filled the job table: none of its HELLOs
    # gets a job, and an honest job still starts
    squatters = [Peer(from_address(d.endpoint, f"127.0.0.{x}")) for x in range(4, 8)
                 for _ in range(2)]
    for i, p in enumerate(squatters):
        p.send(type=HELLO, job=f"squat{i}", rank=0, world_size=2)
    assert all(p.recv(timeout_ms=1000) is None for p in squatters)
    assert d.ask("stats")["jobs"] == 0
    assert_all_ok(run_workers(d.endpoint, 2, [7], steps=2, job="after"), 2, 1)
    # a handshake of 500000 properties from outside is never parsed
    cpu = cpu_seconds(d.proc.pid)
    for x in range(4):
        assert ready_bomb(d.endpoint, f"127.0.0.{40 + x}")
    assert cpu_seconds(d.proc.pid) - cpu < 0.5  # 0.7 s each when parsed
    assert d.counter("accepts_closed") >= 3 * 8 + len(squatters) + 4
    assert d.counter("unheard_dropped") == 0
    assert "closed connections at accept" in d.log_path.read_text()
    for p in squatters:
        p.close()
