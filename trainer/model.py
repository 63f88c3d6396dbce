"""A small nanochat-style GPT: rotary embeddings, RMSNorm, relu² MLP, untied head.

Small on purpose: the trainer runs on 2-core CI machines and is both a real
trainer and the instrument ddpwatch's tests use to put jobs into known states.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 512
    seq_len: int = 64      # longest sequence; the rotary tables cover this many positions
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 128

    @classmethod
    def from_depth(cls, depth: int, *, vocab_size: int, seq_len: int) -> "GPTConfig":
        """nanochat's one-knob sizing: width grows with depth, heads are 64 wide."""
        n_embd = depth * 64
        return cls(vocab_size=vocab_size, seq_len=seq_len, n_layer=depth,
                   n_head=max(1, n_embd // 64), n_embd=n_embd)


def norm(x: torch.Tensor) -> torch.Tensor:
    # RMSNorm without a learnable gain (as nanochat): fewer parameters, same training.
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0):
    """cos/sin of shape (1, 1, seq_len, head_dim/2), broadcastable over (B, H, T, D/2)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos()[None, None], angles.sin()[None, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must divide into heads"
        self.n_head = config.n_head
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_k = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_v = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        shape = (B, T, self.n_head, C // self.n_head)
        q = self.c_q(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(shape).transpose(1, 2)
        v = self.c_v(x).view(shape).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = norm(q), norm(k)  # QK-norm (nanochat): keeps attention logits tame
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())  # relu², as nanochat


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin):
        x = x + self.attn(norm(x), cos, sin)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)  # untied
        cos, sin = rotary_tables(config.seq_len, config.n_embd // config.n_head)
        # Non-persistent buffers: they follow .to(device/dtype) but are not
        # checkpointed; identical on every rank, so DDP need not broadcast them.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                fan_in = module.weight.size(1)
                module.weight.uniform_(-fan_in ** -0.5, fan_in ** -0.5)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0)
        # Zero the residual-branch outputs and the head (nanochat): every block
        # starts as the identity and the first loss is exactly ln(vocab_size).
        for block in self.blocks:
            block.attn.c_proj.weight.zero_()
            block.mlp.c_proj.weight.zero_()
        self.lm_head.weight.zero_()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        T = idx.size(1)
        assert T <= self.config.seq_len, f"sequence of {T} > seq_len {self.config.seq_len}"
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        x = norm(self.wte(idx))
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def param_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameter counts by kind, plus `total` (all parameters, counted once).

    Printed at start-up because labels lie (field report: a model called "80M"
    had 126M parameters). Accepts a DDP- or torch.compile-wrapped model.
    """
    counts = dict(embedding=0, attention=0, mlp=0, norms=0, lm_head=0, other=0)
    for name, param in model.named_parameters():
        if "wte" in name:
            kind = "embedding"
        elif ".attn." in name:
            kind = "attention"
        elif ".mlp." in name:
            kind = "mlp"
        elif "norm" in name:
            kind = "norms"
        elif "lm_head" in name:
            kind = "lm_head"
        else:
            kind = "other"
        counts[kind] += param.numel()
    if not counts["other"]:
        del counts["other"]
    counts["total"] = sum(p.numel() for p in model.parameters())
    return counts
