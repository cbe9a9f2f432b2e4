"""Fixtures of the Python module's tests: the built module on the path, and random checkpoints
made by `tpdraft init` in each test's own temporary directory."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True


def _bin():
    path = os.environ.get("TPDRAFT_BIN")
    if not path:
        pytest.exit("TPDRAFT_BIN must name the built tpdraft program (CTest sets it)", returncode=2)
    return path


@pytest.fixture
def checkpoint(tmp_path):
    """make(config_name, taps=N) -> directory with drafter/, target/ and taps.safetensors."""

    def make(config="tiny-dflash2.json", taps=0, extra=()):
        out = tmp_path / config.replace(".json", "")
        cmd = [_bin(), "init", "--config", os.path.join(REPO, "configs", config), "--out", str(out), "--seed", "3"]
        if taps:
            cmd += ["--taps", str(taps)]
        subprocess.run(cmd + list(extra), check=True, capture_output=True)
        return out

    return make
