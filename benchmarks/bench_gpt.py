"""bench_gpt.py: the loop of bench_gpt.cpp's hand-written side in Python PyTorch (python3-torch).

The same GPT (examples/python/baton_gpt.py, the defaults of models::gpt), AdamW lr 3e-4 with
weight decay 0.01, batches of 16 windows of 128 bytes of the English fortunes' training part,
token cross-entropy. Prints tokens/s as bench_gpt does, so that benchmarks/README.md can put the
two side by side from one sitting:

    /usr/bin/python3 benchmarks/bench_gpt.py [--reps 3] [--batches 30] [--threads 2]

The windows are random 128-byte slices of the corpus stream (the cost of a step does not depend
on which bytes it reads); the corpus is read by baton's policy only roughly (records split on
'%' lines, no overstrike cleaning), which changes no timing.
"""
import argparse
import glob
import os
import sys
import time

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from baton_gpt import GPT  # noqa: E402


def stream():
    data = bytearray()
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if os.path.islink(path) or path.endswith((".dat", ".u8")) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            for record in f.read().split(b"\n%\n"):
                data += record.strip(b"\n") + bytes([0])
    t = torch.tensor(list(data), dtype=torch.long)
    t[t == 0] = 256  # end of text
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(7)
    s = stream()
    T, B = 128, 16
    model = GPT()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-2)
    g = torch.Generator().manual_seed(7)

    def train(steps):
        for _ in range(steps):
            starts = torch.randint(0, s.numel() - T - 1, (B,), generator=g)
            idx = starts.unsqueeze(1) + torch.arange(T + 1).unsqueeze(0)
            w = s[idx]
            x, y = w[:, :-1], w[:, 1:]
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.size(2)), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return steps * B * T

    train(5)
    rates = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        n = train(a.batches)
        rates.append(n / (time.perf_counter() - t0))
    rates.sort()
    print(f"gpt_python tokens_per_s={rates[len(rates) // 2]:.0f} (torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"per-rep [{', '.join(f'{r:.0f}' for r in rates)}])")


if __name__ == "__main__":
    main()
