"""tpdraft.Proposer: the drafter of a serving engine's many requests, called once per scheduler step.

An engine knows its requests by id; the drafter knows sessions. The proposer keeps the one for the
other: it opens a session when an id first appears, rolls it back when the engine gives rows again
from an earlier position (a preempted request recomputed from its prompt), closes it when the
request finishes or is dropped, splits a batch larger than the drafter's `max_sessions` into
several forwards, and keeps the rows of a step a busy server did not take so that nothing is lost
when it is asked again. docs/engines.md shows where an engine calls it.
"""

from dataclasses import dataclass
from collections.abc import Hashable
from typing import Optional

import numpy as np

from . import ArgumentError, BusyError, UnavailableError


@dataclass
class Request:
    """One running request of a scheduler step.

    length: the positions of the request whose target hidden states exist (0 .. length - 1); the
        anchor, the last token committed, sits at position `length`.
    anchor: that token.
    taps: the tap rows of positions length - n .. length - 1 that the drafter has not been given
        ([n, taps_width], any array the drafter takes; None or n = 0: nothing new). Rows from an
        earlier position than the proposer holds roll the drafter back to it: a request preempted
        and recomputed gives every row again, from 0.
    temperature, top_k, top_p, seed: this request's draft sampling (None: the proposer's).
    taps_dtype: as the drafter's entry key, for raw bf16 bits.
    """
    id: Hashable
    length: int
    anchor: int
    taps: object = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    taps_dtype: Optional[str] = None


@dataclass
class Proposal:
    """The drafts of one request: tokens [B-1] for positions length + 1 .. length + B - 1, q their
    probabilities under the drafter, and the draft distributions when the proposer was asked for
    them (see the drafter's step). `drafted` is False, and tokens empty, when the step could not run
    (a busy or lost server): the engine then decodes that request without drafts this step."""
    tokens: np.ndarray
    q: np.ndarray
    dist_ids: Optional[np.ndarray] = None
    dist_probs: Optional[np.ndarray] = None
    dist_rest: Optional[np.ndarray] = None

    @property
    def drafted(self):
        return len(self.tokens) > 0

    @staticmethod
    def none():
        return Proposal(np.zeros(0, np.int64), np.zeros(0, np.float32))


class _Track:
    """The drafter's view of one request: its session holds `held` positions; `pending` are rows of
    positions base .. base + rows - 1 (base <= held) not yet settled, each an array of rows."""

    def __init__(self, session):
        self.session, self.held, self.base, self.pending = session, 0, 0, []
        self.fresh = True  # opened, never drafted

    def rows(self):
        return sum(len(x) for x in self.pending)

    def merged(self, request, n_new):
        """(base, pending) once a request's n_new rows join the pending ones; raises on a gap."""
        p0 = request.length - n_new
        if p0 < self.base:  # rows again from an earlier position: roll back to it
            base, pending = p0, []
        elif p0 > self.base + self.rows():
            raise ArgumentError(f"request {request.id!r}: its new taps start at position {p0}, but the drafter "
                                f"has rows of positions < {self.base + self.rows()} only (rows "
                                f"{self.base + self.rows()} .. {p0 - 1} were never given)")
        else:
            base, pending = self.base, _first_rows(self.pending, p0 - self.base)
        return base, pending + [request.taps] if n_new else pending


def _first_rows(arrays, n):
    """The first n rows of a list of row arrays, as a list of arrays (views where possible)."""
    out = []
    for x in arrays:
        if n <= 0:
            break
        out.append(x if len(x) <= n else x[:n])
        n -= len(x)
    return out


def _joined(arrays):
    """One array of the rows of several (numpy, or the first one's framework when it has `cat`)."""
    if len(arrays) == 1:
        return arrays[0]
    first = arrays[0]
    if type(first).__module__.split(".")[0] == "torch":
        import torch
        return torch.cat(arrays)
    return np.concatenate([np.asarray(x) for x in arrays])


def _copied(x):
    """An owned copy of rows the engine may overwrite after the step (a torch tensor stays one)."""
    return x.clone() if hasattr(x, "clone") else np.array(x, copy=True)


def _rows_of(taps, taps_width, request_id):
    if taps is None:
        return 0
    shape = getattr(taps, "shape", None)
    if shape is None or len(shape) != 2 or shape[1] != taps_width:
        raise ArgumentError(f"request {request_id!r}: taps must be an array of shape [n, {taps_width}], got "
                            f"{tuple(shape) if shape is not None else type(taps).__name__}")
    return int(shape[0])


class Proposer:
    """Drafts for an engine's requests through `drafter`, a tpdraft.Drafter or tpdraft.Client, which
    it does not own.

    temperature, top_k, top_p: the draft sampling of requests that do not set their own (0: greedy).
    dist: the width of the draft distributions returned per row (0: none, w, or "full"), what the
        engine's rejection sampler needs beside q.
    seed: the seed of the per-request draft seeds (sampled drafts), so that a run can be repeated.
    out: "numpy" or "torch": what the proposals' arrays are (as the drafter's step returns them).
    """

    def __init__(self, drafter, *, temperature=0.0, top_k=0, top_p=1.0, dist=0, seed=None, out="numpy"):
        if not all(hasattr(drafter, name) for name in ("caps", "step", "open_session", "close_session")):
            raise TypeError(f"Proposer takes a tpdraft.Drafter or tpdraft.Client, got {type(drafter).__name__}")
        self.drafter = drafter
        self.caps = drafter.caps
        self._defaults = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        for key, value in self._defaults.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"{key} must be a number, got {type(value).__name__}")
        self._dist = dist
        if out not in ("numpy", "torch"):
            raise ValueError(f"out must be 'numpy' or 'torch', got {out!r}")
        self._out = out
        self._seeds = np.random.default_rng(seed)
        self._tracks = {}
        self.available = True   # False once the drafter's server is lost: every proposal is then empty
        self.last_error = None  # the error that made the last proposals empty, if any
        self.forwards = 0       # the drafter steps run so far

    # ---- the engine's calls -----------------------------------------------------------------------

    def propose(self, requests, finished=()):
        """Drafts for one scheduler step. requests: the running requests (Request), each id once;
        finished: ids of requests that ended since the last call (their sessions are closed first).
        Returns {id: Proposal}. Errors in what a request gives (taps that leave a gap, a bad anchor)
        raise ArgumentError naming the request, before any session moves where the proposer can
        tell; a busy server leaves the affected requests without drafts and their rows kept."""
        if isinstance(requests, (str, bytes, dict)) or not hasattr(requests, "__iter__"):
            raise TypeError(f"propose() takes a sequence of tpdraft.Request, got {type(requests).__name__}")
        requests = list(requests)
        self.finish(finished)
        plan = self._plan(requests)
        out = {}
        if not self.available:
            return {r.id: Proposal.none() for r in requests}
        try:
            for begin in range(0, len(plan), self.caps.max_sessions):
                out.update(self._step(plan[begin:begin + self.caps.max_sessions]))
        except Exception:
            # The drafter refused an entry: the requests this call opened sessions for and that
            # were not drafted are forgotten again, as if the call had not been made.
            self.finish([r.id for r, track in plan if track.fresh])
            raise
        return out

    def finish(self, ids):
        """Closes the sessions of requests that ended (ids the proposer never saw are ignored)."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"finished ids must be a sequence of request ids, got {type(ids).__name__}")
        ids = list(ids)
        for request_id in ids:
            if not isinstance(request_id, Hashable):
                raise TypeError(f"a request id must be hashable, got {type(request_id).__name__}")
        for request_id in ids:
            track = self._tracks.pop(request_id, None)
            if track is not None and self.available:
                self._close(track)

    def drop(self, ids):
        """Forgets requests the engine preempted and will recompute: their sessions are closed, and
        a dropped request comes back with every row from position 0."""
        self.finish(ids)

    @property
    def requests(self):
        """The ids the proposer holds a session for."""
        return list(self._tracks)

    def close(self):
        """Closes every session the proposer opened (not the drafter)."""
        self.finish(list(self._tracks))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- inside -----------------------------------------------------------------------------------

    def _plan(self, requests):
        """Checks the batch, merges each request's rows and opens the sessions of new ids; returns
        [(request, track)]."""
        seen, counts = set(), []
        for r in requests:
            if not isinstance(r, Request):
                raise TypeError(f"propose() takes tpdraft.Request items, got {type(r).__name__}")
            if not isinstance(r.id, Hashable):
                raise TypeError(f"a request id must be hashable, got {type(r.id).__name__}")
            if r.id in seen:
                raise ArgumentError(f"request {r.id!r} appears twice in one step")
            seen.add(r.id)
            if isinstance(r.length, bool) or not isinstance(r.length, (int, np.integer)) or r.length < 0:
                raise ArgumentError(f"request {r.id!r}: length must be a non-negative integer, got {r.length!r}")
            n = _rows_of(r.taps, self.caps.taps_width, r.id)
            if n > r.length:
                raise ArgumentError(f"request {r.id!r}: {n} tap rows but length {r.length}: rows of positions "
                                    f"length - n .. length - 1 are expected")
            counts.append(n)
        new = [r for r in requests if r.id not in self._tracks]
        for r, n in zip(requests, counts):
            if r.id not in self._tracks and r.length - n != 0:
                raise ArgumentError(f"request {r.id!r} is new to the proposer (or was dropped): its taps must "
                                    f"start at position 0, they start at {r.length - n}")
        room = self.caps.max_open_sessions - len(self._tracks)
        if len(new) > room and self.available:
            raise ArgumentError(f"{len(new)} new requests, but the drafter has room for {room} more sessions "
                                f"(max_open_sessions {self.caps.max_open_sessions}): finish requests first, or "
                                f"open the drafter with more")
        # Every request's rows are merged before anything changes, so a refused batch leaves the
        # proposer and the drafter as they were.
        merged = [(self._tracks.get(r.id) or _Track(None)).merged(r, n) for r, n in zip(requests, counts)]
        plan = []
        for r, (base, pending) in zip(requests, merged):
            track = self._tracks.get(r.id)
            if track is None:
                track = _Track(self.drafter.open_session() if self.available else None)
                self._tracks[r.id] = track
            track.base, track.pending = base, pending
            plan.append((r, track))
        return plan

    def _entry(self, request, track):
        entry = {"session": track.session, "keep": track.base, "anchor": request.anchor, "dist": self._dist}
        for key in self._defaults:
            value = getattr(request, key)
            entry[key] = self._defaults[key] if value is None else value
        if request.seed is not None:
            entry["seed"] = request.seed
        elif isinstance(entry["temperature"], (int, float, np.integer, np.floating)) and entry["temperature"] > 0:
            entry["seed"] = int(self._seeds.integers(2 ** 63))
        if track.pending:
            entry["taps"] = _joined(track.pending)
            if request.taps_dtype is not None:
                entry["taps_dtype"] = request.taps_dtype
        return entry

    def _step(self, part):
        entries = [self._entry(r, t) for r, t in part]
        try:
            results = self.drafter.step(entries, out=self._out) if self._out != "numpy" else self.drafter.step(entries)
            self.forwards += 1
        except BusyError as e:
            # Not taken: the sessions did not move. Keep the rows (copied: the engine may reuse its
            # buffers) for the next call, which sends them with whatever comes then.
            self.last_error = e
            for _, track in part:
                track.pending = [_copied(x) for x in track.pending]
            return {r.id: Proposal.none() for r, _ in part}
        except UnavailableError as e:
            self.available, self.last_error = False, e
            return {r.id: Proposal.none() for r, _ in part}
        except ArgumentError as e:
            raise ArgumentError(_name_request(str(e), part)) from None
        out = {}
        for (r, track), result in zip(part, results):
            track.held = track.base + track.rows()
            track.base, track.pending, track.fresh = track.held, [], False
            out[r.id] = Proposal(**result)  # tokens, q and the dist_* arrays asked for
        return out

    def _close(self, track):
        try:
            self.drafter.close_session(track.session)
        except UnavailableError as e:
            self.available, self.last_error = False, e


def _name_request(message, part):
    """The drafter's "entry i: ..." message with the request id of entry i."""
    head, sep, rest = message.partition("entry ")
    number = rest.split(":", 1)[0]
    if sep and number.isdigit() and int(number) < len(part):
        return f"{head}request {part[int(number)][0].id!r} (entry {number}){rest[len(number):]}"
    return message
