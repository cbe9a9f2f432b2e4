"""A small Qwen3-style causal language model in PyTorch, the target of spec_decode.py: a trained
Hugging Face Qwen3ForCausalLM checkpoint (Qwen3Target.from_pretrained; float32 or float64), or
random decoder layers from a seed around the embedding and head of a target checkpoint (float64),
giving the logits of every position and the hidden states after chosen layers (a drafter's taps)."""

import json
import math
import os
from dataclasses import dataclass

import numpy as np
import torch

_DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4), "F64": (np.float64, 8)}


class SafetensorsError(ValueError):
    """A safetensors file this reader cannot read: the message names the file (and the tensor)."""


class SafetensorsFile:
    """A safetensors file (8-byte little-endian header length, JSON header, data area): `tensors`
    holds its header's entries, load() reads one tensor as float32."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise SafetensorsError(f"{path}: too short for a safetensors header")
            n = int.from_bytes(raw, "little")
            size = os.path.getsize(path)
            if n <= 0 or 8 + n > size:
                raise SafetensorsError(f"{path}: header length {n} does not fit the file of {size} bytes")
            header = json.loads(f.read(n))
        self.base = 8 + n
        header.pop("__metadata__", None)
        self.tensors = header

    def load(self, name, rows=None):
        """Tensor `name` as an f32 numpy array; `rows` reads only the first rows of a 2-D tensor."""
        info = self.tensors[name]
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{self.path}: tensor '{name}' has dtype {dtype}, expected BF16, F16, F32 or F64")
        np_type, width = _DTYPES[dtype]
        shape = list(info["shape"])
        begin, end = info["data_offsets"]
        if (end - begin) != int(np.prod(shape, dtype=np.int64)) * width:
            raise SafetensorsError(f"{self.path}: tensor '{name}' byte range does not match shape {shape} x {dtype}")
        if rows is not None:
            shape[0] = min(rows, shape[0])
        count = int(np.prod(shape, dtype=np.int64))
        a = np.fromfile(self.path, dtype=np_type, count=count, offset=self.base + begin)
        if dtype == "BF16":  # the upper half of an f32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32, copy=False).reshape(shape)


def write_safetensors(path, tensors):
    """Writes name -> array in one safetensors file: int64 arrays as I64 tensors, the others as F32."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        ints = array.dtype == np.int64
        blob = np.ascontiguousarray(array, dtype=np.int64 if ints else np.float32).tobytes()
        header[name] = {"dtype": "I64" if ints else "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def read_target_tables(target_dir):
    """(embedding [Vt, H], head [Vt, H]) of a target checkpoint in one model.safetensors (as
    `tpdraft init` writes it); a tied model's head is its embedding."""
    tables = SafetensorsFile(os.path.join(target_dir, "model.safetensors"))
    embed = tables.load("model.embed_tokens.weight")
    return embed, tables.load("lm_head.weight") if "lm_head.weight" in tables.tensors else embed


@dataclass
class TargetConfig:
    """The target's geometry: H, V, decoder layers, query and key/value heads, head dim (default
    H / heads) and SwiGLU width (default 2H)."""
    hidden: int
    vocab: int
    layers: int
    heads: int = 4
    kv_heads: int = 2
    eps: float = 1e-6
    rope_theta: float = 10000.0
    dim: int = 0
    intermediate: int = 0
    tied: bool = False

    @property
    def head_dim(self):
        return self.dim or self.hidden // self.heads

    @property
    def ffn(self):
        return self.intermediate or 2 * self.hidden

    @classmethod
    def from_json(cls, path):
        """The geometry of a Qwen3ForCausalLM config.json; a missing or mistyped key is refused,
        naming the file and the key."""
        try:
            with open(path) as f:
                j = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read the target's config ({e})") from None
        arch = (j.get("architectures") or [None])[0]
        if arch not in ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"):
            raise ValueError(f"{path}: key 'architectures' names {arch!r}, expected Qwen3ForCausalLM")

        def need(key, kind=int):
            value = j.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
                    kind is int and value != int(value)):
                raise ValueError(f"{path}: key '{key}' is {value!r}, expected a positive {kind.__name__}")
            return kind(value)

        heads = need("num_attention_heads")
        kv_heads = need("num_key_value_heads") if "num_key_value_heads" in j else heads
        if heads % kv_heads:
            raise ValueError(f"{path}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})")
        return cls(hidden=need("hidden_size"), vocab=need("vocab_size"), layers=need("num_hidden_layers"),
                   heads=heads, kv_heads=kv_heads, eps=need("rms_norm_eps", float),
                   rope_theta=need("rope_theta", float) if "rope_theta" in j else 10000.0,
                   dim=need("head_dim") if "head_dim" in j else 0, intermediate=need("intermediate_size"),
                   tied=bool(j.get("tie_word_embeddings", False)))


def config_for(caps, extra_layers=1):
    """A target whose layers include every tap layer of the drafter, with the drafter's H and V."""
    return TargetConfig(hidden=caps.hidden_size, vocab=caps.vocab_size,
                        layers=max(caps.target_layer_ids) + 1 + extra_layers)


def rms_norm(x, weight, eps):
    """weight * x / sqrt(mean(x^2) + eps) over the last axis (Qwen's convention: the weight itself)."""
    return weight * (x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps))


def rope_angles(positions, head_dim, theta, dtype=torch.float64):
    """(cos, sin) [S, n, 1, D/2] of the angles p * theta^(-2i/D) at positions [S, n] (computed
    in float64, handed over in dtype)."""
    freqs = theta ** (-torch.arange(head_dim // 2, dtype=torch.float64) * 2 / head_dim)
    angles = (positions.to(torch.float64)[:, :, None] * freqs)[:, :, None, :]
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def rope(x, angles):
    """NeoX rotate-half RoPE of x [S, n, heads, D]: the pair (x[i], x[i + D/2]) turns by angle i."""
    cos, sin = angles
    x1, x2 = x[..., :cos.shape[-1]], x[..., cos.shape[-1]:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class KVCache:
    """Every layer's keys and values for S sequences, by absolute position. Rows past a sequence's
    committed length are stale (refused drafts, padding): a forward writes its positions before
    reading them, and no query reads a position above its own, so nothing ever needs rolling back."""

    def __init__(self, config, batch, capacity, dtype=torch.float64):
        shape = (batch, config.kv_heads, capacity, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(config.layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(config.layers)]


class _Where:
    """Where a forward's rows go: cache rows, positions [S, n], their RoPE angles, the span of
    positions read, and which of them lie in each query's future (masked)."""

    def __init__(self, shape, starts, rows, config, dtype):
        self.rows = torch.arange(shape[0]) if rows is None else torch.as_tensor(np.asarray(rows), dtype=torch.long)
        self.positions = torch.as_tensor(np.asarray(starts), dtype=torch.long)[:, None] + torch.arange(shape[1])
        self.angles = rope_angles(self.positions, config.head_dim, config.rope_theta, dtype)
        self.span = int(self.positions.max()) + 1
        future = torch.arange(self.span)[None, None, :] > self.positions[:, :, None]  # [S, n, span]
        self.future = future[:, None, None]


class Qwen3Target:
    """Decoder layers with random weights from `seed`; embedding and head given ([>= V, H] arrays).
    from_pretrained() builds one from a trained checkpoint instead."""

    def __init__(self, config, embed, head, seed=0, dtype=torch.float64, layers=None, final_norm=None):
        self.config, self.dtype = config, dtype
        self.embed = torch.from_numpy(np.asarray(embed[:config.vocab])).to(dtype)
        self.head = torch.from_numpy(np.asarray(head[:config.vocab])).to(dtype)
        if layers is None:
            gen = torch.Generator().manual_seed(seed)
            layers = [self._random_layer(gen) for _ in range(config.layers)]
            final_norm = self._norm_weight(gen, config.hidden)
        self.layers = [{k: v.to(dtype) for k, v in layer.items()} for layer in layers]
        self.final_norm = final_norm.to(dtype)
        self.preference = None  # (token, bias, period): see make_agree

    @classmethod
    def from_pretrained(cls, target_dir, dtype=torch.float32):
        """The trained Qwen3ForCausalLM in target_dir (config.json + model.safetensors, as
        train/target.py writes it). A missing tensor or one of the wrong shape is refused, naming
        the file and the tensor."""
        config = TargetConfig.from_json(os.path.join(target_dir, "config.json"))
        path = os.path.join(target_dir, "model.safetensors")
        if not os.path.isfile(path):
            raise SafetensorsError(f"{path}: the target's weights are missing")
        tables = SafetensorsFile(path)
        c, d = config, config.head_dim

        def get(name, shape):
            if name not in tables.tensors:
                raise SafetensorsError(f"{path}: missing tensor '{name}' (expected shape {list(shape)})")
            if list(tables.tensors[name]["shape"]) != list(shape):
                raise SafetensorsError(f"{path}: tensor '{name}' has shape {tables.tensors[name]['shape']}, "
                                       f"expected {list(shape)}")
            return torch.from_numpy(tables.load(name))

        embed = get("model.embed_tokens.weight", (c.vocab, c.hidden))
        head = embed if c.tied or "lm_head.weight" not in tables.tensors else get("lm_head.weight", (c.vocab, c.hidden))
        layers = []
        for i in range(c.layers):
            p = f"model.layers.{i}."
            q, k, v = (get(p + f"self_attn.{n}_proj.weight", (rows * d, c.hidden))
                       for n, rows in (("q", c.heads), ("k", c.kv_heads), ("v", c.kv_heads)))
            gate, up = (get(p + f"mlp.{n}_proj.weight", (c.ffn, c.hidden)) for n in ("gate", "up"))
            layers.append({"input_norm": get(p + "input_layernorm.weight", (c.hidden,)),
                           "post_norm": get(p + "post_attention_layernorm.weight", (c.hidden,)),
                           "qkv": torch.cat([q, k, v]).T.contiguous(),
                           "o": get(p + "self_attn.o_proj.weight", (c.hidden, c.heads * d)).T.contiguous(),
                           "q_norm": get(p + "self_attn.q_norm.weight", (d,)),
                           "k_norm": get(p + "self_attn.k_norm.weight", (d,)),
                           "gate_up": torch.cat([gate, up]).T.contiguous(),
                           "down": get(p + "mlp.down_proj.weight", (c.hidden, c.ffn)).T.contiguous()})
        return cls(config, embed.numpy(), head.numpy(), dtype=dtype, layers=layers,
                   final_norm=get("model.norm.weight", (c.hidden,)))

    @staticmethod
    def _norm_weight(gen, n):
        return 1 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)

    @staticmethod
    def _linear(gen, rows, cols):
        return torch.randn(rows, cols, generator=gen, dtype=torch.float64) / math.sqrt(cols)

    def _random_layer(self, gen):
        c = self.config
        h, d, ffn = c.hidden, c.head_dim, c.ffn
        q, k, v = (self._linear(gen, n * d, h) for n in (c.heads, c.kv_heads, c.kv_heads))
        o = self._linear(gen, h, c.heads * d)
        q_norm, k_norm = self._norm_weight(gen, d), self._norm_weight(gen, d)
        gate, up, down = self._linear(gen, ffn, h), self._linear(gen, ffn, h), self._linear(gen, h, ffn)
        # q, k, v (and gate, up) stacked: one product each, split after.
        return {"input_norm": self._norm_weight(gen, h), "post_norm": self._norm_weight(gen, h),
                "qkv": torch.cat([q, k, v]).T.contiguous(), "o": o.T.contiguous(), "q_norm": q_norm, "k_norm": k_norm,
                "gate_up": torch.cat([gate, up]).T.contiguous(), "down": down.T.contiguous()}

    def new_cache(self, batch, capacity):
        """An empty cache for `batch` sequences of up to `capacity` positions."""
        return KVCache(self.config, batch, capacity, self.dtype)

    def _attention(self, layer, x, at, keys, values):
        """x [S, n, H]; writes its keys and values into the cache, then attends over every cached
        position up to its own. Grouped-query: query head h reads key/value head h // group."""
        c = self.config
        s, n, _ = x.shape
        group, d = c.heads // c.kv_heads, c.head_dim
        q, k, v = (x @ layer["qkv"]).view(s, n, c.heads + 2 * c.kv_heads, d).split([c.heads, c.kv_heads, c.kv_heads], 2)
        keys[at.rows[:, None], :, at.positions] = rope(rms_norm(k, layer["k_norm"], c.eps), at.angles)
        values[at.rows[:, None], :, at.positions] = v
        q = rope(rms_norm(q, layer["q_norm"], c.eps), at.angles)  # [S, n, kv_heads * group, D]
        q = q.view(s, n, c.kv_heads, group, d).permute(0, 2, 3, 1, 4)  # [S, kv_heads, group, n, D]
        k_all, v_all = keys[at.rows, :, None, :at.span], values[at.rows, :, None, :at.span]
        scores = (q @ k_all.transpose(-1, -2) / math.sqrt(d)).masked_fill(at.future, float("-inf"))
        out = (torch.softmax(scores, dim=-1) @ v_all).permute(0, 3, 1, 2, 4).reshape(s, n, c.heads * d)
        return out @ layer["o"]

    def _layer(self, index, h, at, cache):
        layer = self.layers[index]
        x = rms_norm(h, layer["input_norm"], self.config.eps)
        h = h + self._attention(layer, x, at, cache.keys[index], cache.values[index])
        gate, up = (rms_norm(h, layer["post_norm"], self.config.eps) @ layer["gate_up"]).chunk(2, dim=-1)
        return h + (torch.nn.functional.silu(gate) * up) @ layer["down"]

    @torch.no_grad()
    def forward(self, tokens, starts, cache, tap_layers, rows=None):
        """tokens [S, n] at positions starts[s] .. starts[s] + n - 1 of the cache's sequences `rows`
        (default: all) -> logits [S, n, V] and taps [S, n, T*H] (the hidden states after each tap
        layer, side by side), as numpy arrays of the target's dtype."""
        tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        at = _Where(tokens.shape, starts, rows, self.config, self.dtype)
        h = self.embed[tokens]
        after = []
        for index in range(len(self.layers)):
            h = self._layer(index, h, at, cache)
            after.append(h)
        taps = torch.cat([after[t] for t in tap_layers], dim=-1)
        logits = rms_norm(h, self.final_norm, self.config.eps) @ self.head.T
        if self.preference:
            token, bias, period = self.preference
            logits[..., token] += bias * ((at.positions + 1) % period != 0)
        return logits.numpy(), taps.numpy()

    def forward_all(self, sequences, tap_layers, cache=None):
        """A forward over whole token lists from position 0 (padded on the right, which causality
        hides), into `cache` (default: a fresh one that just holds them)."""
        width = max(len(s) for s in sequences)
        if cache is None:
            cache = self.new_cache(len(sequences), width)
        padded = [list(s) + [0] * (width - len(s)) for s in sequences]
        return self.forward(padded, [0] * len(sequences), cache, tap_layers)


# A target and a drafter that agree by construction. A drafter's draft rows start from the
# embedding of the MASK token; give that row a spike in one channel and the draft rows' residual
# stream is dominated by it, so their final-normed rows point along that channel and the head's
# column there decides the logits: only `token` is non-zero in it. The target's final norm weight
# is zero on that channel, so its own logits ignore the column; a bias on its logits makes it
# prefer `token`, except at every period-th position, where its own logits decide: drafts are
# accepted in long runs, and refused there.


def write_agreeing_target(target_dir, out_dir, mask_token, token, channel=0, spike=1000.0, weight=5.0):
    """A copy of a target checkpoint (F32) whose tables make any drafter reading it propose `token`."""
    embed, head = read_target_tables(target_dir)
    embed, head = embed.copy(), head.copy()
    embed[mask_token, channel] = spike
    head[:, channel] = 0.0
    head[token, channel] = weight
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(target_dir, "config.json")) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)
    write_safetensors(os.path.join(out_dir, "model.safetensors"),
                      {"model.embed_tokens.weight": embed, "lm_head.weight": head})


def make_agree(target, token, channel=0, bias=10.0, period=13):
    """Turns a target built on write_agreeing_target's tables into one that prefers `token` at
    every position p with (p % period) != 0 (the logits of position p - 1 get the bias)."""
    target.final_norm[channel] = 0.0
    target.preference = (token, bias, period)
