#!/usr/bin/env python3
"""What a buggy or hostile engine does to tpdraft through each of its entry points, judged by what
came back.

Usage: sweep.py BUILD_DIR [--list] [--jobs N] [--only TEXT] [--verbose]

BUILD_DIR is a build folder: its tpdraft program, libtpdraft.so and python/ (the module). Every
case runs over one small checkpoint that `tpdraft init` makes in a temporary directory:

  C ABI         libtpdraft.so through ctypes, the structs laid out as include/tpdraft/tpdraft.h
                declares them: NULL for each pointer, counts of 0, past max_sessions or huge,
                wrong struct sizes, options out of range, sessions never opened, closed or
                another handle's, entries out of range, NaN / Inf / huge taps, bad sampling, a
                double close; then the tpdraft_client_* calls against a running `tpdraft serve`
  Python        tpdraft.Drafter and tpdraft.Client given taps of every wrong type and shape,
                misspelt keys, a wrong type for each field and option, closed handles, a close
                from another thread while a step runs
  serve frames  raw frames on a ZeroMQ DEALER socket, laid out as src/serve/protocol.h and
                protocol.cpp say (the protocol version read from there too): short frames, other
                magics and versions, unknown kinds, several frames, trailing bytes, truncated
                entries, every entry field at its extremes, another client's sessions
  rings         HELLOs naming shared memory that is no client's ring (another name, mode, owner,
                a symlink, a FIFO, too small), ring requests and reply areas outside the ring,
                taps in the control block, a ring unlinked or shrunk after HELLO

Each case runs in a process of its own (forked from one that has imported what the cases need),
with a time limit. The cases against a server share one server per entry point, which must still
be alive and answer after each case (a server that died is started again for the next) and end
as docs/protocol.md says after the last. A case ends as one of:

  clear error   refused with the right status or exception and a message naming what is wrong
                (the argument, field, entry, session or limit)
  control ok    a case that must succeed did, with the reference run's result (a good step after
                bad ones drafts what a fresh handle drafts)
  unclear       refused, but with another status or exception, or a message naming nothing
  crash         the process under test (the case's, or the server) killed by a signal, a
                sanitizer report, an uncaught exception, an abnormal exit
  hang          no answer within the time limit
  silent wrong  accepted when it should have been refused, or a result unlike the reference's
                (a good request refused among them)

A ring request whose reply area is not in the ring cannot be answered there: the server's log
line naming the client stands for its error message, and without one the case hung.

Prints a table per entry point, then every case that was neither a clear error nor a passed
control with what happened (--verbose: every case); exits 1 when a case crashed, hung or was
silently wrong. --list lists the cases, --only TEXT runs those whose name holds TEXT.
"""

import concurrent.futures
import ctypes
import json
import mmap
import os
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True

CASE_LIMIT_S = 150  # one case's process, in the sanitizer build too; past it the case hung
REPLY_S = 20        # the longest a case waits for one reply (and the clients' timeout)
QUIET_S = 1.5       # how long a case waits to see that no reply comes where none may
CRASH_WORDS = ("AddressSanitizer", "runtime error:", "LeakSanitizer", "terminate called", "Segmentation fault",
               "core dumped", "std::bad_alloc", "Aborted", "Bus error", "Fatal Python error", "double free",
               "free(): ", "malloc(): ", "stack smashing")
KINDS = ["clear error", "control ok", "unclear", "crash", "hang", "silent wrong"]
FAILING = ("crash", "hang", "silent wrong", "sweep error")
GROUPS = ["C ABI", "Python", "serve frames", "rings"]

I64_MAX, I64_MIN, U64_MAX, U32_MAX = 2 ** 63 - 1, -2 ** 63, 2 ** 64 - 1, 2 ** 32 - 1
NAN, INF = float("nan"), float("inf")

# The reference request: a fresh session, REF_ROWS tap rows drawn from REF_SEED, anchor REF_ANCHOR,
# greedy. Its drafts (and a sampled one's) come from a fresh in-process handle at the start.
REF_ROWS, REF_SEED, REF_ANCHOR = 5, 7, 3
REF_TEMPERATURE, REF_SAMPLE_SEED = 0.8, 11


def strip_comments(text):
    return re.sub(r"//[^\n]*", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


# ---- the C ABI, laid out from the header --------------------------------------------------------

class Abi:
    """libtpdraft.so with every function's argument and result types and every struct of
    include/tpdraft/tpdraft.h, read from the header itself, so that a field added there is here
    too. Pointers are c_void_p (const char* is c_char_p)."""

    SCALARS = {"uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
               "uint64_t": ctypes.c_uint64, "double": ctypes.c_double, "float": ctypes.c_float,
               "size_t": ctypes.c_size_t, "int": ctypes.c_int, "void": None}

    def __init__(self, header, library):
        text = strip_comments(open(header).read())
        self.types = dict(self.SCALARS)
        for name in re.findall(r"typedef\s+enum\s+\w+\s*\{[^}]*\}\s*(\w+)\s*;", text):
            self.types[name] = ctypes.c_int
        for name in re.findall(r"typedef\s+[\w\s*]+\(\s*\*\s*(\w+)\s*\)\s*\(", text):  # function pointers
            self.types[name] = ctypes.c_void_p
        for base, name in re.findall(r"typedef\s+(\w+)\s+(\w+)\s*;", text):
            if base in self.types:
                self.types[name] = self.types[base]
        for name, body in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*\1\s*;", text, re.S):
            fields = []
            for decl in filter(None, (" ".join(d.split()) for d in body.split(";"))):
                type_text, field = re.match(r"(.*?)(\w+)$", decl).groups()
                fields.append((field, self.ctype(type_text)))
            self.types[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
            setattr(self, name, self.types[name])
        self.lib = ctypes.CDLL(library)
        for ret, name, params in re.findall(r"TPDRAFT_API\s+([\w\s*]+?)\s*\b(tpdraft_\w+)\s*\(([^)]*)\)\s*;", text):
            f = getattr(self.lib, name)
            f.restype = self.ctype(ret)
            decls = [" ".join(p.split()) for p in params.split(",")]
            f.argtypes = [self.ctype(re.match(r"(.*?)\w+$", d).group(1)) for d in decls if d and d != "void"]

    def ctype(self, text):
        t = " ".join(text.replace("const", " ").split())
        if "*" in t:
            return ctypes.c_char_p if t.replace(" ", "") == "char*" else ctypes.c_void_p
        if t not in self.types:
            raise ValueError(f"include/tpdraft/tpdraft.h: no ctypes type for '{text}'")
        return self.types[t]


# ---- the serve protocol, laid out from its sources ----------------------------------------------

class Protocol:
    """The wire format of src/serve/protocol.h and protocol.cpp (docs/protocol.md): constants,
    request kinds, statuses, the header's and a STEP entry's fields in wire order, and the ring's
    control block of src/serve/ring.h. The bodies that are not a struct there (HELLO, the STEP
    reply) follow docs/protocol.md's tables."""

    FORMATS = {"int64_t": "q", "uint64_t": "Q", "uint32_t": "I", "uint16_t": "H", "double": "d", "float": "f"}

    def __init__(self, repo):
        h = strip_comments(open(os.path.join(repo, "src", "serve", "protocol.h")).read())
        cpp = strip_comments(open(os.path.join(repo, "src", "serve", "protocol.cpp")).read())
        ring = strip_comments(open(os.path.join(repo, "src", "serve", "ring.h")).read())
        self.constants = {}
        for text in (h, ring):
            for name, value in re.findall(r"\b(k\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\b", text):
                self.constants.setdefault(name, int(value, 0))
        c = self.constants
        self.magic, self.version = c["kMagic"], c["kProtocolVersion"]
        self.header_bytes, self.entry_bytes, self.reply_flag = c["kHeaderBytes"], c["kEntryBytes"], c["kReply"]
        self.kinds = self.enum(h, "Kind")
        self.statuses = self.enum(h, "WireStatus")
        self.status_names = {v: k for k, v in self.statuses.items()}
        self.where = self.enum(h, "TapsWhere")
        self.header = self.layout(h, cpp, "Header", "header_fields", "h")
        self.entry = self.layout(h, cpp, "WireEntry", "entry_fields", "e")
        body = re.search(r"void\s+caps_numbers\s*\([^)]*\)\s*\{(.*?)\n\}", cpp, re.S).group(1)
        self.caps_numbers = len(re.findall(r"\bf\(c\.\w+", body))
        self.ring_prefix = re.search(r'kRingNamePrefix\s*=\s*"([^"]+)"', ring).group(1)
        self.ring_control_bytes = c["kRingControlBytes"]
        self.control = {}  # RingControl field -> (format, offset)
        at = 0
        for name, fmt, _ in self.struct_fields(ring, "RingControl"):
            size = struct.calcsize(fmt)
            at = (at + size - 1) // size * size
            self.control[name] = (fmt, at)
            at += size
        for what, fields, size in (("header", self.header, self.header_bytes), ("entry", self.entry, self.entry_bytes)):
            got = struct.calcsize("<" + "".join(f for _, f, _ in fields))
            if got != size:
                raise ValueError(f"src/serve: the {what} fields read from the sources take {got} bytes, not {size}")

    @staticmethod
    def enum(text, name):
        body = re.search(r"enum\s+" + name + r"\b[^{]*\{(.*?)\}", text, re.S).group(1)
        return {k.lower(): int(v, 0) for k, v in re.findall(r"\bk(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)", body)}

    def struct_fields(self, text, name):
        body = re.search(r"struct\s+" + name + r"\s*\{(.*?)\};", text, re.S).group(1)
        out = []
        for decl in body.split(";"):
            m = re.match(r"\s*(u?int\d+_t|double|float)\s+(.*)", decl, re.S)
            if not m:
                continue
            for d in m.group(2).split(","):
                field, _, default = (s.strip() for s in d.partition("="))
                out.append((field, self.FORMATS[m.group(1)], self.value(default)))
        return out

    def value(self, text):
        if not text:
            return 0
        if text in self.constants:
            return self.constants[text]
        try:
            return int(text, 0)
        except ValueError:
            return float(text)

    def layout(self, h, cpp, struct_name, walker, var):
        fields = {n: (f, d) for n, f, d in self.struct_fields(h, struct_name)}
        body = re.search(r"void\s+" + walker + r"\s*\([^)]*\)\s*\{(.*?)\n\}", cpp, re.S).group(1)
        return [(n, fields[n][0], fields[n][1]) for n in re.findall(r"\bf\(" + var + r"\.(\w+)", body)]

    def pack(self, fields, values):
        return b"".join(struct.pack("<" + f, values.get(n, d)) for n, f, d in fields)

    def unpack(self, fields, data):
        out, at = {}, 0
        for n, f, _ in fields:
            out[n] = struct.unpack_from("<" + f, data, at)[0]
            at += struct.calcsize(f)
        return out

    def kind(self, k):
        return self.kinds[k] if isinstance(k, str) else k


class Reply:
    """A reply frame: its header's fields, its status by name, its body, and an error's message."""

    def __init__(self, proto, data):
        self.data = data
        self.h = proto.unpack(proto.header, data) if len(data) >= proto.header_bytes else {}
        self.status = self.h.get("status", -1)
        self.status_name = proto.status_names.get(self.status, f"status {self.status}")
        self.body = data[proto.header_bytes:]
        self.message = ""
        if self.status != 0 and len(self.body) >= 4:
            n = struct.unpack_from("<I", self.body)[0]
            self.message = self.body[4:4 + n].decode(errors="replace")


def read_str(data, at):
    """The protocol's string (u32 length, bytes) at `at`, and the offset after it."""
    n = struct.unpack_from("<I", data, at)[0]
    return data[at + 4:at + 4 + n].decode(errors="replace"), at + 4 + n


# ---- what a case works with ---------------------------------------------------------------------

class Harness(Exception):
    """The sweep itself could not set a case up: neither the library's fault nor its credit."""


class Entry:
    """A tpdraft_step_entry with the buffers it points to, kept alive with it."""

    def __init__(self, c, tokens, q, keep):
        self.c, self.tokens, self.q, self.keep = c, tokens, q, keep


class Wire:
    """The protocol's layouts and a ZeroMQ context, each made on first use (a case that needs
    neither never imports zmq); the class using it sets _proto and _zctx to None."""

    @property
    def proto(self):
        if self._proto is None:
            self._proto = Protocol(REPO)
        return self._proto

    @property
    def zctx(self):
        if self._zctx is None:
            import zmq
            self._zctx = zmq.Context()
        return self._zctx


class X(Wire):
    """A case's world: paths, the reference drafts, and lazily the C ABI, the Python module,
    the protocol and ZeroMQ."""

    def __init__(self, spec):
        self.spec = spec
        self.build, self.ck, self.tmp = spec["build"], spec["ck"], spec.get("tmp", "")
        self.address, self.log = spec.get("address", ""), spec.get("log", "")
        self.server_pid = spec.get("server_pid", 0)
        # Every shared-memory object a case makes has this in its name: the sweep removes what a
        # case killed mid-way left behind.
        self.shm_tag = spec.get("shm_tag", "tpdraft-hostile")
        ref = spec.get("ref") or {}
        self.ref = ref
        self.W, self.B, self.V = ref.get("W", 0), ref.get("B", 0), ref.get("V", 0)
        self.rows = self.B - 1
        self.dd = os.path.join(self.ck, "drafter").encode()
        self.td = os.path.join(self.ck, "target").encode()
        self._abi = self._proto = self._zctx = self._tpdraft = None
        self.closers, self.open_clients = [], []
        self.closers.append(lambda: [self.lib.tpdraft_client_close(h) for h in self.open_clients])

    # -- lazily loaded
    @property
    def abi(self):
        if self._abi is None:
            self._abi = Abi(os.path.join(REPO, "include", "tpdraft", "tpdraft.h"),
                            os.path.join(self.build, "libtpdraft.so"))
        return self._abi

    @property
    def lib(self):
        return self.abi.lib

    @property
    def np(self):
        import numpy
        return numpy

    @property
    def tpdraft(self):
        if self._tpdraft is None:
            sys.path.insert(0, os.path.join(self.build, "python"))
            import tpdraft
            self._tpdraft = tpdraft
        return self._tpdraft

    def taps(self, n=REF_ROWS, seed=REF_SEED):
        rng = self.np.random.default_rng(seed)
        return (rng.standard_normal((n, self.W)) * 0.5).astype(self.np.float32)

    def poisoned(self, value, row=1, col=7, n=REF_ROWS, dtype=None, raw=None):
        """The reference taps with one value changed (as dtype: float32, float16, or bf16 bits
        given as uint16 `raw`)."""
        np = self.np
        t = self.taps(n)
        if raw is not None:
            bits = (t.view(np.uint32) >> 16).astype(np.uint16)
            bits[row, col] = raw
            return bits
        t = t.astype(dtype or np.float32)
        t[row, col] = value
        return t

    # -- the C ABI
    def err(self):
        return self.lib.tpdraft_last_error().decode(errors="replace")

    def status_name(self, st):
        return self.lib.tpdraft_status_name(st).decode()

    def options(self, **fields):
        o = self.abi.tpdraft_options()
        self.lib.tpdraft_options_init(ctypes.byref(o))
        o.threads = 1  # the reference's: results equal bit for bit
        for k, v in fields.items():
            setattr(o, k, v)
        return o

    def client_options(self, **fields):
        o = self.abi.tpdraft_client_options()
        self.lib.tpdraft_client_options_init(ctypes.byref(o))
        o.timeout_seconds = REPLY_S
        for k, v in fields.items():
            setattr(o, k, v)
        return o

    def drafter(self, **options):
        out = ctypes.c_void_p()
        st = self.lib.tpdraft_open(self.dd, self.td, ctypes.byref(self.options(**options)), ctypes.byref(out))
        if st != 0:
            raise Harness(f"tpdraft_open: {self.err()}")
        return out.value

    def client(self, **options):
        """A client of the case's server, closed (BYE: its sessions close) when the case ends
        unless the case closed it with close_client."""
        out = ctypes.c_void_p()
        st = self.lib.tpdraft_client_open(self.address.encode(), ctypes.byref(self.client_options(**options)),
                                          ctypes.byref(out))
        if st != 0:
            raise Harness(f"tpdraft_client_open({self.address}): {self.err()}")
        self.open_clients.append(out.value)
        return out.value

    def close_client(self, h):
        self.open_clients.remove(h)
        self.lib.tpdraft_client_close(h)

    def entry(self, session, n=REF_ROWS, anchor=REF_ANCHOR, taps="reference", taps_dtype=0, dist=0, **changes):
        """The reference request's entry for `session` (taps None: no taps; dist: a width, -1
        full), `changes` set on its fields. tokens and q start as -7, which no step writes: a
        refused step shows whether it wrote anything."""
        np = self.np
        e = self.abi.tpdraft_step_entry()
        self.lib.tpdraft_step_entry_init(ctypes.byref(e))
        if isinstance(taps, str):
            taps = self.taps(n)
        keep = [taps]
        e.session, e.anchor, e.taps_dtype = session, anchor, taps_dtype
        if taps is not None:
            e.taps, e.n_new = taps.ctypes.data, taps.shape[0]
        tokens = np.full(self.rows, -7, np.int64)
        q = np.full(self.rows, -7, np.float32)
        e.tokens, e.q = tokens.ctypes.data, q.ctypes.data
        if dist:
            width = dist if dist > 0 else self.V
            bufs = [np.zeros((self.rows, width), np.float32), np.zeros((self.rows, width), np.int64),
                    np.zeros(self.rows, np.float32)]
            keep += bufs
            e.dist_width, e.dist_probs, e.dist_ids, e.dist_rest = dist, bufs[0].ctypes.data, bufs[1].ctypes.data, \
                bufs[2].ctypes.data
        for k, v in changes.items():
            setattr(e.sampling if k in ("temperature", "top_k", "top_p", "seed") else e, k, v)
        return Entry(e, tokens, q, keep)

    def entries(self, entries):
        return (self.abi.tpdraft_step_entry * max(1, len(entries)))(*[en.c for en in entries])

    # -- judging
    @staticmethod
    def missing(message, names):
        out = []
        for n in names:
            alternatives = n if isinstance(n, tuple) else (n,)
            if not any(str(a) in message for a in alternatives):
                out.append(" or ".join(repr(str(a)) for a in alternatives))
        return out

    def judge(self, accepted, got, want, message, names):
        """A refusal's verdict: `got` (a status or exception) must be one of `want`, and the
        message must hold each of `names` (a tuple: one of its words)."""
        if accepted:
            return "silent wrong", "accepted" + (f": {message}" if message else "")
        if got not in want:
            return "unclear", f"{got}, expected {' or '.join(want)}: {message}"
        missing = self.missing(message, names)
        if missing:
            return "unclear", f"the message names no {', '.join(missing)}: {message}"
        return "clear error", message

    def c_refused(self, st, want, names):
        return self.judge(st == 0, self.status_name(st), want, self.err() if st else "", names)

    def py_refused(self, call, want, names):
        try:
            call()
        except BaseException as e:  # noqa: B902 - every exception is judged, none escapes
            kinds = [t.__name__ for t in type(e).__mro__]
            return self.judge(False, type(e).__name__ if not any(w in kinds for w in want) else want[0], want,
                              str(e), names)
        return "silent wrong", "accepted"

    def no_reply(self):
        return "no reply (the server ended)" if self.server_gone() else f"no reply within {REPLY_S} s"

    def wire_refused(self, reply, want, names):
        if reply is None:
            return "hang", self.no_reply()
        return self.judge(reply.status == 0, reply.status_name, want, reply.message, names)

    def same_as_reference(self, tokens, what="greedy"):
        got = [int(t) for t in tokens]
        if got == self.ref[what]:
            return "control ok", ""
        return "silent wrong", f"drafted {got}, the reference {self.ref[what]}"

    # -- raw frames and rings
    def raw(self, address=None):
        r = Raw(self, address or self.address)
        self.closers.append(r.close)
        return r

    def server_gone(self):
        """Whether the case's server has ended (a wait for its reply can stop: the sweep reports
        the crash)."""
        if not self.server_pid:
            return False
        try:
            os.kill(self.server_pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{self.server_pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie: ended, not reaped yet

    def log_size(self):
        return os.path.getsize(self.log) if self.log and os.path.exists(self.log) else 0

    def log_line(self, since, words, wait=REPLY_S):
        """The first line the server logged after `since` that holds every word (None when none
        comes within `wait`)."""
        deadline = time.monotonic() + wait
        while True:
            with open(self.log, errors="replace") as f:
                f.seek(since)
                for line in f.read().splitlines():
                    if all(w in line for w in words):
                        return line.strip()
            if time.monotonic() > deadline or self.server_gone():
                return None
            time.sleep(0.05)


class Raw:
    """A DEALER socket speaking the protocol byte by byte."""

    def __init__(self, x, address):
        import zmq
        self.x, self.p, self.zmq = x, x.proto, zmq
        self.sock = x.zctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.id = 0

    def close(self):
        try:
            self.ask("bye", wait=2)
        finally:
            self.sock.close(0)

    def frame(self, kind, body=b"", count=0, **header):
        self.id += 1
        values = {"magic": self.p.magic, "version": self.p.version, "kind": self.p.kind(kind), "status": 0,
                  "count": count, "id": self.id}
        values.update(header)
        return self.p.pack(self.p.header, values) + body

    def send(self, *frames):
        self.sock.send_multipart(list(frames))

    def recv(self, wait=REPLY_S, want_id=None):
        """The next reply (with id want_id when given), or None within `wait` seconds."""
        deadline = time.monotonic() + wait
        gone = False
        while True:
            left = deadline - time.monotonic()
            # A server that replies and then ends at once (SHUTDOWN) may be gone before this
            # poll: what it sent is read first, and a last look follows the end it was seen to.
            if self.sock.poll(int(min(max(left, 0), 0.1) * 1000) + 1):
                r = Reply(self.p, self.sock.recv())
                if want_id is None or r.h.get("id") == want_id:
                    return r
                continue
            if left <= 0 or gone:
                return None
            gone = self.x.server_gone()

    def ask(self, kind, body=b"", wait=REPLY_S, **header):
        self.send(self.frame(kind, body, **header))
        return self.recv(wait, self.id)

    def open(self):
        r = self.ask("open")
        if r is None or r.status != 0:
            raise Harness(f"OPEN: {r.message if r else 'no reply'}")
        return struct.unpack_from("<q", r.body)[0]

    def length(self, session):
        r = self.ask("length", struct.pack("<q", session))
        if r is None or r.status != 0:
            raise Harness(f"LENGTH: {r.message if r else 'no reply'}")
        return struct.unpack_from("<q", r.body)[0]

    def entry(self, **fields):
        return self.p.pack(self.p.entry, fields)

    def good(self, of_session, taps=None, offset=0, **fields):
        """The reference request's entry for of_session (taps inline at `offset`) and its taps
        area; `fields` change the entry's fields."""
        taps = self.x.taps() if taps is None else taps
        data = taps.tobytes()
        f = {"session": of_session, "anchor": REF_ANCHOR, "n_new": taps.shape[0], "taps_dtype": 0,
             "taps_where": self.p.where["tapsinline"], "taps_offset": offset, "taps_bytes": len(data)}
        f.update(fields)
        return self.entry(**f), b"\0" * offset + data

    def good_step(self, of_session, **kw):
        """good() as the entries and taps area of a STEP of that one entry."""
        e, area = self.good(of_session, **kw)
        return [e], area

    def step(self, entries, area=b"", **header):
        header.setdefault("count", len(entries))
        return self.ask("step", b"".join(entries) + area, **header)

    def tokens(self, reply, index=0):
        """Entry `index`'s drafts in a STEP reply (the entries before it asked for no distribution):
        after settle, draft and server seconds (f64) and the batch's entries and requests (u32)."""
        at = 3 * 8 + 2 * 4 + index * self.x.rows * 12
        return list(struct.unpack_from(f"<{self.x.rows}q", reply.body, at))

    def hello(self, name=b"", nbytes=0, wait=REPLY_S):
        if isinstance(name, str):
            name = name.encode()
        return self.ask("hello", struct.pack("<I", len(name)) + name + struct.pack("<Q", nbytes), wait=wait)

    def hello_ring(self, reply):
        """HELLO's reply body after the caps: (ring mapped, why not)."""
        b = reply.body
        _, at = read_str(b, 0)
        _, at = read_str(b, at)
        at += 8 * self.p.caps_numbers
        n = struct.unpack_from("<I", b, at)[0]
        at += 4 + 8 * n + 8  # the target layer ids, the idle timeout
        mapped = struct.unpack_from("<I", b, at)[0]
        note, _ = read_str(b, at + 4)
        return mapped, note


class Segment:
    """A POSIX shared-memory object made as a client makes its ring (/dev/shm/NAME, mode 600),
    mapped here."""
    count = 0

    def __init__(self, x, size, name=None, mode=0o600, create=True):
        Segment.count += 1
        self.x, self.p = x, x.proto
        self.name = name or f"{self.p.ring_prefix}{x.shm_tag}-{os.getpid()}-{Segment.count}"
        self.path = "/dev/shm/" + self.name.lstrip("/")
        self.size, self.map = size, None
        if create:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
            os.fchmod(fd, mode)
            os.ftruncate(fd, size)
            if size:
                self.map = mmap.mmap(fd, size)
            os.close(fd)
        x.closers.append(self.unlink)

    def unlink(self):
        if os.path.lexists(self.path):
            os.unlink(self.path)

    def shrink(self, size):
        fd = os.open(self.path, os.O_RDWR)
        os.ftruncate(fd, size)
        os.close(fd)
        self.size = size

    def get(self, field):
        fmt, at = self.p.control[field]
        return struct.unpack_from("<" + fmt, self.map, at)[0]

    def put(self, field, value):
        fmt, at = self.p.control[field]
        struct.pack_into("<" + fmt, self.map, at, value)

    def request(self, raw, frame, at=None, reply_at=None, reply_capacity=None, request_bytes=None, wait=REPLY_S):
        """Places `frame` in the ring (at `at`, if it fits), publishes it as the client does, rings
        the doorbell and waits for reply_seq; returns the reply read from the ring, or None."""
        at = self.p.ring_control_bytes if at is None else at
        if self.p.ring_control_bytes <= at and at + len(frame) <= self.size:
            self.map[at:at + len(frame)] = frame
        if reply_at is None:
            reply_at = (at + len(frame) + 63) // 64 * 64
        if reply_capacity is None:
            reply_capacity = max(0, self.size - reply_at)
        self.put("request_offset", at)
        self.put("request_bytes", len(frame) if request_bytes is None else request_bytes)
        self.put("reply_offset", reply_at)
        self.put("reply_capacity", reply_capacity)
        seq = (self.get("request_seq") + 1) % 2 ** 32
        self.put("request_seq", seq)
        raw.send(raw.frame("bell"))
        deadline = time.monotonic() + wait
        while self.get("reply_seq") != seq:
            if time.monotonic() > deadline or self.x.server_gone():
                return None
            time.sleep(0.0005)
        n = self.get("reply_bytes")
        return Reply(self.p, bytes(self.map[reply_at:reply_at + n]))


# ---- the cases ----------------------------------------------------------------------------------

class Case:
    """fn(x) -> (kind, detail), run in a process of its own within `limit` seconds. family: the
    server the case talks to (None: none); after: what the sweep checks of that server once the
    case ended."""

    def __init__(self, group, name, fn, family=None, after=None, limit=CASE_LIMIT_S):
        self.group, self.name, self.fn, self.family, self.after, self.limit = group, name, fn, family, after, limit


# Changes to the reference entry that every step must refuse, each with the words its message
# must hold. Shared by the in-process handle, the C client and (through the wire) the server.
def bad_entry_changes():
    return [
        ("tokens NULL", {"tokens": None}, ["entry 0", "tokens"]),
        ("dist_width 4 without dist_probs", {"dist": 4, "dist_probs": None}, ["entry 0", "dist_probs"]),
        ("dist_width 4 without dist_ids", {"dist": 4, "dist_ids": None}, ["entry 0", "dist_ids"]),
        ("dist_width -1 without dist_probs", {"dist": -1, "dist_probs": None}, ["entry 0", "dist_probs"]),
        ("dist_width -2", {"dist": 4, "dist_width": -2}, ["entry 0", "-2"]),
        ("dist_width past the vocabulary", {"dist": 4, "dist_width": 258}, ["entry 0", "258"]),
        ("dist_width 2^62", {"dist": 4, "dist_width": 2 ** 62}, ["entry 0", str(2 ** 62)]),
        ("session never opened", {"session": 4242}, ["entry 0", "4242"]),
        ("session -1", {"session": -1}, ["entry 0", "session -1"]),
        ("session INT64_MIN", {"session": I64_MIN}, ["entry 0", str(I64_MIN)]),
        ("keep past the session", {"keep": 5}, ["entry 0", "keep 5"]),
        ("keep -2", {"keep": -2}, ["entry 0", "keep -2"]),
        ("keep INT64_MAX", {"keep": I64_MAX}, ["entry 0", "keep"]),
        ("p0 past the session", {"p0": 3}, ["entry 0", "p0 3"]),
        ("p0 -7", {"p0": -7}, ["entry 0", "p0 -7"]),
        ("n_new -1", {"n_new": -1}, ["entry 0", "-1"]),
        ("n_new past the max context", {"n_new": 4097}, ["entry 0", "4097"]),
        ("n_new 2^62", {"n_new": 2 ** 62}, ["entry 0", str(2 ** 62)]),
        ("n_new INT64_MIN", {"n_new": I64_MIN}, ["entry 0", str(I64_MIN)]),
        ("taps NULL with rows", {"taps": None, "n_new": 2}, ["entry 0", "taps"]),
        ("taps_dtype 3", {"taps_dtype": 3}, ["entry 0", "taps_dtype 3"]),
        ("taps_dtype -1", {"taps_dtype": -1}, ["entry 0", "taps_dtype"]),
        ("taps_dtype INT32_MAX", {"taps_dtype": 2 ** 31 - 1}, ["entry 0", "taps_dtype"]),
        ("taps_on_device on a CPU backend", {"taps_on_device": 1}, ["entry 0", "device"]),
        ("anchor -1", {"anchor": -1}, ["entry 0", "anchor", "-1"]),
        ("anchor = vocabulary size", {"anchor": 257}, ["entry 0", "anchor", "257"]),
        ("anchor INT64_MAX", {"anchor": I64_MAX}, ["entry 0", "anchor"]),
        ("anchor INT64_MIN", {"anchor": I64_MIN}, ["entry 0", "anchor"]),
        ("NaN in the taps", {"taps": ("poison", NAN)}, ["entry 0", "NaN", "new row 1", "column 7"]),
        ("+Inf in the taps", {"taps": ("poison", INF)}, ["entry 0", "Inf", "new row 1", "column 7"]),
        ("-Inf in the taps", {"taps": ("poison", -INF)}, ["entry 0", "Inf", "column 7"]),
        ("3e38 in the taps", {"taps": ("poison", 3e38)}, ["entry 0", "column 7", "2^30"]),
        ("2^31 in the taps", {"taps": ("poison", 2.0 ** 31)}, ["entry 0", "column 7", "2^30"]),
        ("bf16 NaN in the taps", {"taps": ("bf16", 0x7FC0), "taps_dtype": 1}, ["entry 0", "NaN", "column 7"]),
        ("bf16 -Inf in the taps", {"taps": ("bf16", 0xFF80), "taps_dtype": 1}, ["entry 0", "Inf", "column 7"]),
        ("f16 Inf in the taps", {"taps": ("f16", INF), "taps_dtype": 2}, ["entry 0", "Inf", "column 7"]),
        ("f16 NaN in the taps", {"taps": ("f16", NAN), "taps_dtype": 2}, ["entry 0", "NaN", "column 7"]),
        ("temperature 1e-310", {"temperature": 1e-310}, ["entry 0", "temperature"]),
        ("temperature 1e-7", {"temperature": 1e-7}, ["entry 0", "temperature"]),
        ("temperature -1", {"temperature": -1.0}, ["entry 0", "temperature"]),
        ("temperature NaN", {"temperature": NAN}, ["entry 0", "temperature"]),
        ("temperature Inf", {"temperature": INF}, ["entry 0", "temperature"]),
        ("top_k 5 on DFlash 2", {"top_k": 5}, ["entry 0", "top_k"]),
        ("top_k -1", {"top_k": -1}, ["entry 0", "top_k"]),
        ("top_p 0", {"top_p": 0.0}, ["entry 0", "top_p"]),
        ("top_p 1.5", {"top_p": 1.5}, ["entry 0", "top_p"]),
        ("top_p NaN", {"top_p": NAN}, ["entry 0", "top_p"]),
    ]


def make_entry(x, session, change):
    """The reference entry of `session` with `change` (bad_entry_changes) applied."""
    change = dict(change)
    session = change.pop("session", session)
    taps = change.pop("taps", "reference")
    if isinstance(taps, tuple):
        kind, value = taps
        np = x.np
        taps = (x.poisoned(None, raw=value) if kind == "bf16" else
                x.poisoned(value, dtype=np.float16 if kind == "f16" else np.float32))
    return x.entry(session, taps=taps, dist=change.pop("dist", 0), **change)


class Api:
    """The in-process drafter or the C client, through the same few calls."""

    def __init__(self, x, served):
        self.x, self.served = x, served
        lib = x.lib
        p = "tpdraft_client_" if served else "tpdraft_"
        self.open_session, self.close_session = getattr(lib, p + "session_open"), getattr(lib, p + "session_close")
        self.length_of, self.step_fn = getattr(lib, p + "session_length"), getattr(lib, p + "step")

    def handle(self, **options):
        return self.x.client(**options) if self.served else self.x.drafter(**options)

    def session(self, h):
        s = ctypes.c_int64()
        if self.open_session(h, ctypes.byref(s)) != 0:
            raise Harness(f"session open: {self.x.err()}")
        return s.value

    def length(self, h, s):
        n = ctypes.c_int64(-99)
        st = self.length_of(h, s, ctypes.byref(n))
        return n.value if st == 0 else f"(length refused: {self.x.err()})"

    def step(self, h, entries, count=None):
        return self.step_fn(h, self.x.entries(entries), len(entries) if count is None else count)


def refused_step(x, api, h, entries, names, sessions, count=None, want=("argument",)):
    """A step that must be refused: judged by its status and message, then by what it left: no
    session moved, and no drafts in the entries (the in-process call writes none; the client
    writes -1 and q 0 into those it checked)."""
    st = api.step(h, entries, count)
    verdict = x.c_refused(st, want, names)
    if st == 0:
        return verdict
    for s in sessions:
        n = api.length(h, s)
        if n != 0:
            return "silent wrong", f"refused ({x.err()}), but session {s} now holds {n} positions"
    for i, en in enumerate(entries):
        t, q = en.tokens.tolist(), en.q.tolist()
        untouched = set(t) == {-7} and set(q) == {-7.0}
        failed = api.served and set(t) == {-1} and set(q) == {0.0}
        if not (untouched or failed):
            return "silent wrong", f"refused, but entry {i} holds tokens {t}, q {q}"
    return verdict


def c_abi_cases(add):
    G = "C ABI"

    def opening(name, names, want=("input", "argument"), **fields):
        def fn(x):
            out = ctypes.c_void_p()
            values = {k: v(x) if callable(v) else v for k, v in fields.items()}
            st = x.lib.tpdraft_open(x.dd, x.td, ctypes.byref(x.options(**values)), ctypes.byref(out))
            if st == 0:
                x.lib.tpdraft_close(out)
            return x.c_refused(st, want, names)
        add(G, f"tpdraft_open: {name}", fn)

    def call(name, fn):
        add(G, name, fn)

    call("tpdraft_open: drafter_dir NULL", lambda x: x.c_refused(
        x.lib.tpdraft_open(None, x.td, None, ctypes.byref(ctypes.c_void_p())), ("argument",), ["NULL"]))
    call("tpdraft_open: target_dir NULL", lambda x: x.c_refused(
        x.lib.tpdraft_open(x.dd, None, None, ctypes.byref(ctypes.c_void_p())), ("argument",), ["NULL"]))
    call("tpdraft_open: out NULL", lambda x: x.c_refused(x.lib.tpdraft_open(x.dd, x.td, None, None), ("argument",),
                                                         ["out"]))
    call("tpdraft_open: a drafter_dir that does not exist", lambda x: x.c_refused(
        x.lib.tpdraft_open(os.path.join(x.tmp, "none").encode(), x.td, None, ctypes.byref(ctypes.c_void_p())),
        ("input",), ["none"]))
    opening("struct_size 0", ["struct_size"], struct_size=0)
    opening("struct_size one field short", ["struct_size"],
            struct_size=lambda x: ctypes.sizeof(x.abi.tpdraft_options) - 8)
    for v in (2 ** 58, I64_MAX, 0, -1):
        opening(f"max_context {v}", ["max_context", str(v)], max_context=v)
    for v in (300, -1):
        opening(f"tp {v}", ["tp", str(v)], tp=v)
    for v in (2 ** 31 - 1, -1):
        opening(f"threads {v}", ["threads", str(v)], threads=v)
    for v in (0, 4097):
        opening(f"max_sessions {v}", ["max_sessions", str(v)], max_sessions=v)
    for v in (0, 2 ** 21):
        opening(f"max_open_sessions {v}", ["max_open_sessions", str(v)], max_open_sessions=v)
    opening("graphs 2", ["graphs"], graphs=2)
    opening("quant 'q3'", ["quant", "q3"], quant=b"q3")
    opening("quant 'q8a4'", ["quant", "q8a4"], quant=b"q8a4")
    opening("kv_dtype 'f16'", ["kv_dtype", "f16"], kv_dtype=b"f16")
    opening("backend 'bogus'", ["bogus"], backend=b"bogus")
    opening("backend ''", ["backend"], backend=b"")

    def token_ids(name, ids, names, n=None, **fields):
        def fn(x):
            arr = (ctypes.c_int64 * max(1, len(ids)))(*ids)
            return x.c_refused(x.lib.tpdraft_open(x.dd, x.td, ctypes.byref(x.options(
                token_ids=ctypes.addressof(arr), n_token_ids=len(ids) if n is None else n, **fields)),
                ctypes.byref(ctypes.c_void_p())), ("input", "argument"), names)
        add(G, f"tpdraft_open: {name}", fn)

    token_ids("token_ids and token_map both", [1, 2], ["token_map", "token_ids"], token_map=b"x.json")
    token_ids("token_ids with n_token_ids 0", [1, 2], ["n_token_ids"], n=0)
    token_ids("token_ids with n_token_ids -1", [1, 2], ["n_token_ids"], n=-1)
    token_ids("token_ids with n_token_ids 2^40", [1, 2], ["n_token_ids"], n=2 ** 40)
    token_ids("token_ids past the vocabulary", [1, 300], ["300"])
    token_ids("token_ids negative", [1, -5], ["-5"])
    opening("token_map that does not exist", ["nothing.json"], token_map=b"nothing.json")

    def caps_case(name, which):
        def fn(x):
            h = x.drafter()
            c = x.abi.tpdraft_caps()
            c.struct_size = ctypes.sizeof(c)
            if which == "handle":
                st = x.lib.tpdraft_caps_get(None, ctypes.byref(c))
            elif which == "out":
                st = x.lib.tpdraft_caps_get(h, None)
            else:
                c.struct_size = which
                st = x.lib.tpdraft_caps_get(h, ctypes.byref(c))
            return x.c_refused(st, ("argument",), ["struct_size"] if isinstance(which, int) else ["NULL"])
        add(G, f"tpdraft_caps_get: {name}", fn)

    caps_case("drafter NULL", "handle")
    caps_case("out NULL", "out")
    caps_case("struct_size 0", 0)
    caps_case("struct_size 8", 8)

    for served in (False, True):
        entry_point_cases(add, served)

    # Not a case: tpdraft_close twice on one handle. The first frees the handle, and the header
    # forbids any later use of it; a library could tell a freed handle only by keeping a list of
    # live ones, which would then close a new handle that reused the address.

    def null_calls(x):
        x.lib.tpdraft_close(None)
        x.lib.tpdraft_client_close(None)
        x.lib.tpdraft_options_init(None)
        x.lib.tpdraft_client_options_init(None)
        x.lib.tpdraft_step_entry_init(None)
        names = [x.lib.tpdraft_status_name(v).decode() for v in (-1, 99, 2 ** 31 - 1)]
        if x.lib.tpdraft_client_shared_memory(None) != 0 or set(names) != {"unknown"}:
            return "silent wrong", f"status names {names}"
        return "control ok", ""
    add(G, "close(NULL), client_close(NULL), the inits of NULL, unknown status names", null_calls)

    def close_with_sessions(x):
        h = x.drafter()
        api = Api(x, False)
        for _ in range(3):
            s = api.session(h)
        en = x.entry(s)
        if api.step(h, [en]) != 0:
            raise Harness(x.err())
        x.lib.tpdraft_close(h)
        return x.same_as_reference(en.tokens)
    add(G, "a step, then tpdraft_close with sessions open", close_with_sessions)


def entry_point_cases(add, served):
    """The step, session and NULL cases of the in-process handle (served False) or the C client
    against a server (served True)."""
    G = "C ABI"
    family = "client" if served else None
    who = "client " if served else ""
    api_name = "tpdraft_client_" if served else "tpdraft_"

    def case(name, fn):
        add(G, who + name, lambda x: fn(x, Api(x, served)), family)

    for name, change, names in bad_entry_changes():
        if served and name.startswith("taps_on_device"):
            names = ["entry 0", "device memory"]

        def fn(x, api, change=change, names=names):
            h = api.handle()
            s = api.session(h)
            return refused_step(x, api, h, [make_entry(x, s, change)], names, [s])
        case(f"step: {name}", fn)

    def step_counts(x, api, count, names, entries=1, array=True):
        h = api.handle()
        s = api.session(h)
        ens = [x.entry(s) for _ in range(entries)]
        if not array:
            return x.c_refused(api.step_fn(h, None, count), ("argument",), names)
        return refused_step(x, api, h, ens, names, [s], count=count)
    for count in (0, 9, 2 ** 32 + 1, 2 ** 63, U64_MAX):
        case(f"step: count {count} (one entry given)",
             lambda x, api, count=count: step_counts(x, api, count, [str(count)]))
    case("step: entries NULL", lambda x, api: step_counts(x, api, 1, ["entries"], array=False))
    case("step: drafter NULL", lambda x, api: x.c_refused(api.step_fn(None, x.entries([x.entry(0)]), 1),
                                                          ("argument",), ["NULL"]))

    def twice(x, api):
        h = api.handle()
        s = api.session(h)
        return refused_step(x, api, h, [x.entry(s), x.entry(s)], ["entry 1", f"session {s}", "twice"], [s])
    case("step: one session in two entries", twice)

    def second_bad(x, api):
        h = api.handle()
        s0, s1 = api.session(h), api.session(h)
        return refused_step(x, api, h, [x.entry(s0), x.entry(s1, anchor=-3)], ["entry 1", "anchor", "-3"], [s0, s1])
    case("step: entry 1 bad, entry 0 good (nothing may change)", second_bad)

    def closed_session(x, api):
        h = api.handle()
        s = api.session(h)
        api.close_session(h, s)
        return refused_step(x, api, h, [x.entry(s)], ["entry 0", f"session {s}"], [])
    case("step: a closed session", closed_session)

    def others(x, api):
        a, b = api.handle(), api.handle()
        mine = api.session(b)
        theirs = [api.session(a) for _ in range(3)][-1]
        if theirs == mine:
            raise Harness("the two handles' sessions share an id")
        return refused_step(x, api, b, [x.entry(theirs)], ["entry 0", f"session {theirs}"], [mine])
    case("step: another handle's session", others)

    def session_calls(name, fn):
        case(name, fn)

    session_calls(f"{api_name}session_open: handle NULL",
                  lambda x, api: x.c_refused(api.open_session(None, ctypes.byref(ctypes.c_int64())), ("argument",),
                                             ["NULL"]))
    session_calls(f"{api_name}session_open: out NULL",
                  lambda x, api: x.c_refused(api.open_session(api.handle(), None), ("argument",), ["NULL"]))
    session_calls(f"{api_name}session_close: never opened",
                  lambda x, api: x.c_refused(api.close_session(api.handle(), 12345), ("argument",), ["12345"]))
    session_calls(f"{api_name}session_close: INT64_MIN",
                  lambda x, api: x.c_refused(api.close_session(api.handle(), I64_MIN), ("argument",), [str(I64_MIN)]))
    session_calls(f"{api_name}session_close: handle NULL",
                  lambda x, api: x.c_refused(api.close_session(None, 0), ("argument",), ["NULL"]))

    def close_twice(x, api):
        h = api.handle()
        s = api.session(h)
        if api.close_session(h, s) != 0:
            raise Harness(x.err())
        return x.c_refused(api.close_session(h, s), ("argument",), [f"session {s}"])
    session_calls(f"{api_name}session_close: twice", close_twice)

    def close_others(x, api):
        a, b = api.handle(), api.handle()
        api.session(b)
        theirs = [api.session(a) for _ in range(3)][-1]
        verdict = x.c_refused(api.close_session(b, theirs), ("argument",), [f"session {theirs}"])
        if verdict[0] == "clear error" and api.length(a, theirs) != 0:
            return "silent wrong", f"refused, but the owner's session {theirs} changed"
        return verdict
    session_calls(f"{api_name}session_close: another handle's session", close_others)
    session_calls(f"{api_name}session_length: never opened",
                  lambda x, api: x.c_refused(api.length_of(api.handle(), 777, ctypes.byref(ctypes.c_int64())),
                                             ("argument",), ["777"]))
    session_calls(f"{api_name}session_length: out NULL",
                  lambda x, api: x.c_refused(api.length_of(api.handle(), 0, None), ("argument",), ["NULL"]))

    def too_many(x, api):
        h = api.handle(**({} if served else {"max_open_sessions": 2}))
        limit = 32 if served else 2  # the sweep's server runs with --max-open-sessions 32
        out = ctypes.c_int64()
        for i in range(limit + 1):
            st = api.open_session(h, ctypes.byref(out))
            if st != 0:
                return x.c_refused(st, ("argument",), ["max-open-sessions" if served else "max_open_sessions"])
        return "silent wrong", f"opened {limit + 1} sessions, the limit is {limit}"
    session_calls(f"{api_name}session_open: past the sessions allowed open", too_many)

    times = "tpdraft_client_last_step_times" if served else "tpdraft_last_step_times"
    session_calls(f"{times}: out NULL", lambda x, api: x.c_refused(getattr(x.lib, times)(api.handle(), None),
                                                                    ("argument",), ["NULL"]))

    def after_bad_ones(x, api):
        h = api.handle()
        s = api.session(h)
        for name, change, _ in bad_entry_changes():
            if api.step(h, [make_entry(x, s, change)]) == 0:
                return "silent wrong", f"'{name}' was accepted"
        en = x.entry(s)
        if api.step(h, [en]) != 0:
            return "silent wrong", f"the good step after {len(bad_entry_changes())} bad ones was refused: {x.err()}"
        return x.same_as_reference(en.tokens)
    case("a good step after every bad one drafts the reference", after_bad_ones)

    def sampled(x, api):
        h = api.handle()
        s = api.session(h)
        en = x.entry(s, temperature=REF_TEMPERATURE, seed=REF_SAMPLE_SEED)
        if api.step(h, [en]) != 0:
            return "silent wrong", f"refused: {x.err()}"
        verdict = x.same_as_reference(en.tokens, "sampled")
        q = [round(float(v), 6) for v in en.q]
        if verdict[0] == "control ok" and q != [round(v, 6) for v in x.ref["sampled_q"]]:
            return "silent wrong", f"q {q}, the reference {x.ref['sampled_q']}"
        return verdict
    case("a sampled step (seed 11) draws the reference", sampled)

    def extreme_but_valid(x, api):
        h = api.handle()
        s = api.session(h)
        en = x.entry(s, temperature=1e300, seed=U64_MAX, dist=-1)
        st = api.step(h, [en])
        if st != 0:
            return x.c_refused(st, ("argument",), ["temperature"])
        t = en.tokens.tolist()
        if not all(0 <= v < x.V for v in t) or not all(0 <= v <= 1 for v in en.q.tolist()):
            return "silent wrong", f"tokens {t}, q {en.q.tolist()}"
        return "control ok", ""
    case("temperature 1e300, seed UINT64_MAX, the full distribution", extreme_but_valid)

    def f16_max(x, api):
        h = api.handle()
        s = api.session(h)
        np = x.np
        en = x.entry(s, taps=x.poisoned(65504.0, dtype=np.float16), taps_dtype=2)
        st = api.step(h, [en])
        if st != 0:
            return "silent wrong", f"the largest finite f16 was refused: {x.err()}"
        return ("control ok", "") if all(0 <= v < x.V for v in en.tokens.tolist()) else \
            ("silent wrong", f"tokens {en.tokens.tolist()}")
    case("f16 taps holding 65504 (the largest finite f16)", f16_max)

    if served:
        client_cases(add)


def client_option_fields():
    """The fields of tpdraft_client_options in the header (the cases of a field come with it)."""
    text = strip_comments(open(os.path.join(REPO, "include", "tpdraft", "tpdraft.h")).read())
    body = re.search(r"typedef\s+struct\s+tpdraft_client_options\s*\{(.*?)\}", text, re.S).group(1)
    return re.findall(r"(\w+)\s*;", body)


# A well-formed CURVE public key (40 characters of Z85) that no server of the sweep holds.
SOME_CURVE_KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def client_cases(add):
    G = "C ABI"

    def opening(name, names, want=("argument",), address=None, **fields):
        def fn(x):
            out = ctypes.c_void_p()
            addr = (address(x) if callable(address) else address) if address is not None else x.address.encode()
            values = {k: v(x) if callable(v) else v for k, v in fields.items()}
            st = x.lib.tpdraft_client_open(addr, ctypes.byref(x.client_options(**values)), ctypes.byref(out))
            if st == 0:
                x.lib.tpdraft_client_close(out)
            return x.c_refused(st, want, [n(x) if callable(n) else n for n in names])
        add(G, f"client open: {name}", fn, "client")

    opening("address NULL", ["address"], address=lambda x: None)
    add(G, "client open: out NULL", lambda x: x.c_refused(
        x.lib.tpdraft_client_open(x.address.encode(), None, None), ("argument",), ["out"]), "client")
    opening("address 'foo://x'", ["foo://x"], address=b"foo://x")
    opening("address ''", ["address"], address=b"")
    opening("an ipc path nobody listens on", [lambda x: os.path.join(x.tmp, "nobody.sock")], ("unavailable",),
            address=lambda x: ("ipc://" + os.path.join(x.tmp, "nobody.sock")).encode(), timeout_seconds=1.0)
    opening("struct_size 0", ["struct_size"], struct_size=0)
    for v in (0.0, -1.0, NAN, INF, 1e7):
        opening(f"timeout_seconds {v}", ["timeout_seconds"], timeout_seconds=v)
    for v in (2, -2):
        opening(f"shared_memory {v}", ["shared_memory"], shared_memory=v)
    opening("shared_memory 1 over tcp", ["tcp://127.0.0.1:9"], address=b"tcp://127.0.0.1:9", shared_memory=1)
    for v in (100, -1, 2 ** 41, I64_MAX):
        opening(f"ring_bytes {v}", ["ring_bytes", str(v)], shared_memory=1, ring_bytes=v)

    def ring_control(name, **fields):
        """A ring size near the bounds: refused naming the ring, or taken, and then a step drafts
        the reference whether its taps go through the ring or inline."""
        def fn(x):
            out = ctypes.c_void_p()
            st = x.lib.tpdraft_client_open(x.address.encode(), ctypes.byref(x.client_options(**fields)),
                                           ctypes.byref(out))
            if st != 0:
                return x.c_refused(st, ("argument",), ["ring"])
            api = Api(x, True)
            h = out.value
            x.open_clients.append(h)
            s = api.session(h)
            en = x.entry(s)
            if api.step(h, [en]) != 0:
                return "silent wrong", f"the step was refused: {x.err()}"
            return x.same_as_reference(en.tokens)
        add(G, f"client open: {name}", fn, "client")

    def fifo(x):
        path = os.path.join(x.tmp, "fifo")
        os.mkfifo(path)
        return path.encode()

    def not_z85(x):
        path = os.path.join(x.tmp, "key")
        with open(path, "w") as f:
            f.write('"' * len(SOME_CURVE_KEY))
        return path.encode()

    if "server_key" in client_option_fields():
        opening("server_key a file that does not exist", ["server_key", "nokey"], server_key=b"nokey")
        opening("server_key a directory", ["server_key", "not a file"], server_key=lambda x: x.tmp.encode())
        opening("server_key a FIFO", ["server_key", "not a file"], server_key=fifo)
        opening("server_key a file of 40 characters that are not Z85", ["server_key", "not a CURVE key"],
                server_key=not_z85)
        opening("server_key of a server without CURVE", ["server_key"], ("unavailable",),
                server_key=SOME_CURVE_KEY.encode(), timeout_seconds=1.0)
    ring_control("ring_bytes 4096, shared memory if possible", ring_bytes=4096)
    ring_control("ring_bytes 4096, shared memory required", ring_bytes=4096, shared_memory=1)
    ring_control("ring_bytes 8192, shared memory required", ring_bytes=8192, shared_memory=1)
    ring_control("ring_bytes 2^40 (the most allowed)", ring_bytes=2 ** 40, shared_memory=1)

    def null(name, call, names=("NULL",)):
        def fn(x):
            h = x.client()
            return x.c_refused(call(x, h), ("argument",), list(names))
        add(G, f"client {name}", fn, "client")

    null("tpdraft_client_caps_get: client NULL", lambda x, h: x.lib.tpdraft_client_caps_get(
        None, ctypes.byref(x.abi.tpdraft_caps(struct_size=ctypes.sizeof(x.abi.tpdraft_caps)))))
    null("tpdraft_client_caps_get: out NULL", lambda x, h: x.lib.tpdraft_client_caps_get(h, None))
    null("tpdraft_client_caps_get: struct_size 0", lambda x, h: x.lib.tpdraft_client_caps_get(
        h, ctypes.byref(x.abi.tpdraft_caps())), ["struct_size"])
    null("tpdraft_client_stats: out NULL", lambda x, h: x.lib.tpdraft_client_stats(h, None))
    null("tpdraft_client_stats: client NULL", lambda x, h: x.lib.tpdraft_client_stats(
        None, ctypes.byref(x.abi.tpdraft_server_stats())))
    null("tpdraft_client_shutdown: client NULL", lambda x, h: x.lib.tpdraft_client_shutdown(None))

    def refused_then_open(x):
        h = x.client()
        api = Api(x, True)
        s = api.session(h)
        bad = x.entry(s, anchor=999)
        st = api.step(h, [bad])
        if st == 0:
            return "silent wrong", "anchor 999 accepted"
        stats = x.abi.tpdraft_server_stats()
        if x.lib.tpdraft_client_stats(h, ctypes.byref(stats)) != 0:
            return "silent wrong", f"a refused step closed the client: {x.err()}"
        en = x.entry(s)
        if api.step(h, [en]) != 0:
            return "silent wrong", f"a refused step closed the client: {x.err()}"
        return x.same_as_reference(en.tokens)
    add(G, "client stays open after a refused step and drafts the reference", refused_then_open, "client")

    # Not a case either: tpdraft_client_close twice (as tpdraft_close twice, above).


# ---- Python ---------------------------------------------------------------------------------------

def python_cases(add):
    G = "Python"

    def drafter(x, **options):
        options.setdefault("threads", 1)
        return x.tpdraft.Drafter(x.dd.decode(), x.td.decode(), **options)

    def client(x, **options):
        options.setdefault("timeout", REPLY_S)
        return x.tpdraft.Client(x.address, **options)

    def handles(served):
        return (client, "pyclient") if served else (drafter, None)

    def step_refused(name, entry, want, names, served=False, taps="reference"):
        make, family = handles(served)

        def fn(x):
            d = make(x)
            s = d.open_session()
            e = {"session": s, "anchor": REF_ANCHOR}
            if taps is not None:
                e["taps"] = x.taps() if taps == "reference" else taps(x)
            e.update(entry(x, s) if callable(entry) else entry)
            e = {k: v for k, v in e.items() if v is not DROP}
            verdict = x.py_refused(lambda: d.step([e]), want, names)
            if verdict[0] != "silent wrong" and d.session_length(s) != 0:
                return "silent wrong", f"refused ({verdict[1]}), but the session moved"
            return verdict
        add(G, ("Client" if served else "Drafter") + f".step: {name}", fn, family)

    DROP = object()
    TE, VE, KE, AE = ("TypeError",), ("ValueError",), ("KeyError",), ("ArgumentError",)
    for served in (False, True):
        np_taps = [
            ("taps a str", lambda x: "0.5", TE, ["taps"]),
            ("taps bytes", lambda x: b"\0" * (4 * x.W * 2), TE, ["taps"]),
            ("taps a dict", lambda x: {"a": 1}, TE, ["taps"]),
            ("taps an object array", lambda x: x.np.array([[object()] * x.W] * 2, dtype=object), TE, ["taps"]),
            ("taps a list of str", lambda x: [["1.0"] * x.W] * 2, TE, ["taps"]),
            ("taps complex64", lambda x: x.taps().astype(x.np.complex64), TE, ["taps", "complex64"]),
            ("taps int32", lambda x: x.np.ones((2, x.W), x.np.int32), TE, ["taps", "int32"]),
            ("taps bool", lambda x: x.np.ones((2, x.W), bool), TE, ["taps", "bool"]),
            ("taps 1-D", lambda x: x.taps()[0], VE, ["taps", str(192)]),
            ("taps 3-D", lambda x: x.taps()[None], VE, ["taps", str(192)]),
            ("taps 0-D", lambda x: x.np.float32(1.0), VE, ["taps"]),
            ("taps one column short", lambda x: x.taps()[:, 1:].copy(), VE, ["taps", str(192)]),
            ("taps with NaN", lambda x: x.poisoned(NAN), AE, ["entry 0", "NaN", "column 7"]),
            ("taps with 3e38", lambda x: x.poisoned(3e38), AE, ["entry 0", "2^30"]),
            ("taps float64 with Inf", lambda x: x.poisoned(INF).astype(x.np.float64), AE, ["entry 0", "Inf"]),
        ]
        if served:
            np_taps = [c for c in np_taps if c[0] in ("taps a str", "taps an object array", "taps complex64",
                                                      "taps 1-D", "taps with NaN", "taps with 3e38")]
        for name, taps, want, names in np_taps:
            step_refused(name, {}, want, names, served, taps=taps)
        fields = [
            ("unknown key 'temprature'", {"temprature": 0.5}, KE, ["temprature", "temperature"]),
            ("unknown key 'sesion'", {"sesion": 1}, KE, ["sesion", "session"]),
            ("a key that is not a str", {1: 2}, TE, ["1"]),
            ("no anchor", {"anchor": DROP}, KE, ["anchor"]),
            ("session a str", {"session": "0"}, TE, ["session"]),
            ("session True", {"session": True}, TE, ["session"]),
            ("session 1.0", {"session": 1.0}, TE, ["session"]),
            ("session 2**70", {"session": 2 ** 70}, TE, ["session"]),
            ("session never opened", {"session": 4242}, AE, ["entry 0", "4242"]),
            ("anchor 1.5", {"anchor": 1.5}, TE, ["anchor"]),
            ("anchor None", {"anchor": None}, TE, ["anchor"]),
            ("anchor 257", {"anchor": 257}, AE, ["anchor", "257"]),
            ("anchor 2**63", {"anchor": 2 ** 63}, TE, ["anchor"]),
            ("keep 'x'", {"keep": "x"}, TE, ["keep"]),
            ("keep 9", {"keep": 9}, AE, ["keep 9"]),
            ("p0 [1]", {"p0": [1]}, TE, ["p0"]),
            ("temperature 'hot'", {"temperature": "hot"}, TE, ["temperature"]),
            ("temperature 1e-310", {"temperature": 1e-310}, AE, ["temperature"]),
            ("temperature NaN", {"temperature": NAN}, AE, ["temperature"]),
            ("temperature complex", {"temperature": 1j}, TE, ["temperature"]),
            ("top_k 1.5", {"top_k": 1.5}, TE, ["top_k"]),
            ("top_k 4 on DFlash 2", {"top_k": 4}, AE, ["top_k"]),
            ("top_p 'x'", {"top_p": "x"}, TE, ["top_p"]),
            ("top_p 0", {"top_p": 0.0}, AE, ["top_p"]),
            ("seed -1", {"seed": -1}, TE, ["seed"]),
            ("seed 2**64", {"seed": 2 ** 64}, TE, ["seed"]),
            ("dist 'half'", {"dist": "half"}, VE, ["dist", "half"]),
            ("dist 1.5", {"dist": 1.5}, TE, ["dist"]),
            ("dist -5", {"dist": -5}, AE, ["-5"]),
            ("dist 258", {"dist": 258}, AE, ["258"]),
            ("dist 10**30", {"dist": 10 ** 30}, TE, ["dist"]),
            ("taps_dtype 'f32'", {"taps_dtype": "f32"}, VE, ["taps_dtype", "f32"]),
            ("taps_dtype 5", {"taps_dtype": 5}, TE, ["taps_dtype"]),
            ("taps_dtype 'bf16' over float32 taps", {"taps_dtype": "bf16"}, TE, ["bf16", "uint16"]),
            ("taps_dtype 'bf16' without taps", {"taps_dtype": "bf16", "taps": DROP}, VE, ["taps_dtype"]),
            ("taps_dtype 'bf16' over strided uint16",
             lambda x, s: {"taps_dtype": "bf16", "taps": x.np.zeros((4, 2 * x.W), x.np.uint16)[:, ::2]}, TE,
             ["bf16", "C-contiguous"]),
            ("bf16 bits holding NaN", lambda x, s: {"taps_dtype": "bf16", "taps": x.poisoned(None, raw=0x7FC0)}, AE,
             ["entry 0", "NaN"]),
        ]
        if served:
            fields = [c for c in fields if c[0] in ("unknown key 'temprature'", "session never opened", "anchor 257",
                                                    "temperature 1e-310", "seed -1", "dist 258")]
        for name, entry, want, names in fields:
            step_refused(name, entry, want, names, served)

    def refused(name, call, want, names, family=None):
        add(G, name, lambda x: x.py_refused(lambda: call(x), want, names), family)

    def entries_case(name, entries, want, names, served=False):
        make, family = handles(served)

        def fn(x):
            d = make(x)
            s = d.open_session()
            return x.py_refused(lambda: d.step(entries(x, s)), want, names)
        add(G, ("Client" if served else "Drafter") + f".step: {name}", fn, family)

    one = lambda x, s: {"session": s, "anchor": REF_ANCHOR, "taps": x.taps()}  # noqa: E731
    entries_case("entries a tuple", lambda x, s: (one(x, s),), TE, ["entries"])
    entries_case("entries a dict", lambda x, s: one(x, s), TE, ["entries"])
    entries_case("entries None", lambda x, s: None, TE, ["entries"])
    entries_case("an entry a list", lambda x, s: [[s, REF_ANCHOR]], TE, ["entry 0", "dict"])
    entries_case("an entry None", lambda x, s: [one(x, s), None], TE, ["entry 1", "dict"])
    entries_case("no entries", lambda x, s: [], AE, ["0"])
    entries_case("9 entries (max sessions 8)", lambda x, s: [one(x, s)] * 9, AE, ["9"])
    entries_case("one session twice", lambda x, s: [one(x, s), one(x, s)], AE, ["entry 1", "twice"])
    entries_case("9 entries (max sessions 8)", lambda x, s: [one(x, s)] * 9, AE, ["9"], served=True)

    def opt(name, options, want, names):
        refused(f"Drafter({name})", lambda x: drafter(x, **{k: v(x) if callable(v) else v for k, v in options.items()}),
                want, names)

    for key, value in [("backend", 5), ("threads", "x"), ("tp", 1.5), ("max_sessions", None), ("max_context", "big"),
                       ("max_open_sessions", []), ("threads", 2 ** 40), ("max_context", 2 ** 70)]:
        opt(f"{key}={value!r}", {key: value}, TE, [key])
    opt("graphs='yes'", {"graphs": "yes"}, TE, ["graphs"])
    opt("quant=5", {"quant": 5}, TE, ["quant"])
    opt("quant='q3'", {"quant": "q3"}, ("Error",), ["quant", "q3"])
    opt("quant='q8a16+'", {"quant": "q8a16+"}, ("Error",), ["quant", "q8a16+"])
    opt("kv_dtype=5", {"kv_dtype": 5}, TE, ["kv_dtype"])
    opt("kv_dtype='f16'", {"kv_dtype": "f16"}, ("Error",), ["kv_dtype", "f16"])
    for key, value in [("threads", 100000), ("tp", 300), ("max_sessions", 5000), ("max_context", 2 ** 58),
                       ("max_open_sessions", 2 ** 21), ("max_context", -1), ("threads", -1)]:
        opt(f"{key}={value}", {key: value}, ("Error",), [key, str(value)])
    for value, want, names in [(5, TE, ["token_map"]), ([True, 2], TE, ["token_map", "bool"]), ([], VE, ["token_map"]),
                               ([1.5], TE, ["token_map"]), ([[1, 2]], TE, ["token_map"]), ([300], ("Error",), ["300"]),
                               ([-2], ("Error",), ["-2"]), ([2 ** 64], TE, ["token_map"])]:
        opt(f"token_map={value!r}", {"token_map": value}, want, names)
    opt("token_map=uint64 2**63", {"token_map": lambda x: x.np.array([2 ** 63], x.np.uint64)}, VE, ["token_map"])
    refused("Drafter(None, target)", lambda x: x.tpdraft.Drafter(None, x.td.decode()), TE, ["drafter_dir"])
    refused("Drafter(a directory that does not exist)", lambda x: x.tpdraft.Drafter(
        os.path.join(x.tmp, "none"), x.td.decode()), ("InputError",), ["none"])
    refused("Drafter(drafter_dir with a NUL byte)", lambda x: x.tpdraft.Drafter(
        x.dd.decode() + "\0" + os.path.join(x.tmp, "none"), x.td.decode(), threads=1), ("ValueError", "Error"),
        [("NUL", "null")])

    def closed(name, call, served=False):
        make, family = handles(served)

        def fn(x):
            d = make(x)
            s = d.open_session()
            d.close()
            return x.py_refused(lambda: call(x, d, s), VE, ["closed"])
        add(G, ("Client" if served else "Drafter") + f": {name} after close()", fn, family)

    for served in (False, True):
        closed("step", lambda x, d, s: d.step([{"session": s, "anchor": 1}]), served)
        closed("open_session", lambda x, d, s: d.open_session(), served)
        closed("session_length", lambda x, d, s: d.session_length(s), served)
        closed("last_times", lambda x, d, s: d.last_times, served)
    closed("close_session", lambda x, d, s: d.close_session(s))

    def close_twice(x):
        d = drafter(x)
        d.close()
        d.close()
        with drafter(x) as e:
            e.open_session()
        return x.py_refused(lambda: e.open_session(), VE, ["closed"])
    add(G, "Drafter: close() twice, and a call after the with block", close_twice)

    def close_during_step(served):
        make, family = handles(served)

        def fn(x):
            d = make(x)
            s = d.open_session()
            taps = x.taps()
            done, errors = [], []
            started = threading.Event()

            def loop():
                for _ in range(100000):
                    try:
                        r = d.step([{"session": s, "anchor": REF_ANCHOR, "taps": taps, "keep": 0}])
                    except Exception as e:  # noqa: B902 - judged below
                        errors.append(f"{type(e).__name__}: {e}")
                        return
                    done.append([int(t) for t in r[0]["tokens"]])
                    started.set()
            t = threading.Thread(target=loop)
            t.start()
            started.wait(REPLY_S)
            time.sleep(0.02)
            d.close()
            t.join(REPLY_S)
            if t.is_alive():
                return "hang", f"step() still running {REPLY_S} s after close()"
            wrong = [r for r in done if r != x.ref["greedy"]]
            if wrong:
                return "silent wrong", f"a step drafted {wrong[0]}, the reference {x.ref['greedy']}"
            if not errors or not errors[0].startswith("ValueError") or "closed" not in errors[0]:
                return "unclear", f"{len(done)} steps, then: {errors[:1] or 'no error'}"
            return "control ok", ""
        add(G, ("Client" if served else "Drafter") + ": close() from another thread while step() runs", fn, family)

    close_during_step(False)
    close_during_step(True)

    def taps_converted(name, taps, compare=True):
        def fn(x):
            d = drafter(x)
            s = d.open_session()
            try:
                r = d.step([{"session": s, "anchor": REF_ANCHOR, "taps": taps(x)}])[0]
            except Exception as e:  # noqa: B902 - a good request refused
                return "silent wrong", f"refused: {type(e).__name__}: {e}"
            if compare:
                return x.same_as_reference(r["tokens"])
            return ("control ok", "") if all(0 <= t < x.V for t in r["tokens"]) else \
                ("silent wrong", f"tokens {r['tokens'].tolist()}")
        add(G, f"Drafter.step: {name}", fn)

    taps_converted("taps a list of lists of floats", lambda x: x.taps().tolist())
    taps_converted("taps float64", lambda x: x.taps().astype(x.np.float64))
    taps_converted("taps big-endian float32", lambda x: x.taps().astype(">f4"))
    taps_converted("taps Fortran-ordered", lambda x: x.np.asfortranarray(x.taps()))
    taps_converted("taps a strided view", lambda x: x.np.repeat(x.taps(), 2, axis=0)[::2])
    def read_only(x):
        t = x.taps()
        t.setflags(write=False)
        return t
    taps_converted("taps read-only", read_only)
    taps_converted("taps float16", lambda x: x.taps().astype(x.np.float16), compare=False)
    taps_converted("taps [0, width]", lambda x: x.np.zeros((0, x.W), x.np.float32), compare=False)

    def full_dist(x):
        d = drafter(x)
        s = d.open_session()
        r = d.step([{"session": s, "anchor": REF_ANCHOR, "taps": x.taps(), "dist": "full"}])[0]
        sums = r["dist_probs"].sum(axis=1)
        if r["dist_probs"].shape != (x.rows, x.V) or not all(abs(v - 1) < 1e-3 for v in sums):
            return "silent wrong", f"dist_probs {r['dist_probs'].shape}, row sums {sums.tolist()}"
        return x.same_as_reference(r["tokens"])
    add(G, "Drafter.step: dist 'full'", full_dist)

    def threads_share(x):
        d = drafter(x)
        sessions = [d.open_session() for _ in range(4)]
        out, errors = {}, []

        def one(s):
            try:
                for _ in range(20):
                    out[s] = d.step([{"session": s, "anchor": REF_ANCHOR, "taps": x.taps(), "keep": 0}])[0]["tokens"]
            except Exception as e:  # noqa: B902 - judged below
                errors.append(repr(e))
        ts = [threading.Thread(target=one, args=(s,)) for s in sessions]
        for t in ts:
            t.start()
        for t in ts:
            t.join(REPLY_S)
        if errors:
            return "silent wrong", errors[0]
        for s in sessions:
            v = x.same_as_reference(out[s])
            if v[0] != "control ok":
                return v
        return "control ok", ""
    add(G, "Drafter: four threads stepping their own sessions at once", threads_share)

    class Tensor:
        """A framework's tensor known only by DLPack (over a numpy array), or one claiming a device."""

        def __init__(self, array=None, device=(1, 0), export=None):
            self.array, self.device, self.export = array, device, export

        def __dlpack_device__(self):
            return self.device

        def __dlpack__(self, stream=None):
            return self.export() if self.export else self.array.__dlpack__()

    class CudaArray:
        __cuda_array_interface__ = {"shape": (2, 192), "typestr": "<f4", "data": (0xdead0000, False), "version": 3}

    def no_export():
        raise BufferError("this tensor cannot be exported")
    for served in (False, True):
        tensor_taps = [
            ("taps a DLPack tensor on cuda:0", lambda x: Tensor(device=(2, 0)), VE, ["taps", "cuda:0", "host memory"]),
            ("taps a __cuda_array_interface__ object", lambda x: CudaArray(), VE, ["taps", "__cuda_array_interface__"]),
            ("taps a DLPack tensor of int32", lambda x: Tensor(x.np.ones((2, x.W), x.np.int32)), TE,
             ["taps", "DLPack dtype"]),
            ("taps a 3-D DLPack tensor", lambda x: Tensor(x.taps()[None]), VE, ["taps", str(192)]),
            ("taps whose __dlpack__ raises", lambda x: Tensor(export=no_export), ("BufferError",), ["exported"]),
            ("taps whose __dlpack__ gives a str", lambda x: Tensor(export=lambda: "capsule"), TE, ["taps", "dltensor"]),
            ("taps whose __dlpack_device__ is (1,)", lambda x: Tensor(device=(1,)), TE, ["taps", "__dlpack_device__"]),
            ("taps with a DLPack NaN", lambda x: Tensor(x.poisoned(NAN)), AE, ["entry 0", "NaN"]),
        ]
        for name, taps, want, names in tensor_taps:
            step_refused(name, {}, want, names, served, taps=taps)
        step_refused("stream 'now'", {"stream": "now"}, TE, ["stream"], served,
                     taps=lambda x: Tensor(x.taps()))
        for value, want in [("jax", VE), (None, TE), (1, TE)]:
            make, family = handles(served)
            refused(("Client" if served else "Drafter") + f".step(out={value!r})",
                    lambda x, make=make, value=value: make(x).step([{"session": 1, "anchor": 1}], out=value), want,
                    ["out"], family)
    taps_converted("taps a DLPack-only tensor", lambda x: Tensor(x.taps()))
    taps_converted("taps a strided DLPack-only tensor", lambda x: Tensor(x.np.repeat(x.taps(), 2, axis=0)[::2]))
    taps_converted("taps a column-major DLPack-only tensor", lambda x: Tensor(x.np.asfortranarray(x.taps())))

    refused("set_log_level('verbose')", lambda x: x.tpdraft.set_log_level("verbose"), AE, ["verbose", "log level"])
    refused("set_log_level(None)", lambda x: x.tpdraft.set_log_level(None), TE, ["set_log_level"])
    refused("set_log_level('info' + NUL)", lambda x: x.tpdraft.set_log_level("info\0debug"), VE, ["level", "NUL"])
    refused("set_log_callback(5)", lambda x: x.tpdraft.set_log_callback(5), TE, ["set_log_callback", "callable"])

    def logging_callback(callback):
        def fn(x):
            reported = []
            sys.unraisablehook = lambda u: reported.append(u.exc_value)
            x.tpdraft.set_log_callback(lambda level, line: callback(x))
            x.tpdraft.set_log_level("debug")
            d = drafter(x, tp=2)
            s = d.open_session()
            r = d.step([{"session": s, "anchor": REF_ANCHOR, "taps": x.taps()}])[0]
            x.tpdraft.set_log_callback(None)
            x.tpdraft.set_log_level("warn")
            if not reported:
                return "silent wrong", "no log line reached the callback, or its exception was lost"
            return x.same_as_reference(r["tokens"])
        return fn

    def raising(x):
        raise RuntimeError("a host's callback failed")

    def resetting(x):
        x.tpdraft.set_log_callback(None)  # refused inside the callback: the ArgumentError is reported
    add(G, "set_log_callback: a callback that raises, then a step", logging_callback(raising))
    add(G, "set_log_callback: a callback that replaces itself, then a step", logging_callback(resetting))

    def client_opt(name, options, want, names, address=None):
        refused(f"Client({name})", lambda x: x.tpdraft.Client(address(x) if address else x.address, **options), want,
                names, "pyclient")

    client_opt("address=5", {}, TE, ["address"], address=lambda x: 5)
    client_opt("address='bogus'", {}, VE, ["bogus"], address=lambda x: "bogus")
    client_opt("timeout='x'", {"timeout": "x"}, TE, ["timeout"])
    client_opt("timeout=-1", {"timeout": -1.0}, VE, ["timeout"])
    client_opt("timeout=nan", {"timeout": NAN}, VE, ["timeout"])
    client_opt("ring_bytes=100", {"ring_bytes": 100}, VE, ["ring_bytes"])
    client_opt("ring_bytes=-5", {"ring_bytes": -5}, VE, ["ring_bytes"])
    client_opt("ring_bytes=2**70", {"ring_bytes": 2 ** 70}, TE, ["ring_bytes"])
    client_opt("shared_memory='yes'", {"shared_memory": "yes"}, TE, ["shared_memory"])
    client_opt("shared_memory=True over tcp", {"shared_memory": True}, VE, ["tcp://127.0.0.1:9"],
               address=lambda x: "tcp://127.0.0.1:9")
    if "server_key" in client_option_fields():
        client_opt("server_key=5", {"server_key": 5}, TE, ["server_key"])
        client_opt("server_key='nokey'", {"server_key": "nokey", "timeout": 2.0}, VE, ["server_key", "nokey"])
    client_opt("an address with a NUL byte", {"timeout": 2.0}, ("ValueError", "Error"), [("NUL", "null")],
               address=lambda x: x.address + "\0" + "/none")

    def client_others(x):
        a, b = client(x), client(x)
        theirs = a.open_session()
        b.open_session()
        verdict = x.py_refused(lambda: b.step([{"session": theirs, "anchor": 1, "taps": x.taps()}]), AE,
                               ["entry 0", f"session {theirs}"])
        if verdict[0] != "clear error":
            return verdict
        r = a.step([{"session": theirs, "anchor": REF_ANCHOR, "taps": x.taps()}])[0]
        return x.same_as_reference(r["tokens"])
    add(G, "Client.step: another client's session, then its owner drafts the reference", client_others, "pyclient")

    def client_after_bad(x):
        c = client(x)
        s = c.open_session()
        for e in ({"taps": x.poisoned(NAN)}, {"anchor": -1}, {"temperature": 1e-310}, {"dist": 9999}):
            try:
                c.step([dict({"session": s, "anchor": REF_ANCHOR, "taps": x.taps()}, **e)])
                return "silent wrong", f"{e} accepted"
            except x.tpdraft.ArgumentError:
                pass
        r = c.step([{"session": s, "anchor": REF_ANCHOR, "taps": x.taps()}])[0]
        stats = c.stats()
        if stats["errors"] < 4:
            return "silent wrong", f"the server counts {stats['errors']} errors after 4 refusals"
        return x.same_as_reference(r["tokens"])
    add(G, "Client: a good step after four refused ones drafts the reference", client_after_bad, "pyclient")


# ---- raw frames -----------------------------------------------------------------------------------

def frame_cases(add):
    G, F = "serve frames", "frames"

    def case(name, fn, after=None):
        add(G, name, fn, F, after)

    def send_raw(name, frames, want, names):
        def fn(x):
            r = x.raw()
            r.send(*[f(x, r) if callable(f) else f for f in frames])
            return x.wire_refused(r.recv(), want, names)
        case(name, fn)

    M, A = ("malformed",), ("argument",)
    send_raw("an empty frame", [b""], M, ["0 bytes", "header"])
    send_raw("1 byte", [b"T"], M, ["1 bytes", "header"])
    send_raw("the header less its last byte", [lambda x, r: r.frame("stats")[:-1]], M, ["23 bytes", "header"])
    send_raw("magic 'TPD2'", [lambda x, r: r.frame("stats", magic=0x32445054)], M, ["header.magic"])
    send_raw("magic 0", [lambda x, r: r.frame("stats", magic=0)], M, ["header.magic"])
    for v in ("previous", "next", 0, 0xFFFF):
        def version(x, r, v=v):
            n = {"previous": x.proto.version - 1, "next": x.proto.version + 1}.get(v, v)
            return r.frame("stats", version=n)
        send_raw(f"protocol version {v}", [version], M, ["version", ("protocol version",)])
    # Kinds no server of this version knows (new kinds may come without a new version: past the
    # last one of protocol.h), and a reply's kind.
    for k in (0, "next", 0x7FFF):
        def unknown(x, r, k=k, body=b""):
            return r.frame(max(x.proto.kinds.values()) + 1 if k == "next" else k, body)
        send_raw(f"kind {k}" if k != "next" else "the kind after the last known one", [unknown], M, ["kind"])
    send_raw("the kind after the last known one, with a body",
             [lambda x, r: r.frame(max(x.proto.kinds.values()) + 1, b"\xff" * 1000)], M, ["kind"])
    send_raw("a reply's kind (HELLO | reply)", [lambda x, r: r.frame(x.proto.kinds["hello"] | x.proto.reply_flag)],
             M, ["kind"])
    send_raw("status 1 in a request", [lambda x, r: r.frame("stats", status=1)], M, ["status"])
    send_raw("count 3 on OPEN", [lambda x, r: r.frame("open", count=3)], M, ["count", "3"])
    send_raw("two frames", [lambda x, r: r.frame("stats"), lambda x, r: r.frame("stats")], M, ["one frame", "2"])
    send_raw("an empty frame, then a request", [b"", lambda x, r: r.frame("stats")], M, ["one frame", "2"])
    send_raw("three frames", [lambda x, r: r.frame("open")] * 3, M, ["one frame", "3"])
    for kind, body in (("open", b""), ("stats", b""), ("close", struct.pack("<q", 0)),
                       ("length", struct.pack("<q", 0)), ("bye", b""),
                       ("hello", struct.pack("<I", 0) + struct.pack("<Q", 0))):
        send_raw(f"{kind.upper()} with trailing bytes",
                 [lambda x, r, kind=kind, body=body: r.frame(kind, body + b"zz")],
                 M, ["past the end", kind.upper()])
    send_raw("HELLO: ring name longer than the frame", [lambda x, r: r.frame("hello", struct.pack("<I", 100) + b"/x")],
             M, ["hello.ring_name"])
    send_raw("HELLO: ring name length 2^32-1", [lambda x, r: r.frame("hello", struct.pack("<I", U32_MAX))], M,
             ["hello.ring_name", str(U32_MAX)])
    send_raw("HELLO: no ring size", [lambda x, r: r.frame("hello", struct.pack("<I", 0))], M, ["hello.ring_bytes"])
    send_raw("HELLO: a ring name of 256 bytes",
             [lambda x, r: r.frame("hello", struct.pack("<I", 256) + b"/" + b"a" * 255 + struct.pack("<Q", 1 << 20))],
             M, ["hello.ring_name", "256"])
    send_raw("CLOSE without a session", [lambda x, r: r.frame("close")], M, ["session"])
    send_raw("CLOSE with half a session id", [lambda x, r: r.frame("close", b"\0" * 4)], M, ["session"])
    send_raw("LENGTH without a session", [lambda x, r: r.frame("length")], M, ["session"])
    send_raw("CLOSE of a session never opened", [lambda x, r: r.frame("close", struct.pack("<q", 777777))], A,
             ["session 777777"])
    send_raw("LENGTH of a session never opened", [lambda x, r: r.frame("length", struct.pack("<q", -5))], A,
             ["session -5"])

    def others(kind):
        def fn(x):
            a, b = x.raw(), x.raw()
            theirs = a.open()
            b.open()
            verdict = x.wire_refused(b.ask(kind, struct.pack("<q", theirs)), A, [f"session {theirs}", "client"])
            if verdict[0] == "clear error" and a.length(theirs) != 0:
                return "silent wrong", "the owner's session changed"
            return verdict
        case(f"{kind.upper()} of another client's session", fn)
    others("close")
    others("length")

    def close_twice(x):
        r = x.raw()
        s = r.open()
        if r.ask("close", struct.pack("<q", s)).status != 0:
            raise Harness("CLOSE refused")
        return x.wire_refused(r.ask("close", struct.pack("<q", s)), A, [f"session {s}"])
    case("CLOSE twice", close_twice)

    def step_case(name, build, want, names, count=None):
        """A STEP of the entries and taps area build(x, raw, session) gives, count entries."""
        def fn(x):
            r = x.raw()
            s = r.open()
            entries, area = build(x, r, s)
            verdict = x.wire_refused(r.step(entries, area, count=len(entries) if count is None else count), want,
                                     names)
            if verdict[0] == "clear error" and r.length(s) != 0:
                return "silent wrong", f"refused ({verdict[1]}), but session {s} moved"
            return verdict
        case(f"STEP: {name}", fn)

    for count in (0, 9, U32_MAX):
        def fn(x, count=count):
            r = x.raw()
            s = r.open()
            e, area = r.good(s)
            return x.wire_refused(r.step([e], area, count=count), A, [str(count)])
        case(f"STEP: count {count} (one entry given)", fn)
    step_case("count 1, no entry", lambda x, r, s: ([], b""), M, ["entry.session"], count=1)
    step_case("count 1, half an entry", lambda x, r, s: ([r.good(s)[0][:x.proto.entry_bytes // 2]], b""), M,
              ["entry."])
    step_case("count 2, one entry", lambda x, r, s: ([r.good(s)[0]], b""), M, ["entry.session"], count=2)
    step_case("an entry of 0xff bytes", lambda x, r, s: ([b"\xff" * x.proto.entry_bytes], b""), A,
              ["entry 0", "session -1"])
    step_case("a session never opened", lambda x, r, s: r.good_step(4242), A,
              ["entry 0", "session 4242"])

    def other_session(x):
        a, b = x.raw(), x.raw()
        theirs = a.open()
        b.open()
        e, area = b.good(theirs)
        verdict = x.wire_refused(b.step([e], area), A, ["entry 0", f"session {theirs}"])
        if verdict[0] == "clear error" and a.length(theirs) != 0:
            return "silent wrong", "the owner's session moved"
        return verdict
    case("STEP: another client's session", other_session)

    # Each field of an entry at its extremes: refused naming the entry and the value, or (None:
    # the value is valid) drafting the reference. The other fields are the reference request's.
    extremes = [
        ("session", -1, ["entry 0", "session -1"]), ("session", I64_MAX, ["entry 0", str(I64_MAX)]),
        ("session", I64_MIN, ["entry 0", str(I64_MIN)]),
        ("keep", 1, ["entry 0", "keep 1"]), ("keep", I64_MAX, ["entry 0", "keep"]),
        ("keep", I64_MIN, ["entry 0", "keep"]),
        ("p0", 1, ["entry 0", "p0 1"]), ("p0", I64_MAX, ["entry 0", "p0"]), ("p0", I64_MIN, ["entry 0", "p0"]),
        ("n_new", -1, ["entry 0", "n_new -1"]), ("n_new", 0, ["entry 0", "taps_bytes"]),
        ("n_new", I64_MAX, ["entry 0", "n_new"]), ("n_new", I64_MIN, ["entry 0", "n_new"]),
        ("n_new", 4097, ["entry 0", "n_new 4097"]),
        ("anchor", -1, ["entry 0", "anchor"]), ("anchor", 257, ["entry 0", "anchor", "257"]),
        ("anchor", I64_MAX, ["entry 0", "anchor"]),
        ("dist_width", -2, ["entry 0", "-2"]), ("dist_width", I64_MAX, ["entry 0", str(I64_MAX)]),
        ("dist_width", I64_MIN, ["entry 0", str(I64_MIN)]), ("dist_width", -1, None),
        ("top_k", -1, ["entry 0", "top_k"]), ("top_k", I64_MAX, ["entry 0", "top_k"]),
        ("top_k", 1, ["entry 0", "top_k"]),
        ("temperature", NAN, ["entry 0", "temperature"]), ("temperature", -1.0, ["entry 0", "temperature"]),
        ("temperature", INF, ["entry 0", "temperature"]), ("temperature", 5e-324, ["entry 0", "temperature"]),
        ("temperature", -0.0, None), ("top_p", NAN, ["entry 0", "top_p"]), ("top_p", 0.0, ["entry 0", "top_p"]),
        ("top_p", 1.0000001, ["entry 0", "top_p"]), ("top_p", -INF, ["entry 0", "top_p"]),
        ("seed", U64_MAX, None),
        ("taps_dtype", 3, ["entry 0", "taps_dtype 3"]), ("taps_dtype", U32_MAX, ["entry 0", "taps_dtype"]),
        ("taps_dtype", 1, ["entry 0", "taps_bytes"]),
        ("taps_where", 3, ["entry 0", "taps_where 3"]), ("taps_where", U32_MAX, ["entry 0", "taps_where"]),
        ("taps_where", 0, ["entry 0", "no taps"]), ("taps_where", 2, ["entry 0", "ring"]),
        ("taps_offset", 1, ["entry 0", "offset 1"]), ("taps_offset", U64_MAX, ["entry 0", str(U64_MAX)]),
        ("taps_offset", 2 ** 63, ["entry 0", str(2 ** 63)]),
        ("taps_bytes", 0, ["entry 0", "taps_bytes 0"]), ("taps_bytes", U64_MAX, ["entry 0", str(U64_MAX)]),
        ("taps_bytes", "one more", ["entry 0", "taps_bytes"]),
    ]
    for field, value, names in extremes:
        def fn(x, field=field, value=value, names=names):
            r = x.raw()
            s = r.open()
            v = len(x.taps().tobytes()) + 1 if value == "one more" else value
            e, area = r.good(s, **{field: v})
            reply = r.step([e], area)
            if names is not None:
                verdict = x.wire_refused(reply, A, names)
                if verdict[0] == "clear error" and r.length(s) != 0:
                    return "silent wrong", f"refused ({verdict[1]}), but session {s} moved"
                return verdict
            if reply is None:
                return "hang", x.no_reply()
            if reply.status != 0:
                return "silent wrong", f"a valid {field} {value} refused: {reply.message}"
            return x.same_as_reference(r.tokens(reply))
        case(f"STEP: entry.{field} = {value!r}", fn)

    for offset in (1, 2, 4):
        def misaligned(x, offset=offset):
            r = x.raw()
            s = r.open()
            e, area = r.good(s, offset=offset)
            reply = r.step([e], area)
            if reply is None or reply.status != 0:
                return ("hang", x.no_reply()) if reply is None else ("silent wrong", f"refused: {reply.message}")
            return x.same_as_reference(r.tokens(reply))
        case(f"STEP: inline taps at offset {offset} (misaligned)", misaligned)

    for name, value, names in (("NaN", NAN, ["entry 0", "NaN", "column 7"]), ("Inf", INF, ["entry 0", "Inf"]),
                               ("3e38", 3e38, ["entry 0", "2^30"])):
        step_case(f"{name} in the inline taps", lambda x, r, s, value=value: r.good_step(s, taps=x.poisoned(value)),
                  A, names)

    step_case("bf16 NaN in the inline taps", lambda x, r, s: r.good_step(s, taps=x.poisoned(None, raw=0x7FC0),
                                                                        taps_dtype=1), A, ["entry 0", "NaN"])

    def repeated(x):
        r = x.raw()
        s = r.open()
        e, area = r.good(s)
        return x.wire_refused(r.step([e, e], area), A, ["entry 1", "twice"])
    case("STEP: one session in two entries", repeated)

    def second_bad(x):
        r = x.raw()
        s0, s1 = r.open(), r.open()
        e0, area = r.good(s0)
        e1, _ = r.good(s1, anchor=-3)
        verdict = x.wire_refused(r.step([e0, e1], area), A, ["entry 1", "anchor"])
        if verdict[0] == "clear error" and (r.length(s0), r.length(s1)) != (0, 0):
            return "silent wrong", "refused, but a session moved"
        return verdict
    case("STEP: entry 1 bad, entry 0 good (nothing may change)", second_bad)

    def hello_while_pending(x):
        r = x.raw()
        sessions = [r.open() for _ in range(3)]
        frames = []
        for s in sessions:
            e, area = r.good(s)
            frames.append(r.frame("step", e + area, count=1))
        ids = list(range(r.id - 2, r.id + 1))
        hello = r.frame("hello", struct.pack("<I", 0) + struct.pack("<Q", 0))
        for f in frames:
            r.send(f)
        r.send(hello)
        replies = {}
        deadline = time.monotonic() + REPLY_S
        while len(replies) < 4 and time.monotonic() < deadline:
            got = r.recv(max(0.01, deadline - time.monotonic()))
            if got is not None:
                replies[got.h["id"]] = got
        if len(replies) < 4:
            return "hang", f"{len(replies)} of 4 replies"
        for i in ids:
            if replies[i].status != 0:
                return "silent wrong", f"a STEP was refused: {replies[i].message}"
            v = x.same_as_reference(r.tokens(replies[i]))
            if v[0] != "control ok":
                return v
        h = replies[r.id]
        if h.status == 0:
            return "control ok", "HELLO answered after the STEPs"
        return x.wire_refused(h, A, ["HELLO", "in flight"])
    case("HELLO while STEPs are queued", hello_while_pending)

    def bell_alone(x):
        r = x.raw()
        r.send(r.frame("bell"))
        reply = r.ask("stats")
        if reply is None:
            return "hang", "no reply to STATS after a BELL"
        if reply.h["id"] != r.id or reply.status != 0:
            return "silent wrong", f"the reply after a BELL: id {reply.h['id']}, {reply.status_name} {reply.message}"
        return "control ok", ""
    case("BELL without a ring, then STATS", bell_alone)

    def bye_then_step(x):
        r = x.raw()
        s = r.open()
        if r.ask("bye").status != 0:
            raise Harness("BYE refused")
        e, area = r.good(s)
        return x.wire_refused(r.step([e], area), A, ["entry 0", f"session {s}"])
    case("STEP of a session after BYE", bye_then_step)

    def step_then_close(x):
        r = x.raw()
        s = r.open()
        e, area = r.good(s)
        r.send(r.frame("step", e + area, count=1))
        step_id = r.id
        r.send(r.frame("close", struct.pack("<q", s)))
        close_id = r.id
        replies = {}
        while len(replies) < 2:
            got = r.recv()
            if got is None:
                return "hang", f"{len(replies)} of 2 replies"
            replies[got.h["id"]] = got
        if replies[close_id].status != 0:
            return "silent wrong", f"CLOSE refused: {replies[close_id].message}"
        st = replies[step_id]
        if st.status == 0:
            return x.same_as_reference(r.tokens(st))
        return x.wire_refused(st, A, ["entry 0", f"session {s}"])
    case("STEP, then CLOSE of its session before the reply", step_then_close)

    def flood(x):
        r = x.raw()
        s = r.open()
        e, area = r.good(s, keep=0)
        first = r.id + 1
        for _ in range(40):
            r.send(r.frame("step", e + area, count=1))
        replies = {}
        deadline = time.monotonic() + 3 * REPLY_S
        while len(replies) < 40 and time.monotonic() < deadline:
            got = r.recv(max(0.01, deadline - time.monotonic()))
            if got is not None:
                replies[got.h["id"]] = got
        if len(replies) < 40:
            return "hang", f"{len(replies)} of 40 replies"
        statuses = {replies[i].status_name for i in range(first, first + 40)}
        bad = statuses - {"ok", "busy"}
        if bad:
            return "silent wrong", f"statuses {sorted(statuses)}"
        for i in range(first, first + 40):
            if replies[i].status == 0:
                v = x.same_as_reference(r.tokens(replies[i]))
                if v[0] != "control ok":
                    return v
        return "control ok", ", ".join(sorted(statuses))
    case("40 STEPs sent at once, none waited for", flood)

    def too_large(x):
        r = x.raw()
        s = r.open()
        ms, mc = x.ref["max_sessions"], x.ref["max_context"]
        largest = x.proto.header_bytes + ms * (x.proto.entry_bytes + 8) + ms * mc * x.W * 4 + 4096
        e, _ = r.good(s)
        r.send(r.frame("step", e + b"\0" * (largest + 1024 - x.proto.entry_bytes), count=1))
        got = r.recv(QUIET_S + 2)
        r2 = x.raw()
        alive = r2.ask("stats")
        if alive is None or alive.status != 0:
            return "hang", "the server did not answer another client after the large frame"
        if got is None:
            return "clear error", "dropped without a reply (ZeroMQ's ZMQ_MAXMSGSIZE), as docs/protocol.md says"
        return x.wire_refused(got, A + M, ["bytes"])
    case("a frame past the largest valid request", too_large)

    def too_many_sessions(x):
        r = x.raw()
        for i in range(33):
            got = r.ask("open")
            if got is None:
                return "hang", "no reply to OPEN"
            if got.status != 0:
                return x.wire_refused(got, A, ["--max-open-sessions"])
        return "silent wrong", "33 sessions open under --max-open-sessions 32"
    case("OPEN past --max-open-sessions", too_many_sessions)

    case("after every frame above, a C client drafts the reference", lambda x: client_drafts_reference(x, False))

    def shutdown(x):
        r = x.raw()
        reply = r.ask("shutdown")
        if reply is None:
            return "hang", "no reply to SHUTDOWN"
        return ("control ok", "") if reply.status == 0 else ("silent wrong", f"SHUTDOWN refused: {reply.message}")
    case("SHUTDOWN (the last case: the server must then end, status 0, its files removed)", shutdown,
         after="shutdown")


# ---- rings ----------------------------------------------------------------------------------------

def ring_cases(add):
    G, F = "rings", "rings"
    MiB = 1 << 20

    def case(name, fn):
        add(G, name, fn, F)

    def unmapped(name, setup, names, nbytes=MiB, want=None):
        """A HELLO naming what no client's ring can be: the reply must say the ring is not mapped,
        and why (or refuse the HELLO itself when `want` says so)."""
        def fn(x):
            r = x.raw()
            ring_name = setup(x)
            reply = r.hello(ring_name, nbytes)
            if reply is None:
                return "hang", "no reply to HELLO"
            if want:
                return x.wire_refused(reply, want, names)
            if reply.status != 0:
                return "unclear", f"HELLO refused: {reply.status_name} {reply.message}"
            mapped, note = r.hello_ring(reply)
            if mapped:
                return "silent wrong", f"the server mapped {ring_name!r}"
            missing = x.missing(note, names)
            return ("unclear", f"the note names no {', '.join(missing)}: {note}") if missing else ("clear error", note)
        case(f"HELLO: {name}", fn)

    def seg(size=MiB, mode=0o600, name=None):
        return lambda x: Segment(x, size, name=name(x) if name else None, mode=mode).name

    unmapped("a name without the tpdraft prefix", seg(name=lambda x: f"/{x.shm_tag}-{os.getpid()}"),
             ["does not start with"])
    unmapped("a name without the leading slash",
             lambda x: Segment(x, MiB).name.lstrip("/"), ["not a POSIX shared-memory name"])
    unmapped("a name with a slash inside", lambda x: x.proto.ring_prefix + "a/../b", ["not a POSIX"])
    unmapped("'/'", lambda x: "/", ["not a POSIX"])
    unmapped("a name that does not exist", lambda x: x.proto.ring_prefix + f"none-{os.getpid()}", ["cannot open"])
    unmapped("a name of 255 bytes", lambda x: x.proto.ring_prefix + "n" * (255 - len(x.proto.ring_prefix)),
             ["cannot open"])
    unmapped("mode 644", seg(mode=0o644), ["644"])
    unmapped("mode 660", seg(mode=0o660), ["660"])
    unmapped("mode 606", seg(mode=0o606), ["606"])

    def owned_by_nobody(x):
        s = Segment(x, MiB)
        os.chown(s.path, 65534, 65534)
        return s.name
    unmapped("another user's segment", owned_by_nobody, ["owner 65534"])

    def symlink(x):
        target = Segment(x, MiB)
        link = Segment(x, 0, create=False)
        os.symlink(target.path, link.path)
        return link.name
    unmapped("a symlink to a client's ring", symlink, ["cannot open"])

    def directory(x):
        s = Segment(x, 0, create=False)
        os.mkdir(s.path, 0o700)
        x.closers.append(lambda: os.rmdir(s.path))
        return s.name
    unmapped("a directory", directory, ["shared memory"])

    def fifo(x):
        s = Segment(x, 0, create=False)
        os.mkfifo(s.path, 0o600)
        return s.name
    unmapped("a FIFO", fifo, ["shared memory"])
    unmapped("a segment of 4096 bytes (the control block only)", seg(size=4096), ["holds 4096"], nbytes=4096)
    unmapped("a segment smaller than the size named", seg(size=64 * 1024), ["holds 65536", str(MiB)], nbytes=MiB)
    unmapped("ring bytes 0", seg(), ["0"], nbytes=0)
    unmapped("ring bytes 2^64-1", seg(), [str(U64_MAX)], nbytes=U64_MAX)

    def nul_name(x):
        s = Segment(x, MiB)
        return s.name + "\0" + "/../other"
    unmapped("a client's ring name, a NUL byte, then a path", nul_name, ["not a POSIX"])

    def ringed(x, size=MiB, **kw):
        r = x.raw()
        s = Segment(x, size, **kw)
        reply = r.hello(s.name, size)
        if reply is None or reply.status != 0 or not r.hello_ring(reply)[0]:
            raise Harness(f"HELLO with a good ring: {reply.message if reply else 'no reply'}"
                          f" {r.hello_ring(reply) if reply is not None and reply.status == 0 else ''}")
        return r, s

    def ring_step(x, r, s, taps_at=None, **fields):
        """A STEP whose taps lie in the ring at taps_at (default: past the control block)."""
        t = x.taps().tobytes()
        at = x.proto.ring_control_bytes if taps_at is None else taps_at
        if x.proto.ring_control_bytes <= at and at + len(t) <= s.size:
            s.map[at:at + len(t)] = t
        sess = fields.pop("session", None)
        sess = r.open() if sess is None else sess
        f = {"session": sess, "anchor": REF_ANCHOR, "n_new": REF_ROWS, "taps_where": x.proto.where["tapsring"],
             "taps_offset": at, "taps_bytes": len(t)}
        f.update(fields)
        return sess, r.entry(**f)

    def good_ring(x):
        r, s = ringed(x)
        sess, e = ring_step(x, r, s)
        reply = r.step([e])
        if reply is None or reply.status != 0:
            return ("hang", x.no_reply()) if reply is None else ("silent wrong", f"refused: {reply.message}")
        reply = s.request(r, r.frame("step", ring_step(x, r, s, taps_at=2 * x.proto.ring_control_bytes,
                                                            keep=0, session=sess)[1], count=1),
                          at=x.proto.ring_control_bytes + 64 * 1024)
        if reply is None or reply.status != 0:
            return ("hang", "no reply in the ring") if reply is None else ("silent wrong", f"refused: {reply.message}")
        return x.same_as_reference(r.tokens(reply))
    case("a good ring: taps in it, then a request and its reply through it", good_ring)

    def in_ring(name, place, names, want=("malformed",)):
        def fn(x):
            r, s = ringed(x)
            reply = place(x, r, s)
            return x.wire_refused(reply, want, names)
        case(f"ring request: {name}", fn)

    size = MiB
    in_ring("at the ring's end", lambda x, r, s: s.request(r, r.frame("stats"), at=size, reply_at=8192,
                                                          reply_capacity=8192), ["outside the ring"])
    in_ring("inside the control block", lambda x, r, s: s.request(r, r.frame("stats"), at=0, reply_at=8192,
                                                                 reply_capacity=8192), ["outside the ring"])
    in_ring("at offset 2^64-8", lambda x, r, s: s.request(r, r.frame("stats"), at=U64_MAX - 7, reply_at=8192,
                                                         reply_capacity=8192), ["outside the ring"])
    in_ring("of 2^63 bytes", lambda x, r, s: s.request(r, r.frame("stats"), request_bytes=2 ** 63),
            ["outside the ring"])
    in_ring("of 0 bytes", lambda x, r, s: s.request(r, r.frame("stats"), request_bytes=0), ["0 bytes", "header"])
    in_ring("a HELLO through the ring", lambda x, r, s: s.request(
        r, r.frame("hello", struct.pack("<I", 0) + struct.pack("<Q", 0))), ["HELLO", "socket"])
    in_ring("taps past the ring's end", lambda x, r, s: s.request(r, r.frame("step", ring_step(
        x, r, s, taps_at=size - 100)[1], count=1)), ["entry 0", "offset", "ring"], ("argument",))
    in_ring("taps at offset 2^64-1", lambda x, r, s: s.request(r, r.frame("step", ring_step(
        x, r, s, taps_offset=U64_MAX)[1], count=1)), ["entry 0", str(U64_MAX)], ("argument",))
    in_ring("taps in the control block (offset 0)", lambda x, r, s: s.request(r, r.frame("step", ring_step(
        x, r, s, taps_at=0)[1], count=1)), ["entry 0", "offset"], ("argument",))

    def reply_area(name, reply_at, capacity, words):
        def fn(x):
            r, s = ringed(x)
            since = x.log_size()
            seq_before = s.get("reply_seq")
            got = s.request(r, r.frame("stats"), reply_at=reply_at(s) if callable(reply_at) else reply_at,
                            reply_capacity=capacity, wait=QUIET_S)
            if got is not None or s.get("reply_seq") != seq_before:
                return "silent wrong", "the server wrote a reply into an area that is not the ring's"
            line = x.log_line(since, words)
            if line is None:
                return "hang", f"no reply, and the server logged nothing with {words}"
            alive = r.ask("stats")
            if alive is None or alive.status != 0:
                return "hang", "the client's next request through the socket was not answered"
            return "clear error", line
        case(f"ring reply area {name}", fn)

    outside = ["reply area outside the ring"]
    reply_area("at the ring's end", lambda s: s.size, 4096, outside)
    reply_area("inside the control block", 0, 4096, outside)
    reply_area("of 2^64-1 bytes", 8192, U64_MAX, outside)
    reply_area("at 2^64-64", U64_MAX - 63, 64, outside)
    reply_area("of 10 bytes", 8192, 10, outside)

    def reply_too_small(x):
        """64 bytes, in the ring, too few for STATS' reply: an error that fits them, or a log line."""
        r, s = ringed(x)
        since = x.log_size()
        got = s.request(r, r.frame("stats"), reply_at=8192, reply_capacity=64, wait=QUIET_S)
        if got is not None:
            if s.get("reply_bytes") > 64:
                return "silent wrong", f"a reply of {s.get('reply_bytes')} bytes written into an area of 64"
            if got.status == 0:
                return "silent wrong", "an ok reply in 64 bytes, too few for STATS' reply"
            return "clear error", f"{got.status_name}: {got.message}"
        line = x.log_line(since, ["[warning]", "reply"])
        return ("clear error", line) if line else ("hang", "no reply, and the server logged nothing of it")
    case("ring reply area too small for the reply (64 bytes)", reply_too_small)

    def unlinked(x):
        r, s = ringed(x)
        s.unlink()
        sess, e = ring_step(x, r, s)
        reply = r.step([e])
        if reply is None or reply.status != 0:
            return ("hang", x.no_reply()) if reply is None else ("silent wrong", f"refused: {reply.message}")
        return x.same_as_reference(r.tokens(reply))
    case("a ring unlinked after HELLO still carries taps", unlinked)

    def replaced(x):
        r, old = ringed(x)
        new = Segment(x, 2 * MiB)
        reply = r.hello(new.name, 2 * MiB)
        if reply is None or reply.status != 0 or not r.hello_ring(reply)[0]:
            return "silent wrong", f"a second HELLO's ring was not mapped: {reply.message if reply else 'no reply'}"
        stale = old.request(r, r.frame("stats"), wait=QUIET_S)
        if stale is not None:
            return "silent wrong", "the server still answers through the ring the second HELLO replaced"
        sess, e = ring_step(x, r, new)
        got = new.request(r, r.frame("step", e, count=1), at=64 * 1024)
        if got is None or got.status != 0:
            return ("hang", "no reply in the new ring") if got is None else ("silent wrong", got.message)
        return x.same_as_reference(r.tokens(got))
    case("a second HELLO replaces the ring (the old one is no longer read)", replaced)

    def hello_during_ring_step(x):
        r, s = ringed(x)
        sess, e = ring_step(x, r, s)
        frame = r.frame("step", e, count=1)
        step_id = r.id
        s.map[64 * 1024:64 * 1024 + len(frame)] = frame
        s.put("request_offset", 64 * 1024)
        s.put("request_bytes", len(frame))
        s.put("reply_offset", 128 * 1024)
        s.put("reply_capacity", 64 * 1024)
        seq = s.get("request_seq") + 1
        s.put("request_seq", seq)
        r.send(r.frame("bell"))
        h = r.hello(b"", 0)
        if h is None:
            return "hang", "no reply to HELLO"

        def step_reply():
            got = Reply(x.proto, bytes(s.map[128 * 1024:128 * 1024 + s.get("reply_bytes")]))
            if got.h.get("id") != step_id or got.status != 0:
                return "silent wrong", f"the STEP's reply: {got.status_name} {got.message}"
            return x.same_as_reference(r.tokens(got))
        if h.status == 0:
            # One thread serves: a STEP it took from the ring was answered before this HELLO, which
            # found none queued. Else the HELLO came first and dropped the ring with the STEP in it.
            if s.get("reply_seq") == seq:
                v = step_reply()
                return v if v[0] != "control ok" else ("control ok", "HELLO answered after the STEP")
            return "control ok", "HELLO dropped the ring before the server read the STEP in it"
        verdict = x.wire_refused(h, ("argument",), ["HELLO", "in flight"])
        deadline = time.monotonic() + REPLY_S
        while s.get("reply_seq") != seq:
            if time.monotonic() > deadline or x.server_gone():
                return "hang", "HELLO was refused for the STEP in flight, but the STEP was not answered"
            time.sleep(0.001)
        v = step_reply()
        return verdict if v[0] == "control ok" else v
    case("HELLO while a STEP in the ring is queued", hello_during_ring_step)

    # A ring the client shrinks under the server's mapping: the server's next access beyond the
    # new end would fault (SIGBUS). None of this may end the server; this worker never touches
    # the pages it cut off.
    def shrunk_taps(x):
        r, s = ringed(x)
        s.shrink(4096)
        return x.wire_refused(r.step([ring_step(x, r, s, taps_at=64 * 1024)[1]]), ("argument",), ["entry 0", "ring"])
    case("a ring shrunk to 4096 bytes after HELLO, then a STEP with taps past them", shrunk_taps)

    def shrunk_request(x):
        r, s = ringed(x)
        frame = r.frame("stats")
        s.map[64 * 1024:64 * 1024 + len(frame)] = frame
        s.shrink(4096)
        since = x.log_size()
        got = s.request(r, frame, at=64 * 1024, reply_at=8192, reply_capacity=4096, wait=QUIET_S)
        if got is not None:
            return "silent wrong", "a request the ring no longer holds was answered"
        line = x.log_line(since, ["[warning]", "ring"])
        alive = r.ask("stats")
        if alive is None or alive.status != 0:
            return "hang", "the client's next request through the socket was not answered"
        return ("clear error", line) if line else ("hang", "no reply, and the server logged nothing of the ring")
    case("a ring shrunk to 4096 bytes after HELLO, then a request in it past them", shrunk_request)

    def shrunk_to_nothing(x):
        r, s = ringed(x)
        s.shrink(0)
        r.send(r.frame("bell"))
        reply = r.ask("stats")
        if reply is None:
            return "hang", "no reply to STATS through the socket"
        return ("control ok", "") if reply.status == 0 else ("unclear", f"{reply.status_name}: {reply.message}")
    case("a ring shrunk to 0 bytes after HELLO, then a doorbell and STATS through the socket", shrunk_to_nothing)

    case("after every ring above, a C client with a ring drafts the reference",
         lambda x: client_drafts_reference(x, True))


def client_drafts_reference(x, ring):
    """The control after a run of served cases: a fresh C client (with a ring, or without) opens a
    session and drafts what the reference drafts."""
    api = Api(x, True)
    h = x.client(shared_memory=1) if ring else x.client()
    if ring and x.lib.tpdraft_client_shared_memory(h) != 1:
        return "silent wrong", "the client's ring was not mapped"
    s = api.session(h)
    en = x.entry(s)
    if api.step(h, [en]) != 0:
        return "silent wrong", f"refused: {x.err()}"
    x.close_client(h)
    return x.same_as_reference(en.tokens)


def proposer_cases(add):
    """tpdraft.Proposer over a Drafter and over a Client: what an engine gives it wrong. A refused
    call must leave the proposer's requests and their sessions as they were; the control drafts
    the reference through it."""
    G = "Python"
    TE, AE = ("TypeError",), ("ArgumentError",)

    def handle(x, served):
        if served:
            return x.tpdraft.Client(x.address, timeout=REPLY_S)
        return x.tpdraft.Drafter(x.dd.decode(), x.td.decode(), threads=1)

    def held(x, p):
        """A request "held" of the reference rows, drafted once: what a refused call must not move."""
        p.propose([x.tpdraft.Request("held", REF_ROWS, REF_ANCHOR, x.taps())])
        return p.requests, p.drafter.session_length(p._tracks["held"].session)

    def case(name, call, want, names, served=False):
        def fn(x):
            p = x.tpdraft.Proposer(handle(x, served))
            before = held(x, p)
            verdict = x.py_refused(lambda: call(x, p), want, names)
            after = p.requests, p.drafter.session_length(p._tracks["held"].session)
            if verdict[0] != "silent wrong" and after != before:
                return "silent wrong", f"refused ({verdict[1]}), but the requests moved: {before} -> {after}"
            return verdict
        add(G, ("Client" if served else "Drafter") + f" Proposer.propose: {name}", fn, "pyclient" if served else None)

    R = lambda x, *a, **k: x.tpdraft.Request(*a, **k)  # noqa: E731
    for served in (False, True):
        cases = [
            ("requests None", lambda x, p: p.propose(None), TE, ["Request", "NoneType"]),
            ("a dict for a Request", lambda x, p: p.propose([{"id": 1}]), TE, ["Request", "dict"]),
            ("an id that is a list", lambda x, p: p.propose([R(x, [1], 1, REF_ANCHOR, x.taps(1))]), TE,
             ["id", "hashable"]),
            ("one id twice", lambda x, p: p.propose([R(x, "a", 1, 3, x.taps(1)), R(x, "a", 1, 3, x.taps(1))]),
             AE, ["'a'", "twice"]),
            ("length -1", lambda x, p: p.propose([R(x, "a", -1, 3)]), AE, ["'a'", "length"]),
            ("length 'x'", lambda x, p: p.propose([R(x, "a", "x", 3)]), AE, ["'a'", "length"]),
            ("length True", lambda x, p: p.propose([R(x, "a", True, 3)]), AE, ["'a'", "length"]),
            ("more rows than the length", lambda x, p: p.propose([R(x, "a", 2, 3, x.taps(3))]), AE,
             ["'a'", "3 tap rows", "length 2"]),
            ("taps one column short", lambda x, p: p.propose([R(x, "a", 2, 3, x.taps(2)[:, 1:])]), AE,
             ["'a'", "shape"]),
            ("taps a str", lambda x, p: p.propose([R(x, "a", 2, 3, "rows")]), AE, ["'a'", "taps"]),
            ("a new request not from 0", lambda x, p: p.propose([R(x, "a", 4, 3, x.taps(2))]), AE,
             ["'a'", "new", "start at 2"]),
            ("a gap in a held request's rows",
             lambda x, p: p.propose([R(x, "held", REF_ROWS + 3, 3, x.taps(1))]), AE,
             ["'held'", f"start at position {REF_ROWS + 2}"]),
            ("an anchor past the vocabulary", lambda x, p: p.propose([R(x, "held", REF_ROWS, 10 ** 6)]), AE,
             ["'held'", "anchor"]),
            ("a new request with a bad anchor beside a good one",
             lambda x, p: p.propose([R(x, "held", REF_ROWS, 3), R(x, "b", 1, -4, x.taps(1))]), AE,
             ["'b'", "anchor"]),
            ("temperature 'hot'", lambda x, p: p.propose([R(x, "held", REF_ROWS, 3, temperature="hot")]), TE,
             ["temperature"]),
            ("finished None", lambda x, p: p.propose([], finished=None), TE, ["finished", "NoneType"]),
            ("finished an id that is a dict", lambda x, p: p.propose([], finished=[{}]), TE, ["id", "hashable"]),
        ]
        if served:
            cases = [c for c in cases if c[0] in ("one id twice", "a gap in a held request's rows",
                                                  "an anchor past the vocabulary")]
        for name, call, want, names in cases:
            case(name, call, want, names, served)

    add(G, "Proposer(None)", lambda x: x.py_refused(lambda: x.tpdraft.Proposer(None), TE,
                                                      ["Proposer", "Drafter", "NoneType"]))
    for key, value, want in (("temperature", "hot", TE), ("top_k", None, TE), ("out", "jax", ("ValueError",))):
        add(G, f"Proposer({key}={value!r})",
            lambda x, key=key, value=value, want=want: x.py_refused(
                lambda: x.tpdraft.Proposer(handle(x, False), **{key: value}), want, [key]))

    def control(x):
        d = handle(x, False)
        with x.tpdraft.Proposer(d) as p:
            first = p.propose([x.tpdraft.Request("a", 2, 9, x.taps()[:2])])["a"]
            got = p.propose([x.tpdraft.Request("a", REF_ROWS, REF_ANCHOR, x.taps()[2:])])["a"]
            if not first.drafted:
                return "silent wrong", "no drafts"
        return x.same_as_reference(got.tokens)
    add(G, "Drafter Proposer: the reference rows in two calls draft the reference", control)


def all_cases():
    cases = []

    def add(group, name, fn, family=None, after=None, limit=CASE_LIMIT_S):
        cases.append(Case(group, name, fn, family, after, limit))
    c_abi_cases(add)
    python_cases(add)
    proposer_cases(add)
    frame_cases(add)
    ring_cases(add)
    # The servers of the C client and Python client cases are stopped as users stop them.
    for group, family in (("C ABI", "client"), ("Python", "pyclient"), ("rings", "rings")):
        add(group, "the server of the cases above ends on SIGTERM, status 0", None, family, "sigterm")
    return cases


# ---- a case's process -------------------------------------------------------------------------

def worker(spec):
    x = X(spec)
    try:
        if spec.get("reference"):
            verdict = reference(x)
        else:
            case = all_cases()[spec["index"]]
            if case.name != spec["name"]:
                raise Harness(f"case {spec['index']} is '{case.name}', not '{spec['name']}'")
            verdict = case.fn(x)
    except Harness as e:
        print("SWEEP-ERROR " + json.dumps(str(e)), flush=True)
        return 3
    except Exception:  # noqa: B902 - the sweep's own failure, reported as such
        print("SWEEP-ERROR " + json.dumps(traceback.format_exc()), flush=True)
        return 3
    finally:
        for close in reversed(x.closers):
            try:
                close()
            except Exception:  # noqa: B902 - what a case left behind is cleared as far as it goes
                pass
    print("VERDICT " + json.dumps(verdict), flush=True)
    return 0


def zygote():
    """Runs each case it is sent in a process of its own, forked from this one: the imports every
    case needs are made once, and a crash or hang still ends only that case's process. One line
    in, {"spec", "out"}; two lines out, the child's pid, then its wait status. The child's stdout
    and stderr go to the file "out"."""
    for module in ("numpy", "zmq"):  # imported once, inherited by every case (a zmq context is per case)
        __import__(module)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            rc = 3
            try:
                fd = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                rc = worker(request["spec"])
            except BaseException:  # noqa: B902 - the case's process ends here whatever happens
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": status}), flush=True)
    return 0


class Zygote:
    """The sweep's end of a zygote process."""

    def __init__(self, env):
        self.env = env
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=self.env)
        self.buffer = b""

    def line(self, limit):
        """The zygote's next line, or None when none comes within `limit` seconds."""
        deadline = time.monotonic() + limit
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError("the zygote process ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, spec, out, limit):
        """Runs a case: (exit code as subprocess gives it, its output, whether it passed `limit`)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write((json.dumps({"spec": spec, "out": out}) + "\n").encode())
        self.proc.stdin.flush()
        pid = self.line(CASE_LIMIT_S)["pid"]
        done = self.line(limit)
        timed_out = done is None
        if timed_out:
            os.kill(pid, signal.SIGKILL)
            done = self.line(CASE_LIMIT_S)
            if done is None:
                raise RuntimeError(f"the zygote did not reap the case's process {pid}")
        with open(out, errors="replace") as f:
            output = f.read()
        return os.waitstatus_to_exitcode(done["status"]), output, timed_out

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def reference(x):
    """The reference drafts: a fresh in-process handle (one thread, as every handle and server of
    the sweep), the reference request greedy and sampled."""
    lib = x.lib
    h = x.drafter()
    caps = x.abi.tpdraft_caps()
    caps.struct_size = ctypes.sizeof(caps)
    if lib.tpdraft_caps_get(h, ctypes.byref(caps)) != 0:
        raise Harness(x.err())
    x.W, x.B, x.V, x.rows = caps.taps_width, caps.block_size, caps.vocab_size, caps.block_size - 1
    api = Api(x, False)
    out = {"W": x.W, "B": x.B, "V": x.V, "max_sessions": caps.max_sessions, "max_context": caps.max_context}
    for what, fields in (("greedy", {}), ("sampled", {"temperature": REF_TEMPERATURE, "seed": REF_SAMPLE_SEED})):
        s = api.session(h)
        en = x.entry(s, **fields)
        if api.step(h, [en]) != 0:
            raise Harness(f"the reference step: {x.err()}")
        out[what] = [int(t) for t in en.tokens]
        out[what + "_q"] = [float(v) for v in en.q]
    lib.tpdraft_close(h)
    return out


# ---- the sweep ------------------------------------------------------------------------------------

def crash_excerpt(text):
    """The report in a crashed process's output, or its last lines."""
    for w in CRASH_WORDS:
        i = text.find(w)
        if i >= 0:
            return text[max(0, i - 300):i + 1500]
    return "\n    ".join(text.strip().splitlines()[-4:])


def describe_exit(rc):
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


class Server:
    """`tpdraft serve` for one family of cases, in a directory of its own; started again when a
    case kills it."""

    def __init__(self, sweep, family):
        self.sweep, self.family, self.generation = sweep, family, 0
        self.proc = self.ping_sock = None
        self.start()

    def start(self):
        import zmq
        self.generation += 1
        self.dir = os.path.join(self.sweep.work, f"server-{self.family}-{self.generation}")
        os.mkdir(self.dir)
        self.sock_path = os.path.join(self.dir, "s.sock")
        self.address_file = os.path.join(self.dir, "address")
        self.log = os.path.join(self.dir, "server.log")
        ck = self.sweep.ck
        cmd = [self.sweep.binary, "serve", "--drafter", os.path.join(ck, "drafter"), "--target",
               os.path.join(ck, "target"), "--listen", "ipc://" + self.sock_path, "--address-file", self.address_file,
               "--tp", "1", "--threads", "1", "--backend", "cpu", "--max-open-sessions", "32"]
        # The server is a program of the build, which loads its own sanitizer runtime and checks its
        # own leaks: the preload and the leak switch are for the Python processes only.
        env = dict(self.sweep.env)
        env.pop("LD_PRELOAD", None)
        if "ASAN_OPTIONS" in env:
            env["ASAN_OPTIONS"] = ":".join(o for o in env["ASAN_OPTIONS"].split(":") if o != "detect_leaks=0")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + CASE_LIMIT_S
        while not (os.path.exists(self.address_file) and open(self.address_file).read().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start ({describe_exit(self.proc.poll() or 0)}):\n"
                                   + open(self.log, errors="replace").read()[-2000:])
            time.sleep(0.02)
        self.address = open(self.address_file).read().split()[0]
        self.log_seen = 0
        self.ping_sock = self.sweep.zctx.socket(zmq.DEALER)
        self.ping_sock.setsockopt(zmq.LINGER, 0)
        self.ping_sock.connect(self.address)
        self.pings = 0
        # A build older or newer than the sources would refuse every frame of the sweep.
        if not self.ping():
            self.kill()
            raise RuntimeError(f"the server refuses the protocol of src/serve/protocol.h (version "
                               f"{self.sweep.proto.version}): {self.last_ping}; is {self.sweep.build} built from "
                               f"these sources?")

    def new_log(self):
        with open(self.log, errors="replace") as f:
            f.seek(self.log_seen)
            text = f.read()
        self.log_seen += len(text.encode(errors="replace"))
        return text

    def ping(self):
        p = self.sweep.proto
        self.pings += 1
        frame = p.pack(p.header, {"magic": p.magic, "version": p.version, "kind": p.kinds["stats"], "id": self.pings})
        self.ping_sock.send(frame)
        deadline = time.monotonic() + REPLY_S
        while time.monotonic() < deadline:
            if self.ping_sock.poll(int((deadline - time.monotonic()) * 1000) + 1):
                r = Reply(p, self.ping_sock.recv())
                if r.h.get("id") in (self.pings, 0):
                    self.last_ping = f"{r.status_name}: {r.message}"
                    return r.status == 0
        self.last_ping = "no reply"
        return False

    def check(self):
        """After a case: (kind, detail) when the server crashed or stopped answering, else None."""
        text = self.new_log()
        if self.proc.poll() is not None:
            return "crash", f"the server ended ({describe_exit(self.proc.returncode)}); its log: " + crash_excerpt(text)
        if any(w in text for w in CRASH_WORDS):
            return "crash", "the server reported: " + crash_excerpt(text)
        if not self.ping():
            return "hang", f"the server answered no STATS within {REPLY_S} s after the case"
        return None

    def stop(self, how="sigterm"):
        """Stops the server (SIGTERM, or awaits the end a SHUTDOWN asked for): None when it ended
        as docs/protocol.md says (status 0, its socket and address files removed), else (kind,
        detail)."""
        if self.ping_sock is not None:
            self.ping_sock.close(0)
            self.ping_sock = None
        if self.proc.poll() is None and how == "sigterm":
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(CASE_LIMIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "hang", f"the server did not end within {CASE_LIMIT_S} s ({how})"
        text = self.new_log()
        if rc != 0 or any(w in text for w in CRASH_WORDS):
            return "crash", f"the server ended with {describe_exit(rc)}: " + crash_excerpt(text)
        left = [p for p in (self.sock_path, self.address_file) if os.path.exists(p)]
        if left:
            return "silent wrong", f"the server ended but left {left}"
        return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Sweep(Wire):
    def __init__(self, binary, build, work, env):
        self.binary, self.build, self.work, self.env = binary, build, work, env
        self.ck = os.path.join(work, "ck")
        self.ref = None
        self._proto = self._zctx = None
        self.local, self.lock, self.zygotes = threading.local(), threading.Lock(), []
        self.shm_tag = "hostile-" + os.path.basename(work)

    def remove_shared_memory(self):
        for name in os.listdir("/dev/shm"):
            path = os.path.join("/dev/shm", name)
            if self.shm_tag in name:
                os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)

    def spawn(self, spec, limit=CASE_LIMIT_S):
        """Runs a case in a process of its own, forked by this thread's zygote: (kind, detail)."""
        spec = dict(spec, build=self.build, ck=self.ck, ref=self.ref, shm_tag=self.shm_tag)
        z = getattr(self.local, "zygote", None)
        if z is None:
            z = self.local.zygote = Zygote(self.env)
            with self.lock:
                self.zygotes.append(z)
        rc, out, timed_out = z.run(spec, os.path.join(spec["tmp"], "output"), limit)
        if timed_out:
            return "hang", f"the case's process did not end within {limit} s"
        lines = out.splitlines()
        verdict = next((json.loads(line[8:]) for line in lines if line.startswith("VERDICT ")), None)
        sweep_error = next((json.loads(line[12:]) for line in lines if line.startswith("SWEEP-ERROR ")), None)
        if rc < 0 or any(w in out for w in CRASH_WORDS):
            return "crash", f"{describe_exit(rc)}: {crash_excerpt(out)}"
        if sweep_error is not None:
            return "sweep error", sweep_error
        if verdict is None or rc != 0:
            return "crash", f"{describe_exit(rc)} without a verdict: {out[-900:]}"
        return tuple(verdict)

    def run_case(self, index, case, server=None):
        tmp = tempfile.mkdtemp(prefix="case-", dir=self.work)
        spec = {"index": index, "name": case.name, "tmp": tmp}
        if server is not None:
            spec.update(address=server.address, log=server.log, server_pid=server.proc.pid)
        return self.spawn(spec, case.limit)

    def run_family(self, family, items):
        results = []
        try:
            server = Server(self, family)
        except Exception as e:  # noqa: B902 - no server: every case of the family says why
            return [(case, "sweep error", str(e)) for _, case in items]
        try:
            for index, case in items:
                if case.after == "sigterm":
                    problem = server.stop("sigterm")
                    results.append((case, *(problem or ("control ok", ""))))
                    continue
                kind, detail = self.run_case(index, case, server)
                if case.after == "shutdown":
                    problem = server.stop("shutdown")
                else:
                    problem = server.check()
                if problem is not None:
                    kind, detail = problem[0], problem[1] + (f"\n  (the case itself: {kind}: {detail})" if detail
                                                             else "")
                    server.kill()
                    if case is not items[-1][1]:
                        server.start()
                results.append((case, kind, detail))
        finally:
            server.kill()
            if server.ping_sock is not None:
                server.ping_sock.close(0)
        return results


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    if argv[1] == "--worker":
        return worker(json.load(sys.stdin))
    if argv[1] == "--zygote":
        return zygote()
    build = os.path.abspath(argv[1])
    cases = all_cases()
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    selected = [(i, c) for i, c in enumerate(cases) if only is None or only in f"{c.group}: {c.name}"]
    if "--list" in argv:
        for _, c in selected:
            print(f"{c.group}: {c.name}")
        return 0
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else (os.cpu_count() or 2)
    binary = os.path.join(build, "tpdraft")
    needed = [binary, os.path.join(build, "libtpdraft.so")]
    missing = [p for p in needed if not os.path.exists(p)]
    if not any(n.startswith("tpdraft") for n in os.listdir(os.path.join(build, "python"))
               if os.path.isdir(os.path.join(build, "python"))):
        missing.append(os.path.join(build, "python", "tpdraft*.so"))
    for module in ("numpy", "zmq"):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"the Python module {module} (Debian: python3-{'zmq' if module == 'zmq' else 'numpy'})")
    if missing:
        print("hostile client sweep: missing " + ", ".join(missing))
        return 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tpdraft-hostile-", ignore_cleanup_errors=True) as work:
        # One thread each for numpy's BLAS in the cases' processes: they are forked, and run two at a time.
        env = dict(os.environ, TMPDIR=work, PYTHONDONTWRITEBYTECODE="1", OPENBLAS_NUM_THREADS="1",
                   OMP_NUM_THREADS="1")
        sweep = Sweep(binary, build, work, env)
        subprocess.run([binary, "init", "--config", os.path.join(REPO, "configs", "tiny-dflash2.json"), "--out",
                        sweep.ck, "--seed", "1"], check=True, capture_output=True, env=env)
        # The reference run must work, or every judgement below would prove nothing.
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], capture_output=True, text=True,
                           input=json.dumps({"reference": True, "build": build, "ck": sweep.ck}), env=env,
                           timeout=CASE_LIMIT_S)
        line = next((l for l in p.stdout.splitlines() if l.startswith("VERDICT ")), None)
        if p.returncode != 0 or line is None:
            print("the reference run failed:\n" + p.stdout + p.stderr)
            return 1
        sweep.ref = json.loads(line[8:])
        families = {}
        tasks = []
        for i, c in selected:
            if c.family is None:
                tasks.append(("case", i, c))
            else:
                families.setdefault(c.family, []).append((i, c))
        # The families run one case after another against their server: longest first.
        jobs_list = [("family", f, items) for f, items in sorted(families.items(), key=lambda kv: -len(kv[1]))]
        jobs_list += tasks
        results = {}

        def run(job):
            if job[0] == "family":
                return sweep.run_family(job[1], job[2])
            _, i, c = job
            return [(c, *sweep.run_case(i, c))]
        try:
            with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
                for rs in pool.map(run, jobs_list):
                    for r in rs:
                        results[id(r[0])] = r
        finally:
            for z in sweep.zygotes:
                z.close()
            sweep.remove_shared_memory()
        if sweep._zctx is not None:
            sweep._zctx.term()
    ordered = [results[id(c)] for _, c in selected if id(c) in results]
    columns = KINDS + (["sweep error"] if any(r[1] == "sweep error" for r in ordered) else [])
    print(f"{'entry point':<14} {'cases':>5} " + " ".join(f"{k:>12}" for k in columns))
    for g in GROUPS + ["all"]:
        rs = [r for r in ordered if g == "all" or r[0].group == g]
        print(f"{g:<14} {len(rs):>5} " + " ".join(f"{sum(1 for r in rs if r[1] == k):>12}" for k in columns))
    shown = [r for r in ordered if "--verbose" in argv or r[1] not in ("clear error", "control ok")]
    for case, kind, detail in shown:
        print(f"\n{kind.upper()}: {case.group}: {case.name}\n  {str(detail).strip()}")
    passed = sum(1 for r in ordered if r[1] == "control ok")
    print(f"\n{len(ordered)} cases in {time.monotonic() - started:.0f} s; the {passed} controls that passed are "
          "listed with --verbose")
    return 1 if any(r[1] in FAILING for r in ordered) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
