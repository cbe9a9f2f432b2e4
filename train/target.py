#!/usr/bin/python3
"""Trains the target of the pair: a Qwen3-shaped causal LM on the standard library's train split,
then writes it in the Hugging Face layout (config.json, model.safetensors in bf16, the tokenizer
beside them).

  target.py [--steps N] [--threads 2] [--seed 0] [--work build/train/target] [--out pair/target] [--fresh]

Resumable: the state (weights, optimizer, step, CPU time spent, losses) is saved every
--save-every seconds under --work; running the same command again continues from there, and the
batches depend only on the seed and the step, so a resumed run trains exactly as one that never
stopped. A progress bar goes to stderr; the loss curve is written as a PNG."""

import argparse
import os
import sys
import time

sys.dont_write_bytecode = True
from common import (PAIR, WORK, CpuClock, Progress, cosine_lr, fail, main_guard, plot_losses, save_state,  # noqa: E402
                    set_threads, write_json, write_safetensors)
import corpus  # noqa: E402

GEOMETRY = {"hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "intermediate_size": 1024, "vocab_size": 16384, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 1024}
SEQ, BATCH = 512, 8


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=420, help="optimizer steps of BATCH x SEQ tokens")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--manifest", default=corpus.MANIFEST)
    p.add_argument("--tokenizer", default=corpus.TOKENIZER)
    p.add_argument("--work", default=os.path.join(WORK, "target"))
    p.add_argument("--out", default=os.path.join(PAIR, "target"))
    p.add_argument("--plot", default=os.path.join(PAIR, "target-loss.png"),
                   help="the loss curve (PNG); its numbers go beside it as .json")
    p.add_argument("--save-every", type=float, default=120.0, help="seconds between saved states")
    p.add_argument("--fresh", action="store_true", help="ignore a saved state and start over")
    p.add_argument("--stop-after", type=int, help="save and stop after this step, as an interruption would")
    a = p.parse_args(argv)
    if a.steps < 1 or a.threads < 1:
        p.error("--steps and --threads must be at least 1")
    return a


def token_stream(np, manifest, tokenizer, split, cache):
    """The split's files tokenized and joined, EOS (id 2) after each file, as uint16 (cached)."""
    if os.path.exists(cache):
        return np.load(cache)
    sp = corpus.open_tokenizer(tokenizer)
    if sp.get_piece_size() != GEOMETRY["vocab_size"]:
        fail(f"{tokenizer}: {sp.get_piece_size()} pieces, but the target's vocab_size is {GEOMETRY['vocab_size']}")
    ids = []
    for path, _ in corpus.split_files(manifest, split):
        ids += sp.encode(corpus.read_text(path)) + [sp.eos_id()]
    stream = np.asarray(ids, dtype=np.uint16)
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    np.save(cache + ".tmp.npy", stream)
    os.replace(cache + ".tmp.npy", cache)
    return stream


def windows(torch, stream, count, seq, generator):
    """count random windows of seq + 1 tokens from the stream (inputs and their next tokens)."""
    starts = torch.randint(0, len(stream) - seq - 1, (count,), generator=generator)
    rows = [torch.from_numpy(stream[s:s + seq + 1].astype("int64")) for s in starts.tolist()]
    return torch.stack(rows)


def lm_loss(torch, model, batch):
    hidden, _ = model(batch[:, :-1])
    logits = hidden @ model.head_weight().T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def export(torch, model, out, tokenizer, info):
    import qwen3
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "config.json"), {**qwen3.hf_config(GEOMETRY), "tpdraft_training": info})
    tensors = {name: (t, "bf16") for name, t in model.export_tensors().items()}
    write_safetensors(os.path.join(out, "model.safetensors"), torch, tensors, {"format": "pt"})
    if os.path.abspath(tokenizer) != os.path.abspath(os.path.join(out, "tokenizer.model")):
        with open(tokenizer, "rb") as src, open(os.path.join(out, "tokenizer.model"), "wb") as dst:
            dst.write(src.read())


def run(argv=None):
    a = parse(argv)
    torch = set_threads(a.threads)
    import numpy as np
    import qwen3
    manifest = corpus.load_manifest(a.manifest)
    os.makedirs(a.work, exist_ok=True)
    train = token_stream(np, manifest, a.tokenizer, "train", os.path.join(a.work, "train-tokens.npy"))
    valid = token_stream(np, manifest, a.tokenizer, "validation", os.path.join(a.work, "validation-tokens.npy"))
    val_batch = windows(torch, valid, 16, SEQ, torch.Generator().manual_seed(1_000_003))

    model = qwen3.Qwen3(GEOMETRY, seed=a.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    state_path = os.path.join(a.work, "state.pt")
    step, history, cpu_spent = 0, {"train": [], "validation": []}, 0.0
    if os.path.exists(state_path) and not a.fresh:
        state = torch.load(state_path)
        if state["steps"] != a.steps or state["seed"] != a.seed or state["lr"] != a.lr:
            fail(f"{state_path}: a saved run with --steps {state['steps']} --seed {state['seed']} --lr {state['lr']}; "
                 "give the same options to resume, or --fresh to start over")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, history, cpu_spent = state["step"], state["history"], state["cpu_seconds"]
        print(f"target.py: resuming at step {step} of {a.steps} ({cpu_spent / 60:.1f} CPU minutes so far)", file=sys.stderr)
    clock, progress = CpuClock(cpu_spent), Progress("target", a.steps, step)

    def save():
        save_state(state_path, torch, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                       "steps": a.steps, "seed": a.seed, "lr": a.lr, "history": history,
                                       "cpu_seconds": clock.total()})

    def validate():
        with torch.no_grad():
            value = float(lm_loss(torch, model, val_batch))
        history["validation"].append((step, value))
        return value

    last_save, val = time.monotonic(), (history["validation"][-1][1] if history["validation"] else float("nan"))
    while step < a.steps:
        if a.stop_after is not None and step >= a.stop_after:
            save()
            print(f"target.py: stopped after step {step}; the same command resumes", file=sys.stderr)
            return 0
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, a.steps, a.lr, warmup=30)
        batch = windows(torch, train, BATCH, SEQ, torch.Generator().manual_seed(a.seed * 1_000_000 + step))
        loss = lm_loss(torch, model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        history["train"].append((step, float(loss)))
        if step % 25 == 0 or step == a.steps:
            val = validate()
        progress.update(step, clock.total(), loss=float(loss), val=val)
        if time.monotonic() - last_save > a.save_every or step == a.steps:
            save()
            plot_losses(a.plot, "target: Qwen3-shaped LM on the stdlib train split", history)
            last_save = time.monotonic()

    info = {"steps": a.steps, "seed": a.seed, "tokens_seen": a.steps * BATCH * SEQ,
            "train_loss_last25": sum(v for _, v in history["train"][-25:]) / min(25, len(history["train"])),
            "validation_loss": history["validation"][-1][1], "cpu_minutes": round(clock.total() / 60, 1)}
    export(torch, model, a.out, a.tokenizer, info)
    write_json(os.path.splitext(a.plot)[0] + ".json", {"options": {"steps": a.steps, "seed": a.seed, "lr": a.lr},
                                                       **history})
    print(f"target.py: wrote {a.out}: validation loss {info['validation_loss']:.4f}, train loss "
          f"{info['train_loss_last25']:.4f} (last 25 steps), {info['cpu_minutes']} CPU minutes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    main_guard("target.py", run)
