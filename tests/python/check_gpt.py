"""Loads a baton GPT export strictly into examples/python/baton_gpt.py and compares logits.

usage: check_gpt.py WEIGHTS.pt IO.pt OPTIONS.json
  WEIGHTS.pt  what `baton export` wrote (a state_dict)
  IO.pt       a state_dict with "x" (int64 token ids) and "logits" (baton's, in eval mode)
  OPTIONS.json the model's keys (vocab, block_size, n_layer, n_head, n_embd, classes, pad)
Prints the largest absolute difference; exit status 1 when it is above 1e-5 or loading fails.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from baton_gpt import GPT  # noqa: E402

weights, io, options = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
model = GPT(**options)
model.load_state_dict(torch.load(weights), strict=True)
model.eval()
data = torch.load(io)
with torch.no_grad():
    logits = model(data["x"])
if logits.shape != data["logits"].shape:
    print(f"shape: python {tuple(logits.shape)}, baton {tuple(data['logits'].shape)}")
    sys.exit(1)
diff = (logits - data["logits"]).abs().max().item()
print(f"max abs difference {diff:.3g} over {logits.numel()} logits")
sys.exit(0 if diff <= 1e-5 else 1)
