"""The real daemon with real worker processes: exact results, any arrival order,
several jobs, and the failures a cluster sees (a worker killed mid-round, a
silent rank, bad messages, a daemon stopped under its workers)."""

import re
import signal
import subprocess
import time

import numpy as np
import pytest

import aps
from conftest import APSD, kill_rank_2_while_the_others_wait, run_workers, start_worker

SMALL = [1, 7, 4097]


def assert_all_ok(results, steps, n_tensors):
    sums = None
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{out}"
        lines = re.findall(r"^ok step=\d+ tensor=\d+ n=\d+ sum=\w+$", out, re.M)
        assert len(lines) == steps * n_tensors, out
        # every rank received the very same bits
        assert sums is None or lines == sums, f"rank {rank} differs"
        sums = lines


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("fmt", ["fp32", "e4m3"])
def test_allreduce_exact(daemon_factory, transport, world, fmt):
    d = daemon_factory(transport)
    results = run_workers(d.endpoint, world, SMALL, steps=3, format=fmt, jitter_ms=15,
                          seed=world * 7 + len(fmt))
    assert_all_ok(results, 3, len(SMALL))
    # every rank read its answers before its next call (outbox.h, aps_outbox_unread)
    assert d.counter("unread_dropped") == 0 and d.counter("reconnects") == 0


@pytest.mark.parametrize("world", [3, 5])
def test_fp32_mean_for_world_sizes_that_are_not_powers_of_two(daemon, world):
    """Division by N is not exact here: the mean must still match bit for bit."""
    assert_all_ok(run_workers(daemon.endpoint, world, SMALL, steps=2, format="fp32",
                              jitter_ms=10), 2, len(SMALL))


@pytest.mark.parametrize("fmt,scaling,downlink", [
    ("e5m2", "local", None), ("e3m0", "local", None), ("e4m3", "none", None),
    ("e4m3", "local", "fp16"), ("e4m3fn", "local", "bf16"), ("bf16", "local", None),
])
def test_formats_scaling_and_downlink(daemon, fmt, scaling, downlink):
    opts = dict(steps=2, format=fmt, scaling=scaling, jitter_ms=10)
    if downlink:
        opts["downlink"] = downlink
    assert_all_ok(run_workers(daemon.endpoint, 3, SMALL, **opts), 2, len(SMALL))


@pytest.mark.parametrize("fmt", ["fp32", "e4m3"])
def test_ten_million_elements(daemon, fmt):
    assert_all_ok(run_workers(daemon.endpoint, 4, [10_000_000], steps=1, format=fmt,
                              timeout=300), 1, 1)


def test_arrival_order_does_not_change_bits(daemon_factory):
    """The same data under different arrival orders gives the same bits."""
    runs = []
    for jitter_seed in (11, 12, 13):
        d = daemon_factory()
        res = run_workers(d.endpoint, 4, [4097], steps=2, seed=5, jitter_ms=40,
                          job=f"order{jitter_seed}")
        assert_all_ok(res, 2, 1)
        runs.append(res[0][1])
    assert runs[0] == runs[1] == runs[2]


def test_two_jobs_at_once(daemon):
    a = [start_worker(daemon.endpoint, r, 2, SMALL, job="alpha", steps=3, seed=1)
         for r in range(2)]
    b = [start_worker(daemon.endpoint, r, 3, SMALL, job="beta", steps=3, seed=2)
         for r in range(3)]
    results = [(p.wait(timeout=60), p.stdout.read()) for p in a + b]
    assert_all_ok(results[:2], 3, 3)
    assert_all_ok(results[2:], 3, 3)


def test_killed_worker_is_named_to_the_others(daemon):
    outs, waited = kill_rank_2_while_the_others_wait(daemon)
    assert waited < 5


def test_rank_killed_between_rounds_fails_the_next_round_at_once(daemon):
    # Step 0 completes; rank 2 is killed while ranks 0 and 1 compute (sleep)
    # before step 1, longer than the reconnect grace (1.5 s), so that apsd
    # counts rank 2 lost before they push. Their pushes of step 1 can never
    # complete: apsd answers them at once instead of letting them run into
    # their 20 s deadline.
    world = 3
    procs = [start_worker(daemon.endpoint, r, world, [4097], steps=2,
                          sleep_ms=(3000 if r < 2 else 30000), timeout_ms=20000)
             for r in range(world)]
    daemon.wait_for_log("hello job=default rank=2")
    # step 0 is done everywhere (a fixed 0.7 s after the HELLO was not always enough on
    # a loaded machine); then ranks 0 and 1 are in their sleep
    daemon.wait_for_log("round job=default tensor=layer0.weight step=0 ")
    time.sleep(0.5)
    procs[2].send_signal(signal.SIGKILL)
    start = time.monotonic()
    for p in procs[:2]:
        out, _ = p.communicate(timeout=15)
        assert p.returncode == 3, out
        assert "ok step=0" in out and "APS_EPEERLOST" in out and "rank 2" in out, out
    assert time.monotonic() - start < 4, "the push after the loss waited for its deadline"
    procs[2].wait()
    assert daemon.counter("refused_incomplete") >= 2


def test_job_byte_budget_refuses_the_tensor_past_it(daemon_factory):
    # 64k of fp32 per job: a 4096-element tensor fits (16 KiB), 16384 more do
    # not (no reconnects: nothing but the sums is held)
    d = daemon_factory(extra=("--max_job_bytes", "64k", "--reconnect_grace_ms", "0"))
    out = run_workers(d.endpoint, 1, [4096, 16384], steps=1)[0][1]
    assert "APS_ERANGE" in out and "max_job_bytes is 65536" in out, out
    assert "would hold 81920 fp32 bytes" in out, out
    assert d.counter("bad_state") >= 1
    assert_all_ok(run_workers(d.endpoint, 1, [4096, 12288], steps=1, job="fits"), 1, 2)


def test_job_byte_budget_counts_the_results_kept_for_reconnects(daemon_factory):
    # with reconnects on, each tensor's last result is kept too (4 bytes an
    # element at most): 4096 elements hold 32 KiB, 4096 more reach 64k + 1
    d = daemon_factory(extra=("--max_job_bytes", "65535"))
    out = run_workers(d.endpoint, 1, [4096, 4096], steps=1)[0][1]
    assert "APS_ERANGE" in out and "would hold 65536 fp32 bytes" in out, out
    assert_all_ok(run_workers(d.endpoint, 1, [4096, 4095], steps=1, job="fits"), 1, 2)


def test_a_new_connection_on_a_reused_descriptor_keeps_its_session(daemon):
    # Short one-rank jobs, 8 at a time: the kernel hands a closed connection's
    # descriptor to the next one at once, and the close of the old one may be
    # read after the new one's HELLO. That close must not end the new session
    # (it did, for about 1 worker in 250, when sessions were matched by fd).
    import concurrent.futures

    def loop(k):
        bad = []
        for i in range(40):
            p = start_worker(daemon.endpoint, 0, 1, [7], steps=2, job=f"short{k}-{i}",
                             timeout_ms=5000)
            out, _ = p.communicate(timeout=30)
            if p.returncode != 0:
                bad.append(out)
        return bad
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        bad = [out for outs in pool.map(loop, range(8)) for out in outs]
    assert not bad, f"{len(bad)} of 320 workers failed: {bad[:3]}"


def test_a_job_that_lost_a_rank_refuses_new_ranks(daemon):
    # rank 1 dies, rank 0 lingers: a new rank 1 under the same job name is told
    # at HELLO that the job cannot go on, instead of being welcomed and then
    # refused every call
    first = [start_worker(daemon.endpoint, r, 2, [7], steps=1,
                          sleep_ms=(30000 if r == 0 else 0), timeout_ms=30000)
             for r in range(2)]
    daemon.wait_for_log("hello job=default rank=0")
    daemon.wait_for_log("hello job=default rank=1")
    time.sleep(0.3)
    first[1].kill()
    first[1].wait()
    daemon.wait_for_log("rank lost job=default rank=1")
    again = start_worker(daemon.endpoint, 1, 2, [7], steps=1, timeout_ms=5000)
    out, _ = again.communicate(timeout=20)
    assert again.returncode == 3 and "APS_EBUSY" in out and "cannot go on" in out, out
    first[0].kill()
    first[0].wait()


def test_timeout_names_the_missing_rank(daemon):
    procs = [start_worker(daemon.endpoint, r, 2, [7], steps=1, timeout_ms=1500,
                          sleep_ms=(6000 if r == 1 else 0)) for r in range(2)]
    out, _ = procs[0].communicate(timeout=20)
    assert procs[0].returncode == 3, out
    assert "APS_ETIMEDOUT" in out and "still waits for rank 1" in out, out
    procs[1].kill()
    procs[1].wait()


def test_rank_held_by_a_live_session_is_refused(daemon):
    first = start_worker(daemon.endpoint, 0, 2, [7], steps=1, timeout_ms=5000)
    daemon.wait_for_log("hello job=default rank=0")
    second = start_worker(daemon.endpoint, 0, 2, [7], steps=1, timeout_ms=5000)
    out, _ = second.communicate(timeout=20)
    assert second.returncode == 3 and "APS_EBUSY" in out and "held by a live session" in out
    first.kill()
    first.wait()


def test_registration_mismatch_names_the_tensor(daemon):
    a = start_worker(daemon.endpoint, 0, 2, [10], steps=1, timeout_ms=5000)
    b = start_worker(daemon.endpoint, 1, 2, [11], steps=1, timeout_ms=5000)
    outs = [p.communicate(timeout=20)[0] for p in (a, b)]
    # whichever registered first, the error names the tensor, both counts and both ranks
    said = re.compile(r"APS_EMISMATCH.*'layer0.weight': rank\(s\) (0 registered 10 elements, "
                      r"rank 1 registers 11|1 registered 11 elements, rank 0 registers 10)")
    assert all(said.search(o) for o in outs), outs


def test_world_size_mismatch_is_refused(daemon):
    a = start_worker(daemon.endpoint, 0, 2, [7], steps=1, timeout_ms=3000)
    daemon.wait_for_log("hello job=default rank=0")
    b = start_worker(daemon.endpoint, 1, 3, [7], steps=1, timeout_ms=3000)
    out, _ = b.communicate(timeout=20)
    assert b.returncode == 3 and "APS_EMISMATCH" in out and "world size 2" in out, out
    a.kill()
    a.wait()


def test_nonfinite_tensor_is_refused_before_sending(daemon):
    out = run_workers(daemon.endpoint, 1, [100], steps=1, mode="nan")[0][1]
    assert "APS_ENONFINITE" in out and "nothing was sent" in out, out


def test_a_broadcast_of_nan_is_refused_before_sending(daemon):
    # (found by helper-36) rank 0's NaN went to apsd, which refused the payload:
    # APS_EPROTO "protocol error: BROADCAST: payload holds 1 inf or NaN fp32 codes"
    with aps.Client(daemon.endpoint, 0, 1, job="nanb", timeout_ms=5000) as c:
        x = np.ones(64, np.float32)
        x[3] = np.nan
        with pytest.raises(aps.Error, match="1 NaN or inf values; nothing was sent") as e:
            c.broadcast("w", x)
        assert e.value.name == "APS_ENONFINITE"
        c.broadcast("w", np.ones(64, np.float32))  # the client goes on
    assert daemon.counter("errors_sent") == 0  # nothing reached apsd to refuse


def test_a_barrier_that_times_out_names_the_rank_it_waits_for(daemon):
    # (found by helper-36) apsd answered a barrier's heartbeats without the
    # barrier's name, the client never matched them, and the timeout said "no
    # answer from apsd ... (is the daemon running?)" of a running daemon
    with aps.Client(daemon.endpoint, 0, 2, job="lonely", timeout_ms=5000) as c:
        with pytest.raises(aps.Error, match=r"no progress within 2500 ms; apsd still waits "
                                            r"for rank 1") as e:
            c.barrier(timeout_ms=2500)
        assert e.value.name == "APS_ETIMEDOUT"


def test_sigterm_says_bye_and_exits_zero(daemon_factory):
    d = daemon_factory()
    w = start_worker(d.endpoint, 0, 2, [7], steps=1, timeout_ms=20000)
    d.wait_for_log("hello job=default rank=0")
    time.sleep(0.3)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=10) == 0
    out, _ = w.communicate(timeout=10)
    assert w.returncode == 3 and "shutting down" in out, out
    assert "stopped" in d.log_path.read_text()


def test_no_daemon_is_a_clear_refusal(tmp_path):
    # the call's deadline comes before the connect timeout: still a refusal, said so
    out = run_workers(f"ipc://{tmp_path}/nobody", 1, [7], steps=1, timeout_ms=800)[0][1]
    assert "APS_ECONN" in out and "within timeout_ms = 800: connection refused" in out, out
    assert "is apsd running there, and is the socket path right?" in out, out


@pytest.mark.parametrize("args,reason", [
    (["--heartbeat_ms=5"], "--heartbeat_ms=5: must be between 100 and 60000"),
    (["--lisen", "tcp://127.0.0.1:1"], "did you mean --listen?"),
    (["extra"], "extra"),
])
def test_bad_flags_exit_2(args, reason):
    p = subprocess.run([str(APSD), *args], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and reason in p.stderr, p.stderr


def test_bad_config_file_names_file_and_line(tmp_path):
    conf = tmp_path / "apsd.conf"
    conf.write_text("# comment\nlisten = tcp://127.0.0.1:5555\nmax_jobs = lots\n")
    p = subprocess.run([str(APSD), "--config", str(conf)], capture_output=True, text=True,
                       timeout=10)
    assert p.returncode == 2, p.stderr
    assert f"{conf}:3: max_jobs = 'lots': not an integer" in p.stderr, p.stderr


def test_bind_failure_is_one_clear_line(daemon):
    p = subprocess.run([str(APSD), "--listen", daemon.endpoint], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 1 and "cannot listen" in p.stderr, p.stderr


def test_job_restarts_fresh_after_it_ended(daemon):
    for _ in range(2):  # the second run starts at step 0 again, with a new tensor table
        assert_all_ok(run_workers(daemon.endpoint, 2, [7, 4097], steps=2), 2, 2)
    assert daemon.log_path.read_text().count("job started job=default") == 2


def test_bad_messages_get_an_error_and_a_counter(daemon):
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(daemon.endpoint)
    cases = [
        ([b"\xff\xfe garbage"], b"Envelope"),
        ([b"\x08\x01\x18\x05", b"payload", b"third", b"fourth"], b"frames"),
        ([b"\x08\x07\x18\x01"], b"version"),
    ]
    try:
        for frames, expect in cases:
            rogue.send_multipart(frames)
            assert rogue.poll(5000), "no ERROR reply"
            reply = rogue.recv_multipart()
            assert expect in reply[0], reply
        # the daemon still serves a real job afterwards
        assert_all_ok(run_workers(daemon.endpoint, 2, SMALL, steps=1), 1, 3)
    finally:
        rogue.close()
        ctx.term()
    daemon.stop()
    log = daemon.log_path.read_text()
    assert "bad_header=1" in log and "bad_frames=1" in log and "bad_version=1" in log, log
    assert "dropped=0" in log


# apsd II: asynchronous calls, chunks, global mode and the paper's lowp sum.

def test_async_calls_complete_in_any_order(daemon):
    sizes = [7, 100_000, 1, 4097, 33, 250_000]
    assert_all_ok(run_workers(daemon.endpoint, 4, sizes, steps=3, async_=1, jitter_ms=8),
                  3, len(sizes))


@pytest.mark.parametrize("fmt", ["e4m3", "e3m0", "fp32"])
def test_chunked_tensors_are_exact(daemon_factory, fmt):
    # 4 KiB chunks = 1024 elements: every size below crosses chunk edges differently
    d = daemon_factory(extra=["--chunk_bytes", "4k"])
    sizes = [1, 1023, 1024, 1025, 4097, 100_003]
    assert_all_ok(run_workers(d.endpoint, 3, sizes, steps=2, format=fmt, chunk_elems=1024,
                              async_=1, jitter_ms=5), 2, len(sizes))


CODEC_SIZES = [5, 4096, 70_001, 3_000_000]  # the last is scanned in ranges


@pytest.mark.parametrize("fmt,scaling", [("e4m3", "local"), ("e3m0", "local"),
                                         ("e5m2", "global"), ("fp32", "none")])
def test_codec_threads_give_the_same_codes(daemon_factory, fmt, scaling):
    """codec_threads = 3: the scan and the chunks' encoding in parts on 3 threads;
    every result still bit for bit the worker's own expectation."""
    d = daemon_factory(extra=["--chunk_bytes", "16k"])
    assert_all_ok(run_workers(d.endpoint, 3, CODEC_SIZES, steps=3, format=fmt,
                              scaling=scaling, chunk_elems=4096, codec_threads=3, async_=1,
                              jitter_ms=2), 3, len(CODEC_SIZES))


def test_codec_threads_keep_error_feedback_the_same(daemon_factory):
    """With error feedback each chunk's residual is kept by the thread that encoded it:
    three steps give the same bits on 1 and 3 codec threads."""
    sums = []
    for threads in (1, 3):
        d = daemon_factory(extra=["--chunk_bytes", "16k"])
        results = run_workers(d.endpoint, 3, CODEC_SIZES, steps=3, format="e3m0", ef=1,
                              chunk_elems=4096, codec_threads=threads, unchecked=1)
        assert_all_ok(results, 3, len(CODEC_SIZES))
        sums.append(results[0][1])
    assert sums[0] == sums[1]


@pytest.mark.parametrize("fmt", ["e5m2", "e4m3", "e3m0"])
def test_global_mode_is_identical_on_every_rank_and_never_overflows(daemon, fmt):
    # itest_worker checks each rank's quantization at the shared k for overflow
    sizes = [1, 7, 4097, 100_000]
    assert_all_ok(run_workers(daemon.endpoint, 4, sizes, steps=2, format=fmt, scaling="global",
                              jitter_ms=5), 2, len(sizes))


def test_global_mode_batches_one_exchange_for_many_async_calls(daemon):
    sizes = [7, 100, 1000, 4097, 5000, 20_000]
    assert_all_ok(run_workers(daemon.endpoint, 4, sizes, steps=2, scaling="global", async_=1),
                  2, len(sizes))


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_lowp_sum_reproduces_the_papers_rounded_sum(daemon_factory, world, fmt):
    d = daemon_factory(extra=["--sum", "lowp", "--scaling", "global", "--chunk_bytes", "16k"])
    sizes = [1, 4097, 50_000]
    assert_all_ok(run_workers(d.endpoint, world, sizes, steps=2, format=fmt, scaling="global",
                              lowp=1, chunk_elems=4096, jitter_ms=5), 2, len(sizes))


def test_lowp_daemon_refuses_local_scaling(daemon_factory):
    d = daemon_factory(extra=["--sum", "lowp", "--scaling", "global"])
    out = run_workers(d.endpoint, 1, [7], steps=1, scaling="local", timeout_ms=3000)[0][1]
    assert "APS_EMISMATCH" in out and "sum = lowp" in out, out


def test_lowp_without_global_scaling_is_a_config_error():
    p = subprocess.run([str(APSD), "--sum", "lowp"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "sum = lowp needs scaling = global" in p.stderr, p.stderr


def test_many_calls_in_flight_ask_apsd_about_the_oldest_only(daemon_factory):
    # Before (2026-12-08): every call in flight sent a HEARTBEAT each heartbeat_ms
    # and apsd answered each: 20000 calls waiting for a slower rank sent 20000 a
    # second, the client's I/O thread walked its list of calls for each answer, and
    # the answers passed the bridge's 4096 a peer (an honest rank dropped as a slow
    # reader, or its calls timed out). Now the 32 oldest calls ask.
    import threading
    d = daemon_factory()
    names = [f"t{i}" for i in range(6000)]
    wrong = {}

    def step(c, rank, key, delay=0.0):
        time.sleep(delay)
        xs = [np.full(4, rank + 1.0, np.float32) for _ in names]
        c.allreduce_many_async(list(zip(names, xs))).wait()
        wrong[key] = sum(not np.all(x == 1.5) for x in xs)

    clients = [aps.Client(d.endpoint, r, 2, job="wide", format="fp32", timeout_ms=30000)
               for r in range(2)]
    try:
        for delay in (0.0, 2.5):  # the first step registers; in the second rank 0 waits
            before = d.counter("msgs_in")
            t = threading.Thread(target=step, args=(clients[1], 1, f"1@{delay}", delay))
            t.start()
            step(clients[0], 0, f"0@{delay}")
            t.join(60)
        heartbeats = d.counter("msgs_in") - before - 2 * len(names)  # one push a tensor
    finally:
        for c in clients:
            c.close()
    assert set(wrong.values()) == {0} and len(wrong) == 4, wrong
    # rank 0's 6000 calls waited 2.5 s: 12000 heartbeats before, 32 a second now
    assert heartbeats < 400, heartbeats
    assert d.counter("slow_readers") == 0
