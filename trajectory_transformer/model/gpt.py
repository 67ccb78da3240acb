"""Trajectory GPT: a decoder-only transformer over discretised transitions.

A transition is `obs (O) | act (A) | reward | value`, T = O + A + 2 tokens; sequence position
i holds dimension i % T. Tokens are raw bin indices in [0, n_bins); the model offsets them
per dimension itself. Three entry points share one trunk and one attention mask:
`forward` (training, full sequence), `prefill` and `decode_step` (planning, with a KVCache or
a SharedPrefixKVCache). On the CPU, a decode step over a SharedPrefixKVCache is one native
call (`native.py`): at one token per row, module calls and small operators cost more than the
matrix products.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from trajectory_transformer.model import native
from trajectory_transformer.model.kv_cache import KVCache, SharedPrefixKVCache


@dataclass(frozen=True)
class GPTConfig:
    observation_dim: int
    """Observation dimensions O."""
    action_dim: int
    """Action dimensions A."""
    n_bins: int
    """Vocabulary size per dimension (bins of the discretiser)."""
    sequence_transitions: int = 10
    """Transitions per training window; block_size = sequence_transitions * transition_dim."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide `embedding_dim`."""
    embedding_dim: int = 128
    """Width of the residual stream."""
    dropout: float = 0.1
    """Dropout on embeddings, attention weights and residual branches."""

    def __post_init__(self) -> None:
        sizes = ("observation_dim", "action_dim", "n_bins", "sequence_transitions", "n_layer")
        for name in (*sizes, "n_head", "embedding_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.embedding_dim % self.n_head != 0:
            raise ValueError(
                f"embedding_dim ({self.embedding_dim}) must be divisible by n_head "
                f"({self.n_head}); pick e.g. embedding_dim={self.n_head * 32}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def transition_dim(self) -> int:
        return self.observation_dim + self.action_dim + 2

    @property
    def block_size(self) -> int:
        return self.sequence_transitions * self.transition_dim


def trajectory_attention_mask(length: int, transition_dim: int) -> torch.Tensor:
    """(length, length) bool, True where query q may attend key k.

    Causal, and no token sees the value token of an earlier transition: the value is the
    reward-to-go, i.e. future information. A value token still sees itself.
    """
    pos = torch.arange(length)
    q, k = pos[:, None], pos[None, :]  # (S, 1), (1, S)
    earlier_value = (k % transition_dim == transition_dim - 1) & (k < q)
    return (k <= q) & ~earlier_value


def attends_shared_prefix(cache: KVCache | SharedPrefixKVCache | None, start: int) -> bool:
    """Whether tokens from `start` attend through `shared_prefix_attention`: positions after the
    prefix of a SharedPrefixKVCache (a prefill from 0 writes the prefix itself, with SDPA)."""
    return isinstance(cache, SharedPrefixKVCache) and start > 0


def shared_prefix_attention(
    q: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    own_k: torch.Tensor,
    own_v: torch.Tensor,
    bias: torch.Tensor,
    rows_per_prefix: int,
) -> torch.Tensor:
    """Attention of rows over [their group's shared prefix ; their own keys], one softmax.

    q (R, nh, S, hs); prefix_k/v (G, nh, P, hs); own_k/v (R, nh, L, hs); bias (S, P + L): the
    attention mask as an additive float, 0 where a query may attend and -inf elsewhere. Rows
    are ordered (copy, group, member) as in `SharedPrefixKVCache`: R = X * G * M rows with
    M = rows_per_prefix. The prefix part is one matmul per group over all its rows' queries,
    so the shared keys and values are read once per group, not once per row. The scores of
    both parts are concatenated and share one softmax. Returns (R, nh, S, hs).
    """
    R, nh, S, hs = q.shape
    G, P = prefix_k.shape[0], prefix_k.shape[2]
    X, M = R // (G * rows_per_prefix), rows_per_prefix
    grouped = (
        q.view(X, G, M, nh, S, hs).permute(1, 3, 0, 2, 4, 5).reshape(G, nh, X * M * S, hs)
    )  # group's queries
    prefix_scores = (grouped @ prefix_k.transpose(-1, -2)).view(G, nh, X, M, S, P)
    own_scores = (q @ own_k.transpose(-1, -2)).view(X, G, M, nh, S, -1)  # (X, G, M, nh, S, L)
    scores = torch.cat([prefix_scores.permute(2, 0, 3, 1, 4, 5), own_scores], dim=-1)
    probs = torch.add(bias, scores, alpha=hs**-0.5).softmax(dim=-1)  # (X, G, M, nh, S, P + L)
    prefix_probs = probs[..., :P].permute(1, 3, 0, 2, 4, 5).reshape(G, nh, X * M * S, P)
    y_prefix = (prefix_probs @ prefix_v).view(G, nh, X, M, S, hs).permute(2, 0, 3, 1, 4, 5)
    y_own = probs[..., P:].reshape(R, nh, S, -1) @ own_v  # (R, nh, S, hs)
    return (y_own.view(X, G, M, nh, S, hs) + y_prefix).reshape(R, nh, S, hs)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.embedding_dim, 3 * config.embedding_dim)
        self.c_proj = nn.Linear(config.embedding_dim, config.embedding_dim)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | SharedPrefixKVCache | None = None,
        layer: int = 0,
        start: int = 0,
    ) -> torch.Tensor:
        B, S, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, S, C)
        q = q.view(B, S, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, S, hs)
        k = k.view(B, S, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, S, hs)
        v = v.view(B, S, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, S, hs)
        if attends_shared_prefix(cache, start):
            prefix_k, prefix_v, k, v = cache.extend(layer, start, k, v)
            y = shared_prefix_attention(
                q, prefix_k, prefix_v, k, v, mask, cache.rows_per_prefix
            )  # (B, nh, S, hs)
        else:
            if cache is not None:
                k, v = cache.update(layer, start, k, v)  # (B, nh, start+S, hs)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
            )  # (B, nh, S, hs)
        y = y.transpose(1, 2).reshape(B, S, C)  # (B, S, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.embedding_dim, 4 * config.embedding_dim)
        self.c_proj = nn.Linear(4 * config.embedding_dim, config.embedding_dim)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.embedding_dim)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.embedding_dim)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | SharedPrefixKVCache | None = None,
        layer: int = 0,
        start: int = 0,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, layer, start)
        return x + self.mlp(self.ln_2(x))


class TrajectoryGPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        T, N, d = config.transition_dim, config.n_bins, config.embedding_dim
        self.tok_emb = nn.Embedding(T * N, d)  # one table, offset per dimension
        self.pos_emb = nn.Embedding(config.block_size, d)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(d)
        # One d -> N head per transition dimension; position i uses head i % T.
        self.head_weight = nn.Parameter(torch.empty(T, d, N))
        self.head_bias = nn.Parameter(torch.zeros(T, N))
        # Derived from the config, so kept out of the state dict.
        positions = torch.arange(config.block_size)
        self.register_buffer("token_offsets", (positions % T) * N, persistent=False)
        mask = trajectory_attention_mask(config.block_size, T)
        self.register_buffer("mask", mask, persistent=False)
        # The same mask as an additive bias, for attention computed outside SDPA.
        bias = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
        self.register_buffer("attn_bias", bias, persistent=False)
        self.apply(self._init_weights)
        nn.init.normal_(self.head_weight, mean=0.0, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # --- trunk and heads ------------------------------------------------------------------

    def _trunk(
        self,
        tokens: torch.Tensor,
        start: int = 0,
        cache: KVCache | SharedPrefixKVCache | None = None,
    ) -> torch.Tensor:
        """Hidden states (B, S, d) after the final norm, for tokens at [start, start+S)."""
        S = tokens.shape[1]
        end = start + S
        if end > self.config.block_size:
            raise ValueError(
                f"positions [{start}, {end}) exceed the block size {self.config.block_size} "
                f"({self.config.sequence_transitions} transitions of "
                f"{self.config.transition_dim} tokens); crop the sequence to its last "
                f"{self.config.block_size} tokens"
            )
        x = self.tok_emb(tokens + self.token_offsets[start:end])  # (B, S, d)
        x = self.drop(x + self.pos_emb.weight[start:end])  # (B, S, d)
        # Cached paths attend over all keys [0, end); the full path over [0, S). A shared-prefix
        # cache splits the keys into the prefix and the rows' own; the mask row stays the same.
        shared = attends_shared_prefix(cache, start)
        mask = (self.attn_bias if shared else self.mask)[start:end, :end]  # (S, end)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask, cache, layer, start)
        return self.ln_f(x)

    def _heads(self, h: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Logits (B, S, N) from hidden states (B, S, d) at positions [start, start+S)."""
        B, S, d = h.shape
        T = self.config.transition_dim
        # Pad to whole transitions so each dimension meets its own head in one einsum.
        lead = start % T
        n = -(-(lead + S) // T)
        h = F.pad(h, (0, 0, lead, n * T - lead - S)).view(B, n, T, d)  # (B, n, T, d)
        logits = torch.einsum("bntd,tdv->bntv", h, self.head_weight) + self.head_bias
        return logits.reshape(B, n * T, -1)[:, lead : lead + S]  # (B, S, N)

    # --- public API -----------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, S, N) for tokens (B, S) of raw bin indices; position i predicts i+1.

        Tokens are not range-checked (that would sync with the device): an index outside
        [0, n_bins) silently reads another dimension's embedding.
        """
        return self._heads(self._trunk(tokens))

    def new_cache(self, rows: int, max_len: int | None = None) -> KVCache:
        """An empty KVCache for `rows` sequences of up to `max_len` (<= block_size) tokens."""
        max_len = self.config.block_size if max_len is None else max_len
        if max_len > self.config.block_size:
            raise ValueError(
                f"max_len {max_len} exceeds the block size {self.config.block_size}; plan over "
                "fewer context + horizon transitions"
            )
        c = self.config
        p = self.head_weight
        return KVCache(
            c.n_layer, rows, c.n_head, max_len, c.embedding_dim // c.n_head, p.device, p.dtype
        )

    def new_shared_prefix_cache(
        self, prefix_rows: int, rows_per_prefix: int, rows: int, prefix_len: int, own_len: int
    ) -> SharedPrefixKVCache:
        """An empty SharedPrefixKVCache: up to `prefix_rows` shared prefixes of up to
        `prefix_len` tokens, and `rows` rows (`rows_per_prefix` per group and copy) of up to
        `own_len` tokens each after their prefix."""
        for name, length in (("prefix_len", prefix_len), ("own_len", own_len)):
            if length > self.config.block_size:
                raise ValueError(f"{name} {length} exceeds the block size {self.config.block_size}")
        c, p = self.config, self.head_weight
        return SharedPrefixKVCache(
            c.n_layer,
            prefix_rows,
            rows_per_prefix,
            rows,
            c.n_head,
            prefix_len,
            own_len,
            c.embedding_dim // c.n_head,
            p.device,
            p.dtype,
        )

    def prefill(
        self, tokens: torch.Tensor, cache: KVCache | SharedPrefixKVCache, start: int = 0
    ) -> torch.Tensor:
        """Run tokens (B, S) at positions [start, start+S), caching their keys and values.

        Attends over the cached [0, start+S) under the training mask. Returns (B, S, N).
        With a SharedPrefixKVCache, a prefill from 0 writes the shared prefix (B groups) and a
        later one extends every row after it.
        """
        return self._heads(self._trunk(tokens, start, cache), start)

    def decode_step(
        self, tokens: torch.Tensor, cache: KVCache | SharedPrefixKVCache, position: int
    ) -> torch.Tensor:
        """Logits (B, N) for one new token (B,) at `position`, attending over [0, position].

        For many steps over one cache, bind it once with `decoder(cache)`.
        """
        return self.decoder(cache)(tokens, position)

    def decoder(
        self, cache: KVCache | SharedPrefixKVCache
    ) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """`decode_step` bound to one cache: `step(tokens (B,), position) -> logits (B, N)`.

        A planner makes a hundred dependent decode steps per search, so what can be looked up
        once (parameters, cache buffers, which path applies) is looked up here.
        """
        T = self.config.transition_dim

        def module_step(tokens: torch.Tensor, position: int) -> torch.Tensor:
            h = self._trunk(tokens[:, None], position, cache)[:, 0]  # (B, d)
            dim = position % T
            return h @ self.head_weight[dim] + self.head_bias[dim]  # (B, N)

        kernels = self._native_kernels(cache)
        if kernels is None:
            return module_step
        return self._native_decoder(cache, kernels, module_step)

    def _native_kernels(self, cache: KVCache | SharedPrefixKVCache) -> object | None:
        """The native decode kernels where they apply (inference on the CPU in float32, with a
        shared-prefix cache), else None."""
        p = self.head_weight
        if (
            not isinstance(cache, SharedPrefixKVCache)
            or self.training
            or torch.is_grad_enabled()
            or p.device.type != "cpu"
            or p.dtype != torch.float32
        ):
            return None
        return native.kernels()

    def _native_decoder(
        self,
        cache: SharedPrefixKVCache,
        kernels: object,
        module_step: Callable[[torch.Tensor, int], torch.Tensor],
    ) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """The decode step as one native call: the modules' computation in eval mode, with
        the parameters and the cache's buffers bound once."""
        c = self.config
        block_size = c.block_size
        layers: list[torch.Tensor] = []
        eps: list[float] = []
        for layer, b in enumerate(self.blocks):
            layers += [
                b.ln_1.weight,
                b.ln_1.bias,
                b.attn.c_attn.weight.t().contiguous(),  # (in, out): see csrc
                b.attn.c_attn.bias,
                b.attn.c_proj.weight.t().contiguous(),
                b.attn.c_proj.bias,
                b.ln_2.weight,
                b.ln_2.bias,
                b.mlp.c_fc.weight.t().contiguous(),
                b.mlp.c_fc.bias,
                b.mlp.c_proj.weight.t().contiguous(),
                b.mlp.c_proj.bias,
                *cache.layer_buffers(layer),  # prefix keys, values; own keys, values
            ]
            eps += [b.ln_1.eps, b.ln_2.eps]
        decoder = kernels.Decoder(
            [p.detach() for p in layers],
            eps,
            self.tok_emb.weight.detach(),
            self.pos_emb.weight.detach(),
            self.ln_f.weight.detach(),
            self.ln_f.bias.detach(),
            self.ln_f.eps,
            self.head_weight.detach(),
            self.head_bias.detach(),
            c.transition_dim,
        )

        def step(tokens: torch.Tensor, position: int) -> torch.Tensor:
            if position == 0:  # this token starts the shared prefix: the prefill path
                return module_step(tokens, position)
            if position >= block_size:
                raise ValueError(f"position {position} exceeds the block size {block_size}")
            cache.check_extension(position, tokens.shape[0])
            # Each block also writes this token's key and value into the cache.
            return decoder.step(
                tokens, position, cache.prefix_length, cache.groups, cache.rows_per_prefix
            )

        return step

    def configure_optimizer(
        self, learning_rate: float, weight_decay: float, betas: tuple[float, float]
    ) -> torch.optim.AdamW:
        """AdamW decaying only weight matrices (Linear weights and the heads)."""
        decay: list[nn.Parameter] = []
        no_decay: list[nn.Parameter] = []  # biases, norms, token and position embeddings
        for module in self.modules():
            for name, p in module.named_parameters(recurse=False):
                is_matrix = isinstance(module, nn.Linear) and name == "weight"
                (decay if is_matrix or p is self.head_weight else no_decay).append(p)
        grouped = {id(p) for p in decay + no_decay}
        assert len(grouped) == len(decay) + len(no_decay), "a parameter is in two groups"
        assert grouped == {id(p) for p in self.parameters()}, "a parameter is in no group"
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
