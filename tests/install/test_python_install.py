"""The Python package as users install it, run from outside the tree: `pip install
--no-build-isolation --no-index .` from a fresh copy of the repository into a venv with the system's
site packages, and `cmake --install` of a build folder into a temp prefix. Each drafts, from another
directory, what the build folder's module drafts, with the library it installed; a package built
for another interpreter names the one it was built for. Usage (CTest): pytest this file with
TPDRAFT_BUILD=the build folder (its tpdraft program makes the checkpoint)."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("TPDRAFT_BUILD", "")

# Run from another directory by the installed package: where it and its library were loaded
# from, and one greedy draft.
PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tpdraft
    ck = sys.argv[1]
    with tpdraft.Drafter(ck + "/drafter", ck + "/target", backend="cpu", threads=1) as d:
        s = d.open_session()
        taps = np.random.default_rng(5).standard_normal((6, d.caps.taps_width)).astype(np.float32)
        tokens = d.step([{"session": s, "anchor": 2, "taps": taps}])[0]["tokens"].tolist()
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libtpdraft.so" in line})
    print(json.dumps({"module": tpdraft.__file__, "libs": libs, "tokens": tokens, "built_for": tpdraft.built_for}))
""")


def probe(python, ck, cwd, env=None):
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    environment.update(env or {})
    out = subprocess.run([python, "-c", PROBE, str(ck)], cwd=cwd, env=environment, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    if not BUILD:
        pytest.exit("TPDRAFT_BUILD must name the build folder (CTest sets it)", returncode=2)
    return tmp_path_factory.mktemp("install")


@pytest.fixture(scope="module")
def reference(work):
    ck = work / "ck"
    subprocess.run([os.path.join(BUILD, "tpdraft"), "init", "--config", os.path.join(REPO, "configs", "tiny-dflash2.json"),
                    "--out", str(ck)], check=True, capture_output=True)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    return ck, elsewhere, probe(sys.executable, ck, elsewhere, {"PYTHONPATH": os.path.join(BUILD, "python")})


def test_pip_install_from_a_fresh_copy(work, reference):
    ck, elsewhere, expected = reference
    # The working tree as it stands (tracked and new files alike), not the last commit.
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    source = work / "source"
    for name in filter(None, files):
        if os.path.isfile(os.path.join(REPO, name)):
            os.makedirs(source / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), source / name)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # CPU only, as the C library's own tests here: the package's build, not the CUDA kernels', is tested.
    env = dict(os.environ, CMAKE_ARGS="-DTPDRAFT_CUDA=OFF -DTPDRAFT_MPI=OFF",
               CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    out = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "."], cwd=source,
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    shutil.rmtree(source)  # nothing of the copy may be needed any more
    got = probe(python, ck, elsewhere)
    package = os.path.dirname(got["module"])
    assert package.startswith(str(venv / "lib")) and package.endswith("site-packages/tpdraft")
    assert got["libs"] == [os.path.join(package, "libtpdraft.so.0.3")]  # its own copy, found beside it
    assert got["tokens"] == expected["tokens"]
    assert {"__init__.py", "_core.pyi", "proposer.py", "py.typed"} <= set(os.listdir(package))
    # Built for another interpreter: the import names the one it was built for.
    info = os.path.join(package, "_build_info.py")
    with open(info) as f:
        text = f.read()
    edited = re.sub(r"^version = \(\d+, \d+\)$", "version = (3, 99)", text, flags=re.M)
    assert edited != text, text
    with open(info, "w") as f:
        f.write(edited)
    # pip compiled the file at install: the same size and, on a fast machine, the same mtime second
    # would let Python trust that byte code over the edit.
    shutil.rmtree(os.path.join(package, "__pycache__"), ignore_errors=True)
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    failed = subprocess.run([python, "-c", "import tpdraft"], cwd=elsewhere, env=environment, capture_output=True,
                            text=True)
    assert failed.returncode != 0
    assert f"built for {sys.implementation.name} 3.99 (" in failed.stderr and "but this is " in failed.stderr


def test_cmake_install_into_a_prefix(work, reference):
    ck, elsewhere, expected = reference
    prefix = work / "prefix"
    cmake = os.environ.get("CMAKE", "cmake")
    subprocess.run([cmake, "--install", BUILD, "--prefix", str(prefix)], check=True, capture_output=True)
    site = subprocess.run([cmake, "-L", "-N", BUILD], check=True, capture_output=True, text=True).stdout
    site = next(line.split("=", 1)[1] for line in site.splitlines() if line.startswith("TPDRAFT_PYTHON_SITE_DIR:"))
    got = probe(sys.executable, ck, elsewhere, {"PYTHONPATH": str(prefix / site)})
    assert got["module"] == str(prefix / site / "tpdraft" / "__init__.py")
    # The installed library, found through the extension's run path, not the build folder's.
    assert len(got["libs"]) == 1 and got["libs"][0].startswith(str(prefix / "lib"))
    assert got["tokens"] == expected["tokens"] and got["built_for"] == expected["built_for"]
