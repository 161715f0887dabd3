"""A small GPT in PyTorch, read top to bottom like the C reference model
(trainer/model): token and position embeddings, L pre-norm transformer
blocks (causal self-attention, a 4C GELU MLP), a final LayerNorm and an
output projection tied to the token embedding.

Legend: B = lines in the batch, T = tokens per line, C = channels,
NH = attention heads, V = vocabulary, L = layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # V: bytes
    max_seq_len: int = 64  # T at most
    channels: int = 64  # C
    n_layer: int = 2  # L
    n_head: int = 4  # NH; C % NH == 0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.channels, 3 * cfg.channels)  # C -> 3C
        self.proj = nn.Linear(cfg.channels, cfg.channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # each [B, T, C]
        # [B, NH, T, C / NH]
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.channels)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.channels)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.channels, 4 * cfg.channels),
            nn.GELU(),
            nn.Linear(4 * cfg.channels, cfg.channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.channels)  # [V, C], tied to the output
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.channels)  # [T, C]
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.channels)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of predicting targets [B, T] from inputs [B, T]."""
        B, T = inputs.shape
        pos = torch.arange(T, device=inputs.device)
        x = self.wte(inputs) + self.wpe(pos)  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # [B, T, V]
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
