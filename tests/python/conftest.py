"""Fixtures of the Python module's tests: the built module on the path, and random checkpoints
made by `tpdraft init` in each test's own temporary directory."""

import json
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
    """make(config, taps=N, seed=S) -> directory with drafter/, target/ and taps.safetensors; config
    names a file of configs/ or is a dict, written beside the checkpoint."""

    def make(config="tiny-dflash2.json", taps=0, seed=3):
        if isinstance(config, dict):
            path, out = tmp_path / "config.json", tmp_path / "checkpoint"
            path.write_text(json.dumps(config))
        else:
            path, out = os.path.join(REPO, "configs", config), tmp_path / config.replace(".json", "")
        cmd = [_bin(), "init", "--config", str(path), "--out", str(out), "--seed", str(seed)]
        if taps:
            cmd += ["--taps", str(taps)]
        subprocess.run(cmd, check=True, capture_output=True)
        return out

    return make
