"""gpt_parity.py: the pretraining stage of examples/fortunes_gpt.toml in Python PyTorch (python3-torch).

The same model (examples/python/baton_gpt.py, baton's initialisation: normal 0.02, residual
projections 0.02 / sqrt(2 n_layer), zero biases), the same token stream (the token shards `baton
pack` writes of the curriculum's datasets), the same budget (batches of windows), AdamW with the
same groups (no weight decay on biases, LayerNorm and embeddings), linear warm-up then cosine to 0
as baton's schedule computes it, clipping by global norm. Prints the validation bits per byte over
the first --val-windows windows of the validation stream (windows at 0, T, 2T, ...: what baton's
eval reads), with the byte length of each token from the shards' manifest:

    build/baton pack examples/fortunes_gpt.toml pretrain -o /tmp/p/train
    build/baton pack examples/fortunes_gpt.toml pretrain_val -o /tmp/p/val
    /usr/bin/python3 benchmarks/gpt_parity.py --train /tmp/p/train --val /tmp/p/val [--seed 7]

Data order: each epoch visits every window once in a random order, at a random phase (baton's
scheme, drawn from another generator, so not the same windows batch by batch). Parity is a
comparison of what the same recipe reaches, not of bits.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from baton_gpt import GPT  # noqa: E402


def read_shards(directory):
    with open(os.path.join(directory, "tokens.json")) as f:
        manifest = json.load(f)
    if manifest.get("format") != "baton-tokens":
        sys.exit(f"{directory}: not baton token shards (baton pack of a language-model dataset)")
    parts = [np.fromfile(os.path.join(directory, s["file"]), dtype="<u2") for s in manifest["shards"]]
    stream = torch.from_numpy(np.concatenate(parts).astype(np.int64))
    return stream, manifest


def init_like_baton(model, n_layer):
    residual = 0.02 / math.sqrt(2.0 * n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("ln_f."):
                continue
            if name.endswith(".bias"):
                p.zero_()
            elif "c_proj.weight" in name:
                p.normal_(0.0, residual)
            else:
                p.normal_(0.0, 0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--batches", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--val-windows", type=int, default=512)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    train, manifest = read_shards(a.train)
    val, val_manifest = read_shards(a.val)
    if manifest["tokenizer"] != val_manifest["tokenizer"]:
        sys.exit("the training and validation shards have different tokenizers")
    lengths = torch.tensor(manifest["byte_lengths"], dtype=torch.float64)
    T, B = a.block_size, a.batch_size
    model = GPT(vocab=manifest["vocab_size"], block_size=T, n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, pad=1)
    init_like_baton(model, a.n_layer)
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            plain = isinstance(module, (torch.nn.LayerNorm, torch.nn.Embedding)) or name == "bias"
            (no_decay if plain else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr)

    def factor(t):  # baton's linear_warmup(W) then cosine over the rest of the stage, to 0
        if t < a.warmup:
            return t / a.warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (t - a.warmup) / (a.batches - a.warmup))))

    g = torch.Generator().manual_seed(a.seed)
    room = train.numel() - T
    windows = (train.numel() - 1) // T
    order, phase, at = None, 0, windows
    model.train()
    start = time.perf_counter()
    for t in range(a.batches):
        if at + B > windows:  # a new epoch: a random phase and order
            phase = int(torch.randint(0, room, (1,), generator=g))
            order, at = torch.randperm(windows, generator=g), 0
        starts = (order[at:at + B] * T + phase) % room
        at += B
        rows = train[starts.unsqueeze(1) + torch.arange(T + 1).unsqueeze(0)]
        for group in opt.param_groups:
            group["lr"] = a.lr * factor(t)
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(2)), rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        if (t + 1) % 50 == 0:
            print(f"batch {t + 1}: loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    seconds = time.perf_counter() - start

    model.eval()
    nats, nbytes, ntokens = 0.0, 0.0, 0
    n = min(a.val_windows, (val.numel() - 1) // T)
    with torch.no_grad():
        for i in range(0, n, 64):
            starts = torch.arange(i, min(n, i + 64)) * T
            rows = val[starts.unsqueeze(1) + torch.arange(T + 1).unsqueeze(0)]
            logits = model(rows[:, :-1])
            y = rows[:, 1:].reshape(-1)
            nats += F.cross_entropy(logits.reshape(-1, logits.size(2)).double(), y, reduction="sum").item()
            nbytes += lengths[y].sum().item()
            ntokens += y.numel()
    m, s = divmod(int(round(seconds)), 60)
    print(f"gpt_parity python val_bits_per_byte={nats / math.log(2) / nbytes:.4f} val_bits_per_token="
          f"{nats / math.log(2) / ntokens:.4f} train_time={m}:{s:02d} ({a.batches} batches of {B} x {T}, seed {a.seed}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
