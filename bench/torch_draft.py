#!/usr/bin/python3
# The PyTorch eager baseline of one DFlash / DFlash 2 draft (docs/model.md): what a
# competent PyTorch user writes with nn.functional, batched over heads; fp32 on the CPU, or bf16
# on a GPU the way Hugging Face models run (norms and softmax in f32). It reads the same
# checkpoints as tpdraft (safetensors parsed with numpy) so the two can be timed and cross-checked.
"""Time (and optionally dump) one drafter draft in PyTorch eager.

Examples:
  /usr/bin/python3 bench/torch_draft.py --drafter CKPT/drafter --target CKPT/target \
      --ctx 1024 --anchor 17 --threads 2 --json
  python3 bench/torch_draft.py --drafter CKPT/drafter --target CKPT/target \
      --ctx 4096 --anchor 17 --device cuda --dtype bf16 --json
"""

import argparse
import json
import os
import sys
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
import timing  # noqa: E402  (bench/timing.py: the figures' shape and the machine's load)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", required=True, help="drafter directory (config.json + safetensors)")
    p.add_argument("--target", required=True, help="target directory (embedding and head)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--taps", help="safetensors file with tensor 'taps' [N, T*H]")
    src.add_argument("--ctx", type=int, help="settle N random tap rows (seeded)")
    p.add_argument("--anchor", type=int, required=True, help="anchor token id")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--seed", type=int, default=0, help="seed of the random taps of --ctx")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda[:N]")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                   help="weights and activations (default f32; bf16 keeps norms and softmax in f32)")
    p.add_argument("--dump", help="write hidden [B,H], logits [B-1,V], tokens [B-1] of one draft to this "
                                  ".npz (or .safetensors, the layout of tpdraft draft --dump)")
    a = p.parse_args(argv)
    if a.threads < 1 or a.repeat < 1 or a.warmup < 0 or (a.ctx is not None and a.ctx < 0):
        p.error("--threads and --repeat must be >= 1, --warmup and --ctx >= 0")
    return a


ARGS = parse_args(sys.argv[1:])
# OpenBLAS sizes its pool at load time from the environment, and torch.set_num_threads does not
# reach it, so the thread count must be fixed before numpy / torch are imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(ARGS.threads)
# torch's OpenMP workers spin after each parallel op while OpenBLAS's own pthreads run the next
# GEMM, so with both pools at `threads` they fight for the same cores; measured on 2 cores that
# doubles the draft time (about 450 ms against 215 ms on the 2048-wide bench config). Passive
# waiting removes the fight without taking threads from either pool.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
# The checkpoints' reader, and the layout of tpdraft draft --dump.
from qwen3_target import SafetensorsError, SafetensorsFile, write_safetensors  # noqa: E402

DEVICE = torch.device(ARGS.device)
DTYPE = torch.bfloat16 if ARGS.dtype == "bf16" else torch.float32


def fail(msg):
    raise SystemExit("torch_draft: error: " + msg)


def canonical(name):
    """A tensor name without the "model." prefix some checkpoints put before every name."""
    return name[len("model."):] if name.startswith("model.") else name


class TensorStore:
    """The tensors of a model directory (index + shards, model.safetensors or one *.safetensors)."""

    def __init__(self, path):
        self.source = path
        if os.path.isdir(path):
            index = os.path.join(path, "model.safetensors.index.json")
            single = os.path.join(path, "model.safetensors")
            if os.path.exists(index):
                with open(index) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
                files = [os.path.join(path, s) for s in shards]
            elif os.path.exists(single):
                files = [single]
            else:
                found = sorted(x for x in os.listdir(path) if x.endswith(".safetensors"))
                if len(found) != 1:
                    fail(f"{path}: expected model.safetensors, an index, or exactly one *.safetensors")
                files = [os.path.join(path, found[0])]
        else:
            files = [path]
        self.by_name = {}
        for fp in files:
            st = SafetensorsFile(fp)
            for name in st.tensors:
                self.by_name[name] = (st, name)
                self.by_name.setdefault(canonical(name), (st, name))

    def has(self, name):
        return name in self.by_name

    def shape(self, name):
        st, real = self.by_name[name]
        return list(st.tensors[real]["shape"])

    def get(self, name, shape, rows=None):
        if name not in self.by_name:
            fail(f"{self.source}: missing tensor '{name}' (expected shape {shape})")
        have = self.shape(name)
        if rows is None and have != list(shape):
            fail(f"{self.source}: tensor '{name}' has shape {have}, expected {list(shape)}")
        st, real = self.by_name[name]
        return torch.from_numpy(st.load(real, rows)).to(DEVICE, DTYPE)


# ---------------------------------------------------------------------------------------------
# Config (docs/checkpoint.md, with the same fallbacks as the C++ reader).

class Config:
    def __init__(self, path):
        with open(path) as f:
            j = json.load(f)
        dc = j.get("dflash_config") or {}

        def nested(key, default=None):
            if dc.get(key) is not None:
                return dc[key]
            return j[key] if j.get(key) is not None else default

        def need(key, value):
            if value is None:
                fail(f"{path}: missing required key '{key}'")
            return value

        arch = (j.get("architectures") or [None])[0]
        if arch not in ("DFlashDraftModel", "DFlash2DraftModel"):
            fail(f"{path}: key 'architectures' names {arch!r}, expected DFlashDraftModel or DFlash2DraftModel")
        self.dflash2 = arch == "DFlash2DraftModel"
        self.H, self.L, self.Nq, self.F, self.V = (int(need(k, j.get(k))) for k in (
            "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size"))
        self.Nk = int(j.get("num_key_value_heads") or self.Nq)
        self.D = int(j.get("head_dim") or self.H // self.Nq)
        self.eps = float(j.get("rms_norm_eps", 1e-6))
        rp = j.get("rope_parameters") or {}
        self.theta = float(j.get("rope_theta") or rp.get("rope_theta") or 10000.0)
        for where, obj in (("rope_parameters", rp), ("rope_scaling", j.get("rope_scaling") or {})):
            for key in ("rope_type", "type"):
                if isinstance(obj, dict) and obj.get(key, "default") != "default":
                    fail(f"{path}: key '{where}.{key}' is {obj[key]!r}; only 'default' RoPE is supported")
        self.B = int(nested("block_size", 16))
        taps = nested("target_layer_ids")
        if taps is None and j.get("num_target_layers"):
            lt = int(j["num_target_layers"])
            taps = [lt // 2] if self.L == 1 else [round(1 + i * (lt - 4) / (self.L - 1)) for i in range(self.L)]
        self.taps = [int(t) for t in need("target_layer_ids", taps)]
        self.T = len(self.taps)
        self.mask = int(need("mask_token_id", nested("mask_token_id")))
        kinds = j.get("layer_types") or ["full_attention"] * self.L
        if len(kinds) != self.L or any(k not in ("full_attention", "sliding_attention") for k in kinds):
            fail(f"{path}: key 'layer_types' must list {self.L} of full_attention / sliding_attention")
        self.sliding = [k == "sliding_attention" for k in kinds]
        self.W = int(j.get("sliding_window") or 0)
        causal = j.get("is_causal")
        self.causal = list(self.sliding) if causal is None else [bool(causal)] * self.L
        self.m_in = float(nested("input_embedding_scale", 1.0))
        self.m_out = float(nested("output_multiplier", 1.0))
        self.cap = float(nested("final_logit_softcapping", 0.0))
        self.bias = bool(j.get("attention_bias", False))
        if self.dflash2:
            self.K, self.gs, self.R, self.top_k = (int(need(k, nested(k))) for k in (
                "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"))
            if self.H % self.gs:
                fail(f"{path}: hidden_size ({self.H}) must be a multiple of conv_group_size ({self.gs})")
            self.G = self.H // self.gs
        if self.Nq % self.Nk:
            fail(f"{path}: num_attention_heads ({self.Nq}) must be a multiple of num_key_value_heads ({self.Nk})")
        if not 0 <= self.mask < self.V:
            fail(f"{path}: mask_token_id {self.mask} must lie in [0, vocab_size = {self.V})")
        if any(self.sliding) and self.W <= 0:
            fail(f"{path}: key 'sliding_window' must be positive when a layer is sliding_attention")


def target_tied(target_dir):
    path = os.path.join(target_dir, "config.json")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        j = json.load(f)
    tc = j.get("text_config")
    if isinstance(tc, dict) and tc.get("tie_word_embeddings") is not None:
        return bool(tc["tie_word_embeddings"])
    return bool(j.get("tie_word_embeddings", False))


# ---------------------------------------------------------------------------------------------
# The model.

def rms_norm(x, w, eps):
    """In f32 whatever x is, then back to x's dtype (as Hugging Face's Qwen3 does)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_tables(positions, D, theta):
    """cos / sin [n, D] for absolute positions (angles in float64, then the model dtype)."""
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64, device=positions.device) / D)
    ang = torch.outer(positions.to(torch.float64), inv_freq)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos().to(DTYPE), ang.sin().to(DTYPE)


def apply_rope(x, cos, sin):
    """x [n, heads, D]; NeoX rotate-half over the whole head."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def dyn_conv(x, base, delta, gs):
    """Grouped dynamic causal conv along the block rows (docs/model.md).
    x [B, H], base [K, H], delta [B, K, G] -> [B, H]."""
    coef = base.unsqueeze(0) + delta.repeat_interleave(gs, dim=-1)  # [B, K, H]
    out = coef[:, 0] * x
    for j in range(1, min(base.shape[0], x.shape[0])):
        out[j:] += coef[j:, j] * x[:-j]
    return out


class Drafter:
    def __init__(self, drafter_dir, target_dir):
        c = self.cfg = Config(os.path.join(drafter_dir, "config.json"))
        st = TensorStore(drafter_dir)
        H, D, Nq, Nk, F_ = c.H, c.D, c.Nq, c.Nk, c.F
        used = set()

        def get(name, shape):
            used.add(name)
            return st.get(name, shape)

        self.fc = get("fc.weight", [H, c.T * H])
        self.hidden_norm = get("hidden_norm.weight", [H])
        self.norm = get("norm.weight", [H])
        self.layers = []
        for l in range(c.L):
            p = f"layers.{l}."
            w = {
                "ln1": get(p + "input_layernorm.weight", [H]),
                "ln2": get(p + "post_attention_layernorm.weight", [H]),
                "q": get(p + "self_attn.q_proj.weight", [Nq * D, H]),
                "k": get(p + "self_attn.k_proj.weight", [Nk * D, H]),
                "v": get(p + "self_attn.v_proj.weight", [Nk * D, H]),
                "o": get(p + "self_attn.o_proj.weight", [H, Nq * D]),
                "qn": get(p + "self_attn.q_norm.weight", [D]),
                "kn": get(p + "self_attn.k_norm.weight", [D]),
                "gate": get(p + "mlp.gate_proj.weight", [F_, H]),
                "up": get(p + "mlp.up_proj.weight", [F_, H]),
                "down": get(p + "mlp.down_proj.weight", [H, F_]),
            }
            for n, rows in (("q", Nq * D), ("k", Nk * D), ("v", Nk * D), ("o", H)):
                w[n + "b"] = get(p + f"self_attn.{n}_proj.bias", [rows]) if c.bias else None
            if c.dflash2:
                for side in ("attention_conv", "mlp_conv"):
                    w[side + ".base"] = get(p + side + ".base_kernel", [2, c.K, H])
                    w[side + ".proj"] = get(p + side + ".kernel_projection.weight", [2 * c.K * c.G, H])
            self.layers.append(w)
        if c.dflash2:
            self.sel_proj = get("candidate_selector.hidden_projection.weight", [c.R, H])
            books = []
            for kind in ("predecessor", "successor"):
                name = f"candidate_selector.{kind}_codebook"
                if not st.has(name) and st.has(name + ".weight"):
                    name += ".weight"
                books.append(get(name, [c.V, c.R]))
            self.pred_book, self.succ_book = books
        unknown = sorted({canonical(n) for n in st.by_name} - {canonical(n) for n in used})
        if unknown:
            print(f"torch_draft: warning: {drafter_dir}: unused tensors: {', '.join(unknown)}", file=sys.stderr)

        tgt = TensorStore(target_dir)
        emb_name = "model.embed_tokens.weight" if tgt.has("model.embed_tokens.weight") else "embed_tokens.weight"
        if not tgt.has(emb_name):
            fail(f"{target_dir}: missing tensor 'model.embed_tokens.weight'")

        def table(name):
            """The [>= V, H] table `name` of the target; only its first V rows are ever read
            (embedding of tokens < V, head width V)."""
            shape = tgt.shape(name)
            if len(shape) != 2 or shape[1] != H or shape[0] < c.V:
                fail(f"{target_dir}: '{name}' has shape {shape}, expected [>= {c.V}, {H}]")
            return tgt.get(name, shape, rows=c.V)

        self.embed = table(emb_name)
        tied = target_tied(target_dir) or not tgt.has("lm_head.weight")
        self.head = self.embed if tied else table("lm_head.weight")
        self.ctx_len = 0
        self.kv = []

    # --- settle (docs/model.md) -----------------------------------------------------------
    def settle(self, taps):
        """Context rows for positions 0..n-1 from taps [n, T*H]; keeps per-layer K/V plus B free
        slots at the end that each draft fills with its transient block K/V."""
        c = self.cfg
        n = taps.shape[0]
        if taps.shape[1] != c.T * c.H:
            fail(f"taps have {taps.shape[1]} columns, expected T*H = {c.T * c.H}")
        ctx = rms_norm(F.linear(taps, self.fc), self.hidden_norm, c.eps)
        cos, sin = rope_tables(torch.arange(n, device=DEVICE), c.D, c.theta)
        self.kv = []
        for l, w in enumerate(self.layers):
            keep = min(n, c.W) if c.sliding[l] else n  # a sliding layer reads at most the last W
            x = ctx[n - keep:]
            k = F.linear(x, w["k"], w["kb"]).view(keep, c.Nk, c.D)
            k = apply_rope(rms_norm(k, w["kn"], c.eps), cos[n - keep:], sin[n - keep:])
            v = F.linear(x, w["v"], w["vb"]).view(keep, c.Nk, c.D)
            free = torch.empty(c.Nk, c.B, c.D, device=DEVICE, dtype=DTYPE)
            kbuf, vbuf = (torch.cat((t.transpose(0, 1), free), dim=1) for t in (k, v))
            self.kv.append((kbuf, vbuf, keep))
        self.ctx_len = n

    # --- block forward (docs/model.md) ----------------------------------------------------
    def _mask(self, l, qpos, kpos):
        c = self.cfg
        if not c.causal[l] and not c.sliding[l]:
            return None  # every key visible (decided without a device round trip)
        dq, dk = qpos[:, None], kpos[None, :]
        vis = torch.ones(len(qpos), len(kpos), dtype=torch.bool, device=qpos.device)
        if c.causal[l]:
            vis &= dk <= dq
        if c.sliding[l]:
            vis &= (dq - dk) < c.W
            if not c.causal[l]:
                vis &= (dk - dq) < c.W
        return torch.zeros(vis.shape, device=vis.device, dtype=torch.float32).masked_fill_(~vis, float("-inf"))

    def _attention(self, l, w, x, cos, sin, mask):
        c = self.cfg
        B, g = x.shape[0], c.Nq // c.Nk
        q = F.linear(x, w["q"], w["qb"]).view(B, c.Nq, c.D)
        k = F.linear(x, w["k"], w["kb"]).view(B, c.Nk, c.D)
        v = F.linear(x, w["v"], w["vb"]).view(B, c.Nk, c.D)
        q = apply_rope(rms_norm(q, w["qn"], c.eps), cos, sin)
        k = apply_rope(rms_norm(k, w["kn"], c.eps), cos, sin)
        kbuf, vbuf, keep = self.kv[l]
        kbuf[:, keep:] = k.transpose(0, 1)
        vbuf[:, keep:] = v.transpose(0, 1)
        # GQA without copying K/V: query heads h = kv*g + i share kv head `kv`, so group them
        # as [Nk, g*B, D] and run one batched matmul per kv head.
        qh = q.transpose(0, 1).reshape(c.Nk, g * B, c.D) * (c.D ** -0.5)
        scores = torch.matmul(qh, kbuf.transpose(1, 2)).float()  # [Nk, g*B, S], softmax in f32
        if mask is not None:
            scores = (scores.view(c.Nk, g, B, -1) + mask).view(c.Nk, g * B, -1)
        out = torch.matmul(torch.softmax(scores, dim=-1).to(DTYPE), vbuf)  # [Nk, g*B, D]
        out = out.view(c.Nq, B, c.D).transpose(0, 1).reshape(B, c.Nq * c.D)
        return F.linear(out, w["o"], w["ob"])

    def forward(self, anchor):
        """Final-normed hidden rows [B, H] of the block [anchor, MASK x (B-1)] at a = ctx_len."""
        c = self.cfg
        a = self.ctx_len
        tokens = torch.full((c.B,), c.mask, dtype=torch.long, device=DEVICE)
        tokens[0] = anchor
        h = F.embedding(tokens, self.embed)
        if c.m_in != 1.0:
            h = h * c.m_in
        qpos = torch.arange(a, a + c.B, device=DEVICE)
        cos, sin = rope_tables(qpos, c.D, c.theta)
        for l, w in enumerate(self.layers):
            keep = self.kv[l][2]
            kpos = torch.cat((torch.arange(a - keep, a, device=DEVICE), qpos))
            mask = self._mask(l, qpos, kpos)
            x = rms_norm(h, w["ln1"], c.eps)
            h = h + self._conv_around(w, "attention_conv", x,
                                      lambda y: self._attention(l, w, y, cos, sin, mask))
            z = rms_norm(h, w["ln2"], c.eps)
            h = h + self._conv_around(w, "mlp_conv", z, lambda y: F.linear(
                F.silu(F.linear(y, w["gate"])) * F.linear(y, w["up"]), w["down"]))
        return rms_norm(h, self.norm, c.eps)

    def _conv_around(self, w, side, x, inner):
        """inner(x); in DFlash 2 between the two dynamic convolutions of `side` (w's side + ".base",
        ".proj"), whose kernels both come from x."""
        c = self.cfg
        if not c.dflash2:
            return inner(x)
        delta = F.linear(x, w[side + ".proj"]).view(c.B, 2, c.K, c.G)
        y = inner(dyn_conv(x, w[side + ".base"][0], delta[:, 0], c.gs))
        return dyn_conv(y, w[side + ".base"][1], delta[:, 1], c.gs)

    def logits(self, hidden):
        """Logits [B-1, V] of the draft rows, after m_out and the soft cap."""
        c = self.cfg
        z = F.linear(hidden[1:], self.head)
        if c.m_out != 1.0:
            z = z * c.m_out
        if c.cap > 0:
            z = torch.tanh(z / c.cap) * c.cap
        return z

    # --- greedy selection (docs/sampling.md) ----------------------------------------------
    def _candidates(self, logits):
        """Top-k per row ordered by logit descending, ties to the lower id."""
        k = self.cfg.top_k
        vals, idx = torch.topk(logits, min(k + 1, logits.shape[1]), dim=-1)
        # topk does not promise an order among equal values; rows with a tie at or inside the
        # top k are redone with a stable sort (rare with real-valued logits).
        for r in torch.nonzero((vals[:, 1:] == vals[:, :-1]).any(dim=-1)).flatten().tolist():
            sv, si = torch.sort(logits[r], descending=True, stable=True)
            vals[r, :k], idx[r, :k] = sv[:k], si[:k]
        return vals[:, :k], idx[:, :k]

    def select(self, hidden, logits, anchor):
        c = self.cfg
        if not c.dflash2:
            return logits.argmax(dim=-1).tolist()  # argmax returns the first maximum
        cand_val, cand_idx = self._candidates(logits)
        s = F.linear(hidden[1:], self.sel_proj)                 # [B-1, R]
        succ = self.succ_book[cand_idx] * s.unsqueeze(1)        # [B-1, k, R]
        prev, out = anchor, []
        for r in range(c.B - 1):
            score = cand_val[r] + torch.mv(succ[r], self.pred_book[prev])
            prev = int(cand_idx[r, int(score.argmax())])
            out.append(prev)
        return out

    def draft(self, anchor):
        hidden = self.forward(anchor)
        logits = self.logits(hidden)
        return self.select(hidden, logits, anchor), hidden, logits


# ---------------------------------------------------------------------------------------------

def load_taps(args, cfg):
    if args.taps:
        st = SafetensorsFile(args.taps)
        if "taps" not in st.tensors:
            fail(f"{args.taps}: missing tensor 'taps'")
        u = st.load("taps")
        if u.ndim != 2 or u.shape[1] != cfg.T * cfg.H:
            fail(f"{args.taps}: tensor 'taps' has shape {list(u.shape)}, expected [N, {cfg.T * cfg.H}]")
    else:
        u = np.random.default_rng(args.seed).standard_normal((args.ctx, cfg.T * cfg.H), dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(u)).to(DEVICE, DTYPE)


# Waits for the device, so that host timers measure the work and not its launch.
sync = torch.cuda.synchronize if DEVICE.type == "cuda" else lambda device: None


def timed(work):
    """(work(), its seconds), waiting for the device at both ends."""
    sync(DEVICE)
    t0 = time.perf_counter()
    out = work()
    sync(DEVICE)
    return out, time.perf_counter() - t0


def main(args):
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        model = Drafter(args.drafter, args.target)
        cfg = model.cfg
        if not 0 <= args.anchor < cfg.V:
            fail(f"--anchor {args.anchor} must lie in [0, vocab_size = {cfg.V})")
        taps = load_taps(args, cfg)
        _, settle_s = timed(lambda: model.settle(taps))
        rows = taps.shape[0]
        last = []  # the last draft's outputs

        def draft(_):  # ends waiting for the device, so that the next run's timer starts on an idle one
            last[:] = model.draft(args.anchor)
            sync(DEVICE)

        times, load = timing.with_load(lambda: timing.time_runs(draft, args.warmup, args.repeat))
        tokens, hidden, logits = last

        if args.dump:
            arrays = {"hidden": hidden.float().cpu().numpy(), "logits": logits.float().cpu().numpy(),
                      "tokens": np.asarray(tokens, dtype=np.int64)}
            if args.dump.endswith(".safetensors"):
                write_safetensors(args.dump, arrays)
            else:
                np.savez(args.dump, **arrays)

    result = {
        **timing.figure("draft_ms", times, 1e3),
        "machine_load": timing.machine_load(load),
        "settle_rows_per_s": rows / settle_s if rows and settle_s > 0 else 0.0,
        "tokens": tokens,
        "threads": args.threads,
        "device": str(DEVICE),
        "dtype": args.dtype,
        "torch": torch.__version__,
        "arch": "DFlash2" if cfg.dflash2 else "DFlash",
        "ctx": rows,
        "block": cfg.B,
        "repeat": args.repeat,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"torch {torch.__version__} {args.dtype} eager on {DEVICE}, {args.threads} threads, {result['arch']}, "
              f"context {rows} rows, block {cfg.B}")
        print(f"settle: {rows} rows in {settle_s * 1e3:.1f} ms ({result['settle_rows_per_s']:.0f} rows/s)")
        print(f"draft:  median {result['draft_ms_median']:.2f} ms  min {result['draft_ms_min']:.2f}  "
              f"max {result['draft_ms_max']:.2f}  ({args.repeat} runs after {args.warmup} warm-up)")
        print("machine:", timing.describe(load))
        print("tokens:", " ".join(map(str, tokens)))


if __name__ == "__main__":
    try:
        main(ARGS)
    except SafetensorsError as e:
        fail(str(e))
