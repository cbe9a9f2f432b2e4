"""tpdraft across two hosts: the two network namespaces tests/multinode/hosts.sh makes (each with
its own host name, /dev/shm and address, joined by a veth pair, Open MPI's daemons started in them
instead of over ssh). This file runs on the first host (`hosts.sh run`); the second is reached
only through mpirun. Each job is `launch/run-node.sh --hostfile` with 2 ranks per host:

- a draft by one tp-4 group (spanning the hosts) and by two tp-2 replicas (one per host) is the
  single-process tp 4 / tp 2 draft token for token, and every rank reports the node-local rank of
  its host (0 and 1 on each);
- `tpdraft serve` (tp 4, and 2 x tp 2) serves the lossless greedy loop of tests/python to a client
  on the first host over tcp, as the in-process drafter drafts it;
- when every process of the second host is killed mid-draft or mid-serve, the job ends naming
  that host and the client's call fails with UnavailableError instead of hanging;
- launch/scale.sh runs its CPU sweep across the hosts and marks the records.

Each part's wall time goes to stderr (pytest -s shows it)."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.dont_write_bytecode = True
pytest.importorskip("torch", reason="the lossless loop's target model needs PyTorch")
import tpdraft  # noqa: E402
from test_spec_decode import GREEDY, PROMPT, SpeculativeDecoder, make_target, open_drafter, target_decode  # noqa: E402

BIN = os.environ.get("TPDRAFT_BIN", "")
HOSTS_DIR = os.environ.get("TPDRAFT_HOSTS_DIR", "")
if not (BIN and HOSTS_DIR):
    pytest.exit("TPDRAFT_BIN must name tpdraft, and the tests run on the first of two hosts: "
                "tests/multinode/hosts.sh run -- python3 -m pytest ... (CTest's multinode does both)", returncode=2)
FIRST, SECOND = os.environ["TPDRAFT_HOSTS"].split()
HOSTFILE, NET = os.environ["TPDRAFT_HOSTFILE"], os.environ["TPDRAFT_HOSTS_NET"]
HOSTS_SH = os.path.join(HERE, "hosts.sh")
JOB_TIMEOUT = 90  # seconds any one job may take: a job that hangs fails its test instead
CLIENT_TIMEOUT = 5.0  # seconds a client call waits for an answer
# Where each world rank must land with 2 per host: ranks 0, 1 on the first host, 2, 3 on the second.
PLACES = {0: (FIRST, 0), 1: (FIRST, 1), 2: (SECOND, 0), 3: (SECOND, 1)}
TIMES = {}


def note_time(what, seconds):
    TIMES[what] = seconds
    print(f"\n[two hosts] {what}: {seconds:.2f} s", file=sys.stderr)


def multinode(tp, *command):
    return [os.path.join(REPO, "launch", "run-node.sh"), "--hostfile", HOSTFILE, "-n", "2",
            "--tp", str(tp), "--iface", NET, "--bin", BIN, "--", *command]


def veth_bytes():
    """Bytes this host has sent over its end of the veth pair (its only interface but lo)."""
    (name,) = [n for n in os.listdir("/sys/class/net") if n != "lo"]
    with open(f"/sys/class/net/{name}/statistics/tx_bytes") as f:
        return int(f.read())


def placements(log):
    """{world rank: (host, node-local rank)} from the line each rank logs as it starts."""
    found = {}
    for m in re.finditer(r"\[rank (\d+)/4\] \[info\] host (\S+): node-local rank (\d+) of 2,", log):
        rank = int(m.group(1))
        assert rank not in found, f"rank {rank} reported twice:\n{log}"
        found[rank] = (m.group(2), int(m.group(3)))
    return found


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    out = tmp_path_factory.mktemp("ck")
    subprocess.run([BIN, "init", "--config", os.path.join(REPO, "configs", "tiny-dflash2.json"), "--seed", "5",
                    "--taps", "20", "--out", str(out)], check=True, capture_output=True, timeout=60)
    with open_drafter(str(out / "drafter"), str(out / "target")) as d:
        caps = d.caps
    return {"drafter": str(out / "drafter"), "target": str(out / "target"), "taps": str(out / "taps.safetensors"),
            "caps": caps}


class Job:
    """A run-node.sh --hostfile job in the background, its output in a log of the test's directory;
    killed (its process group) if the test leaves it running."""

    def __init__(self, tmp_path, tp, *command):
        self.log = tmp_path / "job.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(multinode(tp, *command), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def text(self):
        return self.log.read_text()

    def wait_for(self, ready, what):
        deadline = time.monotonic() + JOB_TIMEOUT
        while not ready():
            assert self.process.poll() is None, f"the job ended before {what}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {what} after {JOB_TIMEOUT} s:\n{self.text()}"
            time.sleep(0.02)

    def wait(self):
        try:
            return self.process.wait(JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end within {JOB_TIMEOUT} s:\n{self.text()}")

    def __enter__(self):
        return self

    def __exit__(self, *error):
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()


def names_the_lost_host(log):
    """Whether the job's end names the second host (besides the start-up lines of its ranks)."""
    return any(SECOND in line and "node-local rank" not in line for line in log.splitlines())


def kill_second_host():
    subprocess.run(["bash", HOSTS_SH, "kill", HOSTS_DIR, SECOND], check=True, timeout=30)
    return time.monotonic()


@pytest.mark.parametrize("tp", [4, 2])
def test_a_draft_across_two_hosts_is_the_single_process_draft(ck, tp):
    args = ["draft", "--drafter", ck["drafter"], "--target", ck["target"], "--taps", ck["taps"], "--anchor", "3",
            "--threads", "1", "--backend", "cpu"]
    want = json.loads(subprocess.run([BIN, *args, "--tp", str(tp)], check=True, capture_output=True, text=True,
                                     timeout=JOB_TIMEOUT).stdout)
    sent = veth_bytes()
    start = time.monotonic()
    out = subprocess.run(multinode(tp, *args), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    note_time(f"draft, {'one tp-4 group' if tp == 4 else 'two tp-2 replicas'}", time.monotonic() - start)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert (got["tokens"], got["tp"]) == (want["tokens"], tp)
    assert placements(out.stderr) == PLACES, out.stderr
    print(f"[two hosts] node-local ranks: {placements(out.stderr)}", file=sys.stderr)
    if tp == 2:  # the second replica, wholly on the second host, drafted the same block
        m = re.search(r"\[rank 2/4\] \[info\] replica 1 of 2 drafted tokens (\[.*\])", out.stderr)
        assert m and json.loads(m.group(1)) == want["tokens"], out.stderr
    assert veth_bytes() > sent  # the hosts talked over their link


class Served(Job):
    """run-node.sh --hostfile ... serve on tcp, every replica on a port of its own; the address file
    holds one address per replica."""

    def __init__(self, tmp_path, ck, tp):
        self.address_file = tmp_path / "served.address"
        super().__init__(tmp_path, tp, "serve", "--drafter", ck["drafter"], "--target", ck["target"],
                         "--listen", "tcp://*:*", "--address-file", str(self.address_file), "--threads", "1",
                         "--backend", "cpu")
        replicas = 4 // tp
        self.wait_for(lambda: self.address_file.exists() and
                      len(self.address_file.read_text().split()) == replicas, "address file")
        self.addresses = self.address_file.read_text().split()

    def stop(self):
        for address in self.addresses:
            with tpdraft.Client(address, timeout=CLIENT_TIMEOUT) as client:
                client.shutdown()
        assert self.wait() == 0, self.text()
        assert not self.address_file.exists()


@pytest.mark.parametrize("tp", [4, 2])
def test_serving_across_two_hosts_gives_the_lossless_loop_its_in_process_drafts(tmp_path, ck, tp):
    caps, n = ck["caps"], 48
    with open_drafter(ck["drafter"], ck["target"], tp=tp) as d:
        local = SpeculativeDecoder(make_target(caps, ck["target"]), d, ck["drafter"], GREEDY).decode([PROMPT], n, None)
    reference = target_decode(make_target(caps, ck["target"]), caps.target_layer_ids, [PROMPT], n, GREEDY, None)[0]
    start = time.monotonic()
    with Served(tmp_path, ck, tp) as job:
        started = time.monotonic()
        # Each replica's leader names its own host: tp 4 has one, on the first host; 2 x tp 2 one per host.
        assert [a.rsplit(":", 1)[0] for a in job.addresses] == [f"tcp://{h}" for h in [FIRST, SECOND][:4 // tp]]
        for address in job.addresses:
            with tpdraft.Client(address, timeout=CLIENT_TIMEOUT) as client:
                assert client.caps.tp == tp and not client.shared_memory
                tokens, rounds = SpeculativeDecoder(make_target(caps, ck["target"]), client, ck["drafter"],
                                                    GREEDY).decode([PROMPT], n, None)
            assert tokens[0] == reference
            assert (tokens, rounds) == local
        served = time.monotonic()
        job.stop()
        assert placements(job.text()) == PLACES, job.text()
    kind = "tp 4" if tp == 4 else "2 x tp 2"
    note_time(f"serve {kind}: start to address file", started - start)
    note_time(f"serve {kind}: lossless loop of {n} tokens per replica", served - started)
    note_time(f"serve {kind}: shutdown to job end", time.monotonic() - served)


def test_a_host_killed_mid_draft_ends_the_job_naming_it(tmp_path, ck):
    with Job(tmp_path, 4, "bench", "--drafter", ck["drafter"], "--target", ck["target"], "--ctx", "16",
             "--repeat", "100000000", "--warmup", "0", "--threads", "1", "--backend", "cpu") as job:
        job.wait_for(lambda: len(placements(job.text())) == 4, "rank start-up")
        sent = veth_bytes()
        job.wait_for(lambda: veth_bytes() - sent > 1 << 20, "drafts")  # a MiB of collectives: drafting
        killed = kill_second_host()
        status = job.wait()
        note_time("draft: second host killed to job end", time.monotonic() - killed)
    assert status != 0
    assert names_the_lost_host(job.text()), job.text()
    print(f"[two hosts] after the kill mid-draft, status {status}:\n{job.text()[-1500:]}", file=sys.stderr)


@pytest.mark.parametrize("tp", [4, 2])
def test_a_host_killed_mid_serve_fails_the_clients_and_ends_the_job(tmp_path, ck, tp):
    with Served(tmp_path, ck, tp) as job:
        taps = np.ones((2, ck["caps"].taps_width), np.float32)
        failures, stepping = [], threading.Barrier(len(job.addresses) + 1)

        def step_until_it_fails(address):
            with tpdraft.Client(address, timeout=CLIENT_TIMEOUT) as client:
                session = client.open_session()
                client.step([{"session": session, "anchor": 3, "taps": taps}])
                stepping.wait()
                while True:
                    try:
                        client.step([{"session": session, "anchor": 3}])
                    except tpdraft.UnavailableError as e:
                        failures.append((time.monotonic(), str(e)))
                        return

        clients = [threading.Thread(target=step_until_it_fails, args=(a,)) for a in job.addresses]
        for c in clients:
            c.start()
        stepping.wait(JOB_TIMEOUT)
        killed = kill_second_host()
        status = job.wait()
        ended = time.monotonic()
        for c in clients:
            c.join(JOB_TIMEOUT)
            assert not c.is_alive(), "a client still waits on a server that is gone"
    assert status != 0
    assert len(failures) == len(job.addresses), failures
    assert names_the_lost_host(job.text()), job.text()
    kind = "tp 4" if tp == 4 else "2 x tp 2"
    note_time(f"serve {kind}: second host killed to job end", ended - killed)
    note_time(f"serve {kind}: second host killed to the last client's UnavailableError",
              max(t for t, _ in failures) - killed)


def test_the_scaling_sweep_runs_across_the_two_hosts(tmp_path):
    out, note = tmp_path / "scaling", "2 hosts, one machine"
    sent = veth_bytes()
    start = time.monotonic()
    run = subprocess.run([os.path.join(REPO, "launch", "scale.sh"), "--out", str(out), "--hostfile", HOSTFILE,
                          "--note", note, "--configs", os.path.join(REPO, "configs", "tiny-dflash2.json"),
                          "--tp", "1,2,4", "--ctx", "16", "--no-weak", "--vocab", "none", "--repeat", "3",
                          "--warmup", "1", "--no-plots", "--bin", BIN], capture_output=True, text=True,
                         timeout=2 * JOB_TIMEOUT)
    note_time("scale.sh across the hosts, tp 1, 2, 4", time.monotonic() - start)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["tp"] for r in records) == [1, 2, 4]
    for r in records:
        assert (r["hosts"], r["note"]) == (2, note)
        assert r["launcher"] == ("single" if r["tp"] == 1 else "mpirun")
    assert veth_bytes() > sent
    assert f"({note}*)" in (out / "scaling.md").read_text()
