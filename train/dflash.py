"""The DFlash and DFlash 2 drafters as PyTorch modules for training, under the tensor names of
z-lab's checkpoints (docs/checkpoint.md), so that the state dict is the checkpoint. The forward
is docs/model.md's block forward, run for many blocks of many sequences at once the way the
DFlash objective trains it: each block sees the context rows strictly before its anchor and its
own rows (both ways), never another block."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from qwen3 import MLP, RMSNorm, apply_rope, rope_tables


class DynamicConv(nn.Module):
    """DFlash 2's grouped dynamic causal convolution around one sublayer: `base_kernel` [2, K, H]
    (side 0 before the sublayer, side 1 after it) plus per-row coefficients projected from the
    sublayer's normed input, [2, K, G] per row (docs/model.md)."""

    def __init__(self, hidden, taps, group):
        super().__init__()
        self.k, self.gs, self.g = taps, group, hidden // group
        base = torch.zeros(2, taps, hidden)
        base[:, 0] = 1.0  # starts as the identity
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.g, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def coefficients(self, x):
        """x [..., B, H] -> delta [..., B, 2, K, G]."""
        return self.kernel_projection(x).view(*x.shape[:-1], 2, self.k, self.g)

    def apply(self, x, delta, side):
        """out_t = sum_j (base[side][j] + delta_t[side][j] per group) * x_{t-j}, along the block's
        rows (axis -2), zero before row 0."""
        coef = self.base_kernel[side] + delta[..., side, :, :].repeat_interleave(self.gs, dim=-1)  # [..., B, K, H]
        out = coef[..., 0, :] * x
        for j in range(1, min(self.k, x.shape[-2])):
            shifted = F.pad(x[..., :-j, :], (0, 0, j, 0))
            out = out + coef[..., j, :] * shifted
        return out


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

    def context(self, ctx, cos, sin):
        """Keys and values [b, Nk, S, D] of the context rows ctx [b, S, H] (settle)."""
        b, s, _ = ctx.shape
        k = apply_rope(self.k_norm(self.k_proj(ctx).view(b, s, self.nk, self.d)).transpose(1, 2), cos, sin)
        return k, self.v_proj(ctx).view(b, s, self.nk, self.d).transpose(1, 2)

    def forward(self, x, cos, sin, ctx_kv, mask):
        """x [b, M, H] block rows (M = blocks x B), cos / sin [b, 1, M, D], mask [b, 1, M, S + M]."""
        b, m, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(b, m, self.nq, self.d)).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_norm(self.k_proj(x).view(b, m, self.nk, self.d)).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, m, self.nk, self.d).transpose(1, 2)
        keys, values = torch.cat((ctx_kv[0], k), dim=2), torch.cat((ctx_kv[1], v), dim=2)
        group = self.nq // self.nk
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = (q * (1.0 / math.sqrt(self.d))) @ keys.transpose(-1, -2) + mask
        out = torch.softmax(scores, dim=-1) @ values
        return self.o_proj(out.transpose(1, 2).reshape(b, m, self.nq * self.d))


class Layer(nn.Module):
    def __init__(self, c, dflash2):
        super().__init__()
        h = c["hidden_size"]
        self.input_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.mlp = MLP(c)
        self.dflash2 = dflash2
        if dflash2:
            d = c["dflash_config"]
            self.attention_conv = DynamicConv(h, d["conv_kernel_size"], d["conv_group_size"])
            self.mlp_conv = DynamicConv(h, d["conv_kernel_size"], d["conv_group_size"])

    def _around(self, conv, x, inner, block):
        """inner(x), between conv's two sides in DFlash 2 (rows viewed as [b, blocks, B, H])."""
        if not self.dflash2:
            return inner(x)
        shape = x.shape
        xb = x.view(shape[0], -1, block, shape[-1])
        delta = conv.coefficients(xb)
        y = inner(conv.apply(xb, delta, 0).view(shape)).view(xb.shape)
        return conv.apply(y, delta, 1).view(shape)

    def forward(self, h, cos, sin, ctx_kv, mask, block):
        x = self.input_layernorm(h)
        h = h + self._around(self.attention_conv if self.dflash2 else None, x,
                             lambda y: self.self_attn(y, cos, sin, ctx_kv, mask), block)
        z = self.post_attention_layernorm(h)
        return h + self._around(self.mlp_conv if self.dflash2 else None, z, self.mlp, block)


class Selector(nn.Module):
    """DFlash 2's candidate selector: score(c) = logit(c) + sum_k pred[prev][k] s[k] succ[c][k]."""

    def __init__(self, hidden, vocab, rank):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab, rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.randn(vocab, rank) * 0.02)

    def scores(self, g, logits, candidates, prev):
        """g [..., H] final-normed rows, logits [..., V], candidates [..., k], prev [...] ->
        [..., k]: the walk's score of each candidate given the previous token."""
        s = self.hidden_projection(g)                                   # [..., R]
        pair = self.predecessor_codebook[prev] * s                      # [..., R]
        succ = self.successor_codebook[candidates]                      # [..., k, R]
        return logits.gather(-1, candidates) + (succ * pair.unsqueeze(-2)).sum(-1)


class Drafter(nn.Module):
    """A drafter over a frozen target embedding / head `table` [V, H] (the target's tied head)."""

    def __init__(self, config, table, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        c = self.c = config
        d = c["dflash_config"]
        self.dflash2 = c["architectures"][0] == "DFlash2DraftModel"
        self.block, self.mask_id, self.taps = d["block_size"], d["mask_token_id"], d["target_layer_ids"]
        h = c["hidden_size"]
        self.fc = nn.Linear(len(self.taps) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, c["rms_norm_eps"])
        self.layers = nn.ModuleList(Layer(c, self.dflash2) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        if self.dflash2:
            self.candidate_selector = Selector(h, c["vocab_size"], d["selector_rank"])
        for name, p in self.named_parameters():
            if p.dim() == 2 and "codebook" not in name and "kernel_projection" not in name:
                nn.init.normal_(p, std=0.02)
        for layer in self.layers:
            for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * len(self.layers)))
        self.register_buffer("table", table.detach().clone(), persistent=False)

    def forward(self, taps, tokens, anchors):
        """taps [b, S, T*H] (the target's rows of positions 0 .. S-1), tokens [b, S], anchors
        [b, N] (sorted; each block starts at its anchor's position) -> final-normed rows
        g [b, N, B, H] and logits [b, N, B-1, V] of the draft rows 1 .. B-1."""
        b, s = tokens.shape
        n, blk = anchors.shape[1], self.block
        c = self.c
        ctx = self.hidden_norm(self.fc(taps))
        cos_c, sin_c = rope_tables(torch.arange(s), c["head_dim"], c["rope_theta"])
        positions = (anchors[:, :, None] + torch.arange(blk)).reshape(b, n * blk)      # [b, M]
        cos, sin = (t[positions].unsqueeze(1) for t in rope_tables(torch.arange(s + blk), c["head_dim"], c["rope_theta"]))
        rows = torch.full((b, n, blk), self.mask_id, dtype=torch.long)
        rows[:, :, 0] = tokens.gather(1, anchors)
        h = self.table[rows.view(b, n * blk)]
        # A row of the block anchored at a sees context positions < a and its own block's rows.
        row_anchor = anchors.repeat_interleave(blk, dim=1)                              # [b, M]
        see_ctx = torch.arange(s)[None, None, :] < row_anchor[:, :, None]               # [b, M, S]
        block_id = torch.arange(n).repeat_interleave(blk)
        see_block = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)          # [b, M, M]
        visible = torch.cat((see_ctx, see_block), dim=-1)
        mask = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf")).unsqueeze(1)
        for layer in self.layers:
            ctx_kv = layer.self_attn.context(ctx, cos_c, sin_c)
            h = layer(h, cos, sin, ctx_kv, mask, blk)
        g = self.norm(h).view(b, n, blk, -1)
        return g, g[:, :, 1:] @ self.table.T

    def config_json(self):
        return self.c
