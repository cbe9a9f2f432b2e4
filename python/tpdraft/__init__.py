"""tpdraft: DFlash / DFlash 2 drafters for speculative decoding, over tpdraft's C library.

Drafter (in process) and Client (a drafter served by `tpdraft serve`) take each step's taps as
numpy arrays or any tensor speaking DLPack or the CUDA array interface; Proposer keeps the
sessions of an engine's requests. The compiled part is tpdraft._core, built for one interpreter.
"""

import sys as _sys

from . import _build_info


def _interpreter(implementation, version):
    return f"{implementation} {version[0]}.{version[1]}"


_here = (_sys.implementation.name, tuple(_sys.version_info[:2]))
if _here != (_build_info.implementation, tuple(_build_info.version)):
    raise ImportError(
        f"tpdraft's compiled module was built for {_interpreter(_build_info.implementation, _build_info.version)} "
        f"({_build_info.executable}), but this is {_interpreter(*_here)} ({_sys.executable}): build tpdraft "
        "with this interpreter (pip install . run by it, or CMake with -DTPDRAFT_PYTHON3=its path)")

from ._core import *  # noqa: E402,F401,F403
from ._core import __version__  # noqa: E402,F401
from . import _core  # noqa: E402

# The classes say they are tpdraft's, as the user imports them.
for _name in dir(_core):
    _item = getattr(_core, _name)
    if isinstance(_item, type) and _item.__module__ == _core.__name__:
        _item.__module__ = __name__

built_for = f"{_interpreter(_build_info.implementation, _build_info.version)} ({_build_info.executable})"

from .proposer import Proposal, Proposer, Request  # noqa: E402,F401
