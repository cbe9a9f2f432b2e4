"""The served drafter of the Python benchmarks: a random checkpoint made by `tpdraft init` (serve_overhead.py,
serve_mpi.py, python_overhead.py), and `tpdraft serve` on it, optionally under a launcher (mpirun),
stopped with SIGTERM or killed with its process group."""

import os
import signal
import subprocess
import sys
import time

QUIET = dict(os.environ, TPDRAFT_LOG_LEVEL="warn")


def checkpoint(binary, config, out):
    """A random checkpoint of `config` written by `binary init` to out."""
    subprocess.run([binary, "init", "--config", config, "--out", out], check=True, capture_output=True, env=QUIET)


class Server:
    """`binary serve` of the checkpoint ck on `listen` (its log and address file named by `stem`) on
    one CPU thread, with more serve options in `args`."""

    def __init__(self, binary, ck, listen, stem, args=(), launcher=()):
        self.address_file = stem + ".address"
        self.log = open(stem + ".log", "w")
        cmd = [*launcher, os.path.abspath(binary), "serve", "--drafter", ck + "/drafter", "--target", ck + "/target",
               "--listen", listen, "--address-file", self.address_file, "--backend", "cpu", "--threads", "1", *args]
        # Its own process group, so that a server which does not stop is killed with its ranks.
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env=QUIET)
        deadline = time.monotonic() + 120
        while not (os.path.exists(self.address_file) and open(self.address_file).read().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                sys.exit(f"the server did not start: see {self.log.name}:\n{open(self.log.name).read()}")
            time.sleep(0.02)
        self.address = open(self.address_file).read().split()[0]

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)  # mpirun returns once its ranks have
        except subprocess.TimeoutExpired:
            print(f"warning: the server did not stop on SIGTERM; killed (log {self.log.name})", file=sys.stderr)
            self.kill()
        self.log.close()
