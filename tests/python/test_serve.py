"""The speculative loop of examples/spec_decode.py against `tpdraft serve` through tpdraft.Client:
several clients at once, greedy output token for token the target's and every round's drafts
the in-process library's; sampled output the same draws as in process (so distributed as the
target's, which a chi-square test checks again); both again over a draft vocabulary (`serve
--token-map`, or a speculators checkpoint with its own), as tpdraft.Drafter(token_map=...) drafts.
The server runs in process (`serve --tp 2`), or
under mpirun (`mpirun -np 2 tpdraft serve --tp 2`) when TPDRAFT_SERVE_MPIRUN names the launcher
(CTest's python_serve_mpi)."""

import concurrent.futures
import os
import re
import shlex
import signal
import subprocess
import time

import numpy as np
import pytest

pytest.importorskip("torch", reason="the example's target model needs PyTorch")
import tpdraft  # noqa: E402

from test_spec_decode import (GREEDY, PROMPT, SMALL, SMALL_DFLASH2, DRAFT, DRAFT_VOCABS, Sampling,  # noqa: E402
                              SpeculativeDecoder, assert_drafts_in, chi_square, exact_pair_distribution,
                              init, init_draft_vocab, make_target, open_drafter, sampled_pair_counts,
                              target_decode)

MPIRUN = os.environ.get("TPDRAFT_SERVE_MPIRUN", "")
TIMEOUT = 60.0  # seconds a client call may wait: a server that died fails the test, never hangs it


class Server:
    """`tpdraft serve --tp 2` (or tp) on an ipc socket in the test's own directory, stopped with SIGTERM."""

    def __init__(self, tmp_path, drafter_dir, target_dir, *options, tp=2):
        self.address_file = tmp_path / "server.address"
        self.log = tmp_path / "server.log"
        self.server_key = None  # the public CURVE key its clients take, for a server given keys
        cmd = [os.environ["TPDRAFT_BIN"], "serve", "--drafter", drafter_dir, "--target", target_dir, "--tp", str(tp),
               "--threads", "1", "--backend", "cpu", "--address-file", str(self.address_file), *options]
        if "--listen" not in options:
            cmd += ["--listen", f"ipc://{tmp_path}/s.sock"]
        if MPIRUN:
            cmd = shlex.split(MPIRUN) + ["-np", str(tp)] + cmd
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not (self.address_file.exists() and self.address_file.read_text().strip()):
            assert self.process.poll() is None, f"the server ended:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"no address after 60 s:\n{self.log.read_text()}"
            time.sleep(0.02)
        self.address = self.address_file.read_text().split()[0]

    def client(self):
        return tpdraft.Client(self.address, timeout=TIMEOUT, server_key=self.server_key)

    def stop(self):
        # mpirun ends with a failure status when it is signalled itself, whatever its ranks do:
        # there the server is asked to stop by a request (SIGTERM is checked in process).
        if MPIRUN:
            with self.client() as client:
                client.shutdown()
        else:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"the server did not stop on SIGTERM:\n{self.log.read_text()}")
        assert status == 0, self.log.read_text()
        assert not self.address_file.exists()

    def __enter__(self):
        return self

    def __exit__(self, *error):
        if self.process.poll() is None:
            if error[0] is None:
                self.stop()
            else:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
@pytest.mark.parametrize("tp", [1, 2])
def test_an_engines_requests_through_the_server_decode_as_the_target(tmp_path, checkpoint, config, tp):
    # The engine of test_proposer.py, its Proposer over a Client: 96 requests, 64 at once, in
    # forwards of at most the server's 16 entries; preempted sessions dropped; the proposals of
    # every sixth step checked against a fresh in-process session.
    from test_proposer import JOBS, FreshSessionCheck, assert_the_targets, random_jobs, run_greedy_engine
    drafter_dir, target_dir, caps = init(checkpoint, config)
    target = make_target(caps, target_dir)
    rng = np.random.default_rng(5)
    jobs = random_jobs(caps, rng)
    limits = dict(max_sessions=16, max_open_sessions=JOBS, max_context=128)
    with Server(tmp_path, drafter_dir, target_dir, *[f"--{k.replace('_', '-')}={v}" for k, v in limits.items()],
                tp=tp) as server, server.client() as client, open_drafter(drafter_dir, target_dir, **limits) as local:
        assert client.caps.max_sessions == 16 and client.caps.tp == tp
        check = FreshSessionCheck(target, local)
        got, stats, proposer = run_greedy_engine(target, client, drafter_dir, jobs, rng, True, check)
        assert client.stats()["open_sessions"] == 0
    assert_the_targets(target, caps, jobs, got)
    assert stats.preemptions >= 5 and check.checked >= 150 and proposer.forwards > stats.steps


def in_threads(job, args):
    """job(a) for each of args, each on its own thread at once; returns their results, re-raising a
    failure."""
    with concurrent.futures.ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(job, args))


PROMPTS = [PROMPT, [5, 1, 8, 2], [13, 13, 4, 9, 1, 6, 2, 7]]


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
def test_greedy_loop_through_the_server_is_lossless_and_drafts_as_in_process(tmp_path, checkpoint, config):
    drafter_dir, target_dir, caps = init(checkpoint, config)
    n = 96
    with open_drafter(drafter_dir, target_dir, tp=2) as d:
        local = [SpeculativeDecoder(make_target(caps, target_dir), d, drafter_dir, GREEDY).decode([p], n, None)
                 for p in PROMPTS]
    with Server(tmp_path, drafter_dir, target_dir) as server:

        def one_client(prompt):
            with server.client() as client:
                assert client.caps.tp == 2 and client.caps.block_size == caps.block_size
                assert client.shared_memory
                return SpeculativeDecoder(make_target(caps, target_dir), client, drafter_dir, GREEDY).decode(
                    [prompt], n, None)

        served = in_threads(one_client, PROMPTS)
        with server.client() as client:
            stats = client.stats()
            assert stats["open_sessions"] == 0  # every decode closed its session
            assert stats["steps"] >= len(PROMPTS) and stats["errors"] == 0
    target = make_target(caps, target_dir)
    for prompt, (tokens, rounds), (local_tokens, local_rounds) in zip(PROMPTS, served, local):
        assert tokens[0] == target_decode(target, caps.target_layer_ids, [prompt], n, GREEDY, None)[0]
        assert (tokens, rounds) == (local_tokens, local_rounds)


@pytest.mark.parametrize("config,kind", [(SMALL, None), (SMALL_DFLASH2, None), (SMALL, "map"), (SMALL_DFLASH2, "map"),
                                         (SMALL, "speculators")],
                         ids=["dflash", "dflash2", "dflash-map", "dflash2-map", "speculators"])
def test_sampled_loop_through_the_server_draws_as_in_process(tmp_path, checkpoint, config, kind):
    # With a draft vocabulary (kind): `serve --token-map FILE`, or a speculators checkpoint's own.
    if kind is None:
        drafter_dir, target_dir, caps = init(checkpoint, config)
        token_map, ids = None, range(caps.vocab_size)
    else:
        drafter_dir, target_dir, caps, token_map, ids = init_draft_vocab(tmp_path, checkpoint, config, kind)
    sampling = Sampling(temperature=1.0, top_k=12)
    clients, batches, batch = 2, 2, 512

    def pair_counts(handle, seed):
        decoder = SpeculativeDecoder(make_target(caps, target_dir), handle, drafter_dir, sampling,
                                     DRAFT[caps.architecture])
        return sampled_pair_counts(decoder, seed, batches * batch, batch)[0]

    limits = dict(max_sessions=batch, max_open_sessions=clients * batch, max_context=32)
    with open_drafter(drafter_dir, target_dir, tp=2, token_map=token_map, **limits) as d:
        local = [pair_counts(d, seed) for seed in range(clients)]
    mapped = ["--token-map", token_map] if token_map else []
    with Server(tmp_path, drafter_dir, target_dir, "--max-sessions", str(batch), "--max-open-sessions",
                str(clients * batch), "--max-context", "32", *mapped) as server:

        def one_client(seed):
            with server.client() as client:
                assert client.caps.draft_vocab_size == len(ids)
                return pair_counts(client, seed)

        served = in_threads(one_client, range(clients))
    for mine, theirs in zip(served, local):
        np.testing.assert_array_equal(mine, theirs)
    want = exact_pair_distribution(make_target(caps, target_dir), caps.target_layer_ids, sampling)
    statistic, dof, p = chi_square(sum(served), want)
    assert p > 1e-3, (statistic, dof, p)


def test_a_client_of_a_server_that_is_gone_fails_closed(tmp_path, checkpoint):
    drafter_dir, target_dir, _ = init(checkpoint, "tiny-dflash2.json")
    with Server(tmp_path, drafter_dir, target_dir) as server:
        client = server.client()
        session = client.open_session()
        taps = np.ones((2, client.caps.taps_width), np.float32)
        assert len(client.step([{"session": session, "anchor": 3, "taps": taps}])[0]["tokens"]) == \
            client.caps.block_size - 1
        server.stop()
        with pytest.raises(tpdraft.UnavailableError, match="tpdraft_client_step"):
            client.step([{"session": session, "anchor": 3}])
        with pytest.raises(tpdraft.UnavailableError):
            client.open_session()
        client.close()


def test_curve_keys_admit_a_client_given_the_server_key(tmp_path, checkpoint):
    """A server with --curve-secret-key drafts for a client given its public key (the file or the
    key itself) as for any other; one without the key gets UnavailableError within its timeout."""
    drafter_dir, target_dir, _ = init(checkpoint, "tiny-dflash2.json")
    subprocess.run([os.environ["TPDRAFT_BIN"], "keys", "--out", str(tmp_path / "k")], check=True, capture_output=True)
    public = (tmp_path / "k.public").read_text().strip()
    with Server(tmp_path, drafter_dir, target_dir, "--listen", "tcp://127.0.0.1:*",
                "--curve-secret-key", str(tmp_path / "k.secret")) as server:
        server.server_key = public
        for key in (tmp_path / "k.public", public):
            client = tpdraft.Client(server.address, timeout=TIMEOUT, server_key=key)
            session = client.open_session()
            taps = np.ones((2, client.caps.taps_width), np.float32)
            assert len(client.step([{"session": session, "anchor": 3, "taps": taps}])[0]["tokens"]) == \
                client.caps.block_size - 1
            client.close()
        with pytest.raises(tpdraft.UnavailableError, match="refused the connection's handshake"):
            tpdraft.Client(server.address, timeout=TIMEOUT)
        with pytest.raises(TypeError, match="server_key"):
            tpdraft.Client(server.address, timeout=1.0, server_key=42)
    assert issubclass(tpdraft.BusyError, tpdraft.UnavailableError)


@pytest.mark.parametrize("config,kind", DRAFT_VOCABS)
def test_greedy_loop_over_a_draft_vocabulary_through_the_server_drafts_as_in_process(tmp_path, checkpoint, config,
                                                                                    kind):
    # `serve --token-map FILE` (or a speculators checkpoint's own draft vocabulary): each client's
    # rounds are those of tpdraft.Drafter(token_map=FILE) in process, drafting ids of the map only,
    # and its output the target's own.
    drafter_dir, target_dir, caps, token_map, ids = init_draft_vocab(tmp_path, checkpoint, config, kind)
    n = 64
    with open_drafter(drafter_dir, target_dir, tp=2, token_map=token_map) as d:
        local = [SpeculativeDecoder(make_target(caps, target_dir), d, drafter_dir, GREEDY).decode([p], n, None)
                 for p in PROMPTS]
    with Server(tmp_path, drafter_dir, target_dir, *(["--token-map", token_map] if token_map else [])) as server:

        def one_client(prompt):
            with server.client() as client:
                assert (client.caps.draft_vocab_size, client.caps.vocab_size) == (len(ids), caps.vocab_size)
                return SpeculativeDecoder(make_target(caps, target_dir), client, drafter_dir, GREEDY).decode(
                    [prompt], n, None)

        served = in_threads(one_client, PROMPTS)
    target = make_target(caps, target_dir)
    for prompt, (tokens, rounds), (local_tokens, local_rounds) in zip(PROMPTS, served, local):
        assert tokens[0] == target_decode(target, caps.target_layer_ids, [prompt], n, GREEDY, None)[0]
        assert (tokens, rounds) == (local_tokens, local_rounds)
        assert_drafts_in(rounds, ids)


def test_a_server_refuses_a_token_map_it_cannot_use(tmp_path, checkpoint):
    # A missing map (a usage error, status 2, as every missing FILE of the command line), an id
    # outside the vocabulary, a map over a checkpoint with a draft vocabulary of its own (input
    # errors, status 3): each named, before any address is written.
    drafter_dir, target_dir, _ = init(checkpoint, "tiny-dflash.json")
    speculators_dir, speculators_target, _ = init(checkpoint, "tiny-dflash.json", layout="speculators",
                                                  draft_vocab=50)
    (tmp_path / "far.json").write_text("[1, 2, 300]")
    (tmp_path / "map.json").write_text("[1, 2, 3]")
    cases = [(drafter_dir, target_dir, "missing.json", 2, "--token-map: File does not exist: .*missing.json"),
             (drafter_dir, target_dir, "far.json", 3, r"far.json: entry 2 is the target id 300, outside"),
             (speculators_dir, speculators_target, "map.json", 3, r"a draft vocabulary of its own \(50 tokens\)")]
    for drafter, target, name, status, needle in cases:
        address_file = tmp_path / "server.address"
        out = subprocess.run([os.environ["TPDRAFT_BIN"], "serve", "--drafter", drafter, "--target", target, "--tp", "2",
                              "--threads", "1", "--backend", "cpu", "--listen", f"ipc://{tmp_path}/s.sock",
                              "--address-file", str(address_file), "--token-map", str(tmp_path / name)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == status, out.stderr
        assert re.search(needle, out.stderr), out.stderr
        assert not address_file.exists()
