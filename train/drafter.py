#!/usr/bin/python3
"""Trains a DFlash (--arch dflash) or DFlash 2 (--arch dflash2) drafter against the trained
target's own continuations (train/distill.py), then writes it in z-lab's layout (config.json with
dflash_config, model.safetensors in bf16; the embedding and head stay the target's).

  drafter.py --arch dflash|dflash2 [--steps N] [--threads 1] [--seed 0] [--fresh]

The DFlash objective: per sequence, random anchors among the target's continuation, the block
after each anchor masked; every draft row r = 1 .. B-1 learns the target's next-token
distribution at its position (its 32 most likely tokens, renormalized: cross-entropy against
the target's own predictions, whose argmax is its greedy token), weighted exp(-(r-1)/gamma) so
the early rows, which decide acceptance, count more. DFlash 2's selector learns, on the
drafter's own k_top candidates of each row, to score highest what the target keeps highest,
its predecessor being the token the target committed before it; its loss does not reach the
layers. Resumable like train/target.py; a progress bar, and the loss curve as a PNG."""

import argparse
import math
import os
import sys
import time

sys.dont_write_bytecode = True
from common import (PAIR, WORK, CpuClock, Progress, cosine_lr, fail, main_guard, plot_losses, read_json,  # noqa: E402
                    read_safetensors, save_state, set_threads, write_json, write_safetensors)

BLOCK, GAMMA = 8, 4.0


def geometry(arch, target, taps, mask_id):
    """The drafter's config.json: two Qwen3-shaped layers at the target's width."""
    c = {"architectures": ["DFlash2DraftModel" if arch == "dflash2" else "DFlashDraftModel"], "model_type": "qwen3",
         "hidden_size": target["hidden_size"], "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768, "vocab_size": target["vocab_size"],
         "rms_norm_eps": 1e-6, "rope_theta": target["rope_theta"], "attention_bias": False, "hidden_act": "silu",
         "max_position_embeddings": target["max_position_embeddings"], "tie_word_embeddings": False,
         "num_target_layers": target["num_hidden_layers"], "torch_dtype": "bfloat16",
         "dflash_config": {"block_size": BLOCK, "target_layer_ids": taps, "mask_token_id": mask_id}}
    if arch == "dflash2":
        c["dflash_config"].update({"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32,
                                   "selector_top_k": 8})
    return c


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=("dflash", "dflash2"), required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--anchors", type=int, default=24, help="blocks per sequence")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--valid", type=int, default=64, help="sequences at the data's end held out for validation")
    p.add_argument("--target", default=os.path.join(PAIR, "target"))
    p.add_argument("--data", default=os.path.join(WORK, "distill"))
    p.add_argument("--work", help="default: build/train/<arch>")
    p.add_argument("--out", help="default: pair/<arch>")
    p.add_argument("--plot", help="the loss curve, default: pair/<arch>-loss.png; its numbers go beside it as .json")
    p.add_argument("--save-every", type=float, default=120.0)
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--stop-after", type=int, help="save and stop after this step, as an interruption would")
    a = p.parse_args(argv)
    a.work = a.work or os.path.join(WORK, a.arch)
    a.out = a.out or os.path.join(PAIR, a.arch)
    a.plot = a.plot or os.path.join(PAIR, a.arch + "-loss.png")
    if min(a.steps, a.batch, a.anchors, a.threads, a.valid) < 1:
        p.error("--steps, --batch, --anchors, --threads and --valid must be at least 1")
    return a


class Data:
    """distill.py's arrays: batches of sequences with random anchors in their continuations."""

    def __init__(self, np, torch, path, valid):
        self.np, self.torch = np, torch
        meta = self.meta = read_json(os.path.join(path, "meta.json"), "distilled data (train/distill.py)")
        if meta.get("batches_done") != meta["sequences"] // meta["batch"]:
            fail(f"{path}/meta.json: field 'batches_done' is {meta.get('batches_done')} of "
                 f"{meta['sequences'] // meta['batch']}: run train/distill.py to the end first")
        self.arrays = {k: np.load(os.path.join(path, k + ".npy"), mmap_mode="r")
                       for k in ("tokens", "taps", "top_ids", "top_p", "lengths")}
        n = meta["sequences"]
        if valid >= n:
            fail(f"--valid {valid}: the data holds only {n} sequences")
        self.train, self.valid = list(range(n - valid)), list(range(n - valid, n))
        self.greedy = [i for i in self.valid if (i // meta["batch"]) % 4 != 3]

    def batch(self, ids, anchors, gen):
        np, torch = self.np, self.torch
        lengths = self.arrays["lengths"][ids]
        s = int(lengths[:, 1].max())
        out = {"taps": torch.from_numpy(np.ascontiguousarray(self.arrays["taps"][ids, :s])).view(torch.bfloat16).float(),
               "tokens": torch.from_numpy(self.arrays["tokens"][ids, :s].astype(np.int64))}
        picks = []
        for prompt, total in lengths:
            span = torch.arange(int(prompt), int(total) - BLOCK + 1)
            picks.append(span[torch.randperm(len(span), generator=gen)[:anchors]].sort().values)
        out["anchors"] = torch.stack(picks)
        # The target's distribution for draft row r of the block at a sits at position a + r - 1.
        where = (out["anchors"][:, :, None] + torch.arange(BLOCK - 1)).numpy()            # [b, N, B-1]
        rows = np.asarray(ids)[:, None, None]
        out["top_ids"] = torch.from_numpy(self.arrays["top_ids"][rows, where].astype(np.int64))
        p = torch.from_numpy(self.arrays["top_p"][rows, where].astype(np.float32))
        out["top_p"] = p / p.sum(-1, keepdim=True)
        # The selector's predecessor of row r: the token committed at a + r - 1 (row 1: the anchor).
        out["prev"] = out["tokens"].gather(1, torch.from_numpy(where.reshape(len(ids), -1))).view(where.shape)
        return out


def row_weights(torch):
    return torch.exp(-torch.arange(BLOCK - 1, dtype=torch.float32) / GAMMA)


def losses(torch, model, b):
    """(layers' loss, selector's loss or None, logits, selector scores or None, candidates)."""
    F = torch.nn.functional
    g, logits = model(b["taps"], b["tokens"], b["anchors"])
    w = row_weights(torch)
    logq = F.log_softmax(logits, dim=-1).gather(-1, b["top_ids"])                       # [b, N, B-1, 32]
    per_row = -(b["top_p"] * logq).sum(-1)
    main = (per_row * w).sum() / (w.sum() * per_row.shape[0] * per_row.shape[1])
    if not model.dflash2:
        return main, None, logits, None, None
    k = model.c["dflash_config"]["selector_top_k"]
    detached = logits.detach()
    cand = detached.topk(k, dim=-1).indices                                              # [b, N, B-1, k]
    scores = model.candidate_selector.scores(g[:, :, 1:].detach(), detached, cand, b["prev"])
    want = ((cand[..., :, None] == b["top_ids"][..., None, :]) * b["top_p"][..., None, :]).sum(-1)
    mass = want.sum(-1)
    keep = (mass > 0).float()
    want = want / mass.clamp_min(1e-12)[..., None]
    sel_row = -(want * F.log_softmax(scores, dim=-1)).sum(-1) * keep
    sel = (sel_row * w).sum() / ((keep * w).sum()).clamp_min(1.0)
    return main, sel, logits, scores, cand


def accepted(torch, picks, target):
    """Leading draft rows whose pick equals the target's greedy token, per block [b, N]."""
    same = (picks == target).int()
    return same.cumprod(-1).sum(-1)


def evaluate(torch, model, data, gen_seed):
    """Validation on held-out greedy continuations: the loss, and the mean acceptance length a
    greedy target would give each block (1 + leading draft rows equal to its argmax), with the
    selector's picks in DFlash 2 (teacher-forced: an accepted prefix walks the target's tokens)."""
    gen = torch.Generator().manual_seed(gen_seed)
    total, tau, blocks = 0.0, 0.0, 0
    with torch.no_grad():
        for at in range(0, len(data.greedy), 8):
            ids = data.greedy[at:at + 8]
            b = data.batch(ids, 16, gen)
            main, sel, logits, scores, cand = losses(torch, model, b)
            picks = logits.argmax(-1) if scores is None else cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]
            acc = accepted(torch, picks, b["top_ids"][..., 0])
            total += float(main) * len(ids)
            tau, blocks = tau + float((acc + 1).sum()), blocks + acc.numel()
    return total / len(data.greedy), tau / blocks


def export(torch, model, out, info):
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "config.json"), {**model.c, "tpdraft_training": info})
    tensors = {name: (t, "bf16") for name, t in model.state_dict().items()}
    write_safetensors(os.path.join(out, "model.safetensors"), torch, tensors, {"format": "pt"})


def run(argv=None):
    a = parse(argv)
    torch = set_threads(a.threads)
    import numpy as np
    import dflash
    target = read_json(os.path.join(a.target, "config.json"), "target config")
    data = Data(np, torch, a.data, a.valid)
    taps = data.meta["taps"]
    bad = [t for t in taps if not 0 <= t < target.get("num_hidden_layers", 0)]
    if bad:
        fail(f"{a.data}/meta.json: field 'taps' names layer {bad[0]}, but the target "
             f"({a.target}/config.json, num_hidden_layers) has {target.get('num_hidden_layers')}")
    import corpus
    sp = corpus.open_tokenizer(os.path.join(a.target, "tokenizer.model"))
    if sp.get_piece_size() != target["vocab_size"]:
        fail(f"{a.target}/tokenizer.model: {sp.get_piece_size()} pieces, but {a.target}/config.json "
             f"field 'vocab_size' is {target['vocab_size']}")
    mask_id = sp.piece_to_id(corpus.MASK_PIECE)
    table = read_safetensors(os.path.join(a.target, "model.safetensors"), torch)["model.embed_tokens.weight"]
    config = geometry(a.arch, target, taps, mask_id)
    model = dflash.Drafter(config, table, seed=a.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "codebook" not in n]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or "codebook" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    os.makedirs(a.work, exist_ok=True)
    state_path = os.path.join(a.work, "state.pt")
    step, cpu_spent = 0, 0.0
    history = {"train": [], "validation": [], "selector": []}
    options = {"steps": a.steps, "seed": a.seed, "lr": a.lr, "batch": a.batch, "anchors": a.anchors}
    if os.path.exists(state_path) and not a.fresh:
        state = torch.load(state_path)
        if state["options"] != options:
            fail(f"{state_path}: a saved run with {state['options']}; give the same options to resume, "
                 "or --fresh to start over")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, history, cpu_spent = state["step"], state["history"], state["cpu_seconds"]
        print(f"drafter.py: resuming {a.arch} at step {step} of {a.steps} ({cpu_spent / 60:.1f} CPU minutes so far)",
              file=sys.stderr)
    clock, progress = CpuClock(cpu_spent), Progress(a.arch, a.steps, step)

    def save():
        save_state(state_path, torch, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                       "options": options, "history": history, "cpu_seconds": clock.total()})

    last_save = time.monotonic()
    val, tau = (history["validation"][-1][1], float("nan")) if history["validation"] else (float("nan"),) * 2
    while step < a.steps:
        if a.stop_after is not None and step >= a.stop_after:
            save()
            print(f"drafter.py: stopped after step {step}; the same command resumes", file=sys.stderr)
            return 0
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, a.steps, a.lr, warmup=50)
        gen = torch.Generator().manual_seed(a.seed * 1_000_003 + step)
        ids = [data.train[i] for i in torch.randint(0, len(data.train), (a.batch,), generator=gen).tolist()]
        main, sel, *_ = losses(torch, model, data.batch(ids, a.anchors, gen))
        loss = main if sel is None else main + sel
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        history["train"].append((step, float(main)))
        if sel is not None:
            history["selector"].append((step, float(sel)))
        if step % 100 == 0 or step == a.steps:
            val, tau = evaluate(torch, model, data, 7)
            history["validation"].append((step, val))
            history.setdefault("tau", []).append((step, tau))
        progress.update(step, clock.total(), loss=float(main), val=val, tau=tau)
        if time.monotonic() - last_save > a.save_every or step == a.steps:
            save()
            plot_losses(a.plot, f"{config['architectures'][0]} on the target's continuations",
                        {k: v for k, v in history.items() if k != "tau"})
            last_save = time.monotonic()

    recent = history["train"][-50:]
    info = {"steps": a.steps, "seed": a.seed, "train_loss_last50": sum(v for _, v in recent) / len(recent),
            "validation_loss": history["validation"][-1][1], "validation_tau": history["tau"][-1][1],
            "cpu_minutes": round(clock.total() / 60, 1), "data": {k: data.meta[k] for k in ("sequences", "generate", "seed")}}
    export(torch, model, a.out, info)
    write_json(os.path.splitext(a.plot)[0] + ".json", {"options": options, **history})
    print(f"drafter.py: wrote {a.out}: validation loss {info['validation_loss']:.4f}, greedy tau on held-out "
          f"continuations {info['validation_tau']:.2f}, {info['cpu_minutes']} CPU minutes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    main_guard("drafter.py", run)
