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
    """make(config, taps=N, seed=S, layout=L, draft_vocab=N, target_embedding=B) -> directory with
    drafter/, target/ and taps.safetensors; config names a file of configs/ or is a dict, written
    beside the checkpoint. layout "speculators" writes the speculators format (with draft_vocab:
    its own reduced head and d2t map; with target_embedding: no embedding of its own), into a
    directory of its own beside the default layout's."""

    def make(config="tiny-dflash2.json", taps=0, seed=3, layout=None, draft_vocab=0, target_embedding=False):
        if isinstance(config, dict):
            path, out = tmp_path / "config.json", tmp_path / "checkpoint"
            path.write_text(json.dumps(config))
        else:
            path, out = os.path.join(REPO, "configs", config), tmp_path / config.replace(".json", "")
        cmd = [_bin(), "init", "--config", str(path), "--seed", str(seed)]
        if taps:
            cmd += ["--taps", str(taps)]
        if layout:
            cmd += ["--layout", layout]
            out = out.with_name(out.name + "-" + layout)
        if draft_vocab:
            cmd += ["--draft-vocab", str(draft_vocab)]
            out = out.with_name(out.name + f"-{draft_vocab}")
        if target_embedding:
            cmd += ["--target-embedding"]
            out = out.with_name(out.name + "-target-embedding")
        subprocess.run(cmd + ["--out", str(out)], check=True, capture_output=True)
        return out

    return make
