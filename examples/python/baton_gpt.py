"""The GPT of baton's `models::gpt` (registry name "gpt") as a torch.nn module.

`baton export STATE -o gpt.pt` writes a state_dict this module loads strictly:

    import torch
    from baton_gpt import GPT
    model = GPT(vocab=258, block_size=128, n_layer=4, n_head=4, n_embd=128)
    model.load_state_dict(torch.load("gpt.pt"))   # strict: every name and shape must match
    model.eval()
    logits = model(torch.tensor([[72, 105]]))     # [1, 2, vocab]

The options are the `[model]` keys of the curriculum (docs/language-models.md). `classes > 0`
builds the classifier of a fine-tune stage: the same trunk, and a `head` reading the last
position that is not `pad` (`pool="last"`) or the mean over those positions (`pool="mean"`). The arithmetic follows the C++ module op for op (exact GELU,
LayerNorm eps 1e-5, a causal mask applied before the softmax), so logits agree to float
rounding; tests/python/check_gpt.py checks that on every CI run.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.heads, self.p = n_head, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        att = F.dropout(att, self.p, self.training)
        return self.c_proj(torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.p = dropout
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = Attention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = Mlp(n_embd)

    def forward(self, x):
        x = x + F.dropout(self.attn(self.ln_1(x)), self.p, self.training)
        return x + F.dropout(self.mlp(self.ln_2(x)), self.p, self.training)


class GPT(nn.Module):
    def __init__(self, vocab=258, block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.0, classes=0, pad=257,
                 pool="last"):
        super().__init__()
        if pool not in ("last", "mean"):
            raise ValueError(f'pool must be "last" or "mean", got {pool!r}')
        self.block_size, self.p, self.classes, self.pad, self.pool = block_size, dropout, classes, pad, pool
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        if classes > 0:
            self.head = nn.Linear(n_embd, classes)

    def forward(self, x):
        T = x.size(1)
        if T > self.block_size:
            raise ValueError(f"{T} positions is more than block_size {self.block_size}")
        pos = torch.arange(T, device=x.device)
        y = F.dropout(self.wte(x) + self.wpe(pos).unsqueeze(0), self.p, self.training)
        for block in self.h:
            y = block(y)
        y = self.ln_f(y)
        if self.classes == 0:
            return torch.matmul(y, self.wte.weight.t())  # tied read-out
        if self.pool == "mean":  # over the positions that are not padding (none: zeros)
            if self.pad < 0:
                return self.head(y.mean(1))
            keep = x.ne(self.pad).unsqueeze(2).to(y.dtype)
            return self.head((y * keep).sum(1) / keep.sum(1).clamp_min(1.0))
        positions = pos.unsqueeze(0).expand_as(x)
        if self.pad < 0:
            last = torch.full((x.size(0),), T - 1, dtype=torch.long, device=x.device)
        else:
            last = positions.masked_fill(x.eq(self.pad), 0).amax(1)
        at = last.view(-1, 1, 1).expand(x.size(0), 1, y.size(2))
        return self.head(y.gather(1, at).squeeze(1))
