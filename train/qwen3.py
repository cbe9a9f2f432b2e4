"""The target of the trained pair as a PyTorch module: a Qwen3-shaped causal LM (RMSNorm with a
plain weight, NeoX RoPE, grouped-query attention with per-head q/k norms, SwiGLU, tied or untied
head) under Hugging Face's Qwen3ForCausalLM tensor names, so that its state dict is the
checkpoint. forward() also returns the residual stream after chosen layers: a drafter's taps."""

import math

import torch
import torch.nn.functional as F
from torch import nn

# The keys of config.json this module reads, with Qwen3's defaults where it has one.
CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
               "max_position_embeddings")


def hf_config(c):
    """config.json of a target with geometry c (a dict with CONFIG_KEYS)."""
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2, "use_cache": True, "use_sliding_window": False,
            "rope_scaling": None, "initializer_range": 0.02, **{k: c[k] for k in CONFIG_KEYS}}


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(positions, head_dim, theta):
    """cos, sin [n, D] for positions [n] (angles in float64, as the runtime computes them)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """x [..., n, D]: the pair (x[i], x[i + D/2]) turned by angle i (rotate-half)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.nq, self.nk, self.d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(h, self.nq * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.nk * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.nk * self.d, bias=False)
        self.o_proj = nn.Linear(self.nq * self.d, h, bias=False)
        self.q_norm = RMSNorm(self.d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.d, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask, cache=None, start=0):
        """cache: (keys, values) [b, Nk, capacity, D] of this layer; the rows' keys and values are
        written at start .. start + n - 1 and attention reads every position up to there."""
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.nq, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, n, self.nk, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.nk, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            cache[0][:, :, start:start + n], cache[1][:, :, start:start + n] = k, v
            k, v = cache[0][:, :, :start + n], cache[1][:, :, :start + n]
        group = self.nq // self.nk
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.d) + mask
        out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.nq * self.d))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, h, cos, sin, mask, cache=None, start=0):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask, cache, start)
        return h + self.mlp(self.post_attention_layernorm(h))


class Body(nn.Module):
    """`model.` of the Hugging Face names."""

    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3(nn.Module):
    def __init__(self, c, seed=0):
        super().__init__()
        self.c = dict(c)
        torch.manual_seed(seed)
        self.model = Body(c)
        self.tied = bool(c["tie_word_embeddings"])
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.apply(self._init)
        # Residual branches scaled down with depth (GPT-2's rule) keep the stream's size steady.
        for layer in self.model.layers:
            for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * len(self.model.layers)))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.tied else self.lm_head.weight

    def new_cache(self, batch, capacity):
        """Keys and values of every layer for `batch` sequences of up to `capacity` positions."""
        shape = (batch, self.c["num_key_value_heads"], capacity, self.c["head_dim"])
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in self.model.layers]

    def forward(self, tokens, taps=(), start=0, cache=None):
        """tokens [b, n] at positions start .. start + n - 1, attending causally among
        themselves (and, with a cache, to the positions before start it holds) -> (final-normed
        hidden [b, n, H], [residual stream after layer t for t in taps]). logits = hidden @
        head_weight().T."""
        n = tokens.shape[1]
        cos, sin = rope_tables(torch.arange(start, start + n), self.c["head_dim"], self.c["rope_theta"])
        past = start if cache is not None else 0
        mask = torch.full((n, past + n), float("-inf")).triu(past + 1)
        h = self.model.embed_tokens(tokens)
        after = []
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, mask, None if cache is None else cache[i], start)
            after.append(h)
        return self.model.norm(h), [after[t] for t in taps]

    def export_tensors(self):
        """The checkpoint's tensors under Hugging Face names (a tied head is not written)."""
        return {name: p for name, p in self.state_dict().items()}
