"""Trajectory GPT: a decoder-only transformer over discretised transitions.

A transition is `obs (O) | act (A) | reward | value`, T = O + A + 2 tokens; sequence position
i holds dimension i % T. Tokens are raw bin indices in [0, n_bins); the model offsets them
per dimension itself. Three entry points share one trunk and one attention mask:
`forward` (training, full sequence), `prefill` and `decode_step` (planning, with a KVCache or
a SharedPrefixKVCache). On the CPU, a decode step over a SharedPrefixKVCache is one native
call (`decode/native.py`): at one token per row, module calls and small operators cost more
than the matrix products. The other decode paths (the fused Triton step, the CUDA graph
capture) are in `decode/` too. What only training needs sits beside this file: the CPU
dropout (`dropout.py`) and activation checkpointing (`checkpointing.py`).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from trajectory_transformer.model.checkpointing import checkpointed_blocks
from trajectory_transformer.model.decode import native
from trajectory_transformer.model.dropout import Dropout, dropout_attention
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
    activation_checkpointing: str = "none"
    """Training memory for time: `none` keeps every activation for the backward pass; `full`
    keeps only each checkpointed block's input and reruns its forward during backward;
    `selective` also keeps the matrix-product and attention outputs and reruns only the
    cheap pointwise ops. Same loss and gradients in every mode; planning is unaffected."""
    checkpoint_every_n_layers: int = 1
    """With checkpointing, checkpoint the blocks whose index is a multiple of this."""
    value_sees_itself: bool = True
    """The attention mask of value tokens: True, a value token attends to itself (no token
    sees an earlier transition's value); False, the whole value column is hidden, the token's
    own position included, as in the original code (its residual stream still carries it).
    The effect is measured in docs/departures.md; the native CPU decoder implements True, and False
    decodes with the PyTorch modules."""
    value_inputs: bool = False
    """Each token's real value as a second input: normalised per dimension (clipped to the
    data's range, then centred and scaled by the data's mean and standard deviation), times a
    learned vector per dimension, added to the token's embedding. Real transitions carry
    their observed values; a token without one (an imagined token fed back by the search)
    carries what it decodes to, the mean of its bin. False is the paper's model: tokens
    alone. The outputs stay categorical either way."""

    value_embedding: str = "linear"
    """With `value_inputs`, how a token's normalised value becomes a vector: `linear`, the
    value times a learned vector per dimension; `periodic`, sines and cosines of the value at
    learned frequencies, then a learned linear map and a ReLU, per dimension (Gorishniy et
    al. 2022's PLR embeddings), so that the vector's direction, not only its length, follows
    the value: the blocks' layer norms keep a direction and rescale a length."""
    token_embeddings: bool = True
    """With `value_inputs`, False drops the tokens' learned embeddings from the inputs: a token
    enters by its real value alone (and its position). A lookup per bin lets the model fit
    the data bin by bin and answer anything off it; a value alone makes every input a smooth
    function of the state. The outputs stay categorical."""
    observation_vector: bool = False
    """With `value_inputs`, the whole observation as one more input: its normalised values
    (real, or what its tokens decode to) through a learned linear map, added to the inputs of
    its transition's last observation token and of every token after it in the transition
    (the tokens that predict the actions, the reward and the value). Without it, attention
    must assemble the observation from its separate tokens at every layer; with it, the
    tokens that choose the action start from the whole state, as a policy network does."""

    VALUE_EMBEDDINGS: typing.ClassVar[tuple[str, ...]] = ("linear", "periodic")
    PERIODIC_FREQUENCIES: typing.ClassVar[int] = 16
    """Frequencies per dimension of `value_embedding=periodic`."""
    DATA_FIELDS: typing.ClassVar[tuple[str, ...]] = ("observation_dim", "action_dim", "n_bins")
    """The fields that a dataset and its discretizer fix; the others are the architecture."""
    EXECUTION_FIELDS: typing.ClassVar[tuple[str, ...]] = (
        "activation_checkpointing",
        "checkpoint_every_n_layers",
    )
    """The fields that change how training runs, not the function or the parameters."""
    CHECKPOINTING_MODES: typing.ClassVar[tuple[str, ...]] = ("none", "full", "selective")

    def __post_init__(self) -> None:
        sizes = ("observation_dim", "action_dim", "n_bins", "sequence_transitions", "n_layer")
        for name in (*sizes, "n_head", "embedding_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.embedding_dim % self.n_head != 0:
            raise ValueError(
                f"model.embedding_dim ({self.embedding_dim}) must be divisible by model.n_head "
                f"({self.n_head}); pick e.g. model.embedding_dim={self.n_head * 32}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.activation_checkpointing not in self.CHECKPOINTING_MODES:
            raise ValueError(
                "model.activation_checkpointing must be one of "
                f"{', '.join(self.CHECKPOINTING_MODES)}; got {self.activation_checkpointing!r}"
            )
        if self.value_embedding not in self.VALUE_EMBEDDINGS:
            raise ValueError(
                f"model.value_embedding must be one of {', '.join(self.VALUE_EMBEDDINGS)}; "
                f"got {self.value_embedding!r}"
            )
        if not self.token_embeddings and not self.value_inputs:
            raise ValueError(
                "model.token_embeddings=false leaves the model no inputs: it needs "
                "model.value_inputs=true"
            )
        if self.observation_vector and not self.value_inputs:
            raise ValueError(
                "model.observation_vector=true reads the observation's normalised values: it "
                "needs model.value_inputs=true"
            )
        if self.checkpoint_every_n_layers <= 0:
            raise ValueError(
                f"checkpoint_every_n_layers must be positive, got {self.checkpoint_every_n_layers}"
            )

    @property
    def transition_dim(self) -> int:
        return self.observation_dim + self.action_dim + 2

    @property
    def block_size(self) -> int:
        return self.sequence_transitions * self.transition_dim


def trajectory_attention_mask(
    length: int, transition_dim: int, value_sees_itself: bool = True
) -> torch.Tensor:
    """(length, length) bool, True where query q may attend key k.

    Causal, and no token sees the value token of an earlier transition: the value is the
    reward-to-go, i.e. future information. A value token still sees itself, unless
    `value_sees_itself` is False (the original code's mask: the whole column hidden).
    """
    pos = torch.arange(length)
    q, k = pos[:, None], pos[None, :]  # (S, 1), (1, S)
    value = k % transition_dim == transition_dim - 1
    hidden_value = value & (k < q) if value_sees_itself else value
    return (k <= q) & ~hidden_value


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.embedding_dim, 3 * config.embedding_dim)
        self.c_proj = nn.Linear(config.embedding_dim, config.embedding_dim)
        self.dropout = config.dropout
        self.resid_dropout = Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | SharedPrefixKVCache | None = None,
        layer: int = 0,
        start: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        """Self-attention of x (B, S, C) under `mask` (S, S), or, with a cache, over
        everything it holds up to these positions (the cache writes and attends). A `start`
        held in a device tensor (1,) is a decode step: one token per row, attending over the
        cache's whole buffer under a mask built from that position."""
        B, S, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, S, C)
        q = q.view(B, S, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, S, hs)
        k = k.view(B, S, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, S, hs)
        v = v.view(B, S, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, S, hs)
        dropout_p = self.dropout if self.training else 0.0
        if cache is None and dropout_p > 0 and x.device.type == "cpu":
            # No fused CPU kernel takes dropout; SDPA's fallback keeps 3 copies of the weights.
            y = dropout_attention(q, k, v, mask, dropout_p)
        elif cache is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        elif isinstance(start, torch.Tensor):
            y = cache.attend_step(layer, start, q, k, v)  # (B, nh, 1, hs)
        else:
            y = cache.attend(layer, start, q, k, v, dropout_p)  # (B, nh, S, hs)
        y = y.transpose(1, 2).reshape(B, S, C)  # (B, S, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.embedding_dim, 4 * config.embedding_dim)
        self.c_proj = nn.Linear(4 * config.embedding_dim, config.embedding_dim)
        self.dropout = Dropout(config.dropout)

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
        mask: torch.Tensor | None,
        cache: KVCache | SharedPrefixKVCache | None = None,
        layer: int = 0,
        start: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, layer, start)
        return x + self.mlp(self.ln_2(x))


class TrajectoryGPT(nn.Module):
    OBSERVATION_VECTOR_NEEDED = (
        "a decode step, or tokens that start inside a transition, need the transition's "
        "observation vector (`observation`, from `observation_vectors`): the model has "
        "model.observation_vector=true"
    )

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        T, N, d = config.transition_dim, config.n_bins, config.embedding_dim
        # One table, offset per dimension; none where tokens enter by their values alone.
        self.tok_emb = nn.Embedding(T * N, d) if config.token_embeddings else None
        self.pos_emb = nn.Embedding(config.block_size, d)
        if config.value_inputs:
            # The map of a token's normalised value into the stream (`value_vectors`), one
            # per dimension.
            if config.value_embedding == "linear":
                self.value_weight = nn.Parameter(torch.empty(T, d))
            else:  # periodic: frequencies, then a linear map of their sines and cosines
                K = config.PERIODIC_FREQUENCIES
                self.value_frequencies = nn.Parameter(torch.empty(T, K))
                self.value_weight = nn.Parameter(torch.empty(T, 2 * K, d))
                self.value_bias = nn.Parameter(torch.zeros(T, d))
            # How each dimension's values are normalised, and what each token decodes to
            # (normalised): set from the discretizer with `set_value_inputs`, saved with the
            # weights. Until then values pass unchanged and tokens decode to 0.
            self.register_buffer("input_low", torch.full((T,), -torch.inf))
            self.register_buffer("input_high", torch.full((T,), torch.inf))
            self.register_buffer("input_loc", torch.zeros(T))
            self.register_buffer("input_scale", torch.ones(T))
            self.register_buffer("token_inputs", torch.zeros(T, N))
        if config.observation_vector:
            O = config.observation_dim  # noqa: E741
            self.observation_map = nn.Linear(O, d)
            # 1 at the positions that take their transition's observation vector: the last
            # observation token and everything after it in the transition.
            dims = torch.arange(config.block_size) % T
            self.register_buffer("observation_positions", (dims >= O - 1).float(), persistent=False)
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(d)
        # One d -> N head per transition dimension; position i uses head i % T.
        self.head_weight = nn.Parameter(torch.empty(T, d, N))
        self.head_bias = nn.Parameter(torch.zeros(T, N))
        # Derived from the config, so kept out of the state dict.
        positions = torch.arange(config.block_size)
        self.register_buffer("token_offsets", (positions % T) * N, persistent=False)
        mask = trajectory_attention_mask(config.block_size, T, config.value_sees_itself)
        self.register_buffer("mask", mask, persistent=False)
        self.apply(self._init_weights)
        nn.init.normal_(self.head_weight, mean=0.0, std=0.02)
        if config.value_inputs:
            nn.init.normal_(self.value_weight, mean=0.0, std=0.02)
            if config.value_embedding == "periodic":
                nn.init.normal_(self.value_frequencies, mean=0.0, std=1.0)
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

    # --- value inputs ---------------------------------------------------------------------

    @torch.no_grad()
    def set_value_inputs(
        self,
        token_values: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        loc: torch.Tensor,
        scale: torch.Tensor,
    ) -> None:
        """Fix how real values enter (`value_inputs`): per dimension (T,), values are clipped
        to [low, high] (the data's range, as tokens clip to the edge bins), then centred on
        `loc` and divided by `scale`; `token_values` (T, N) are what the tokens decode to,
        the input of a token fed back without a value of its own."""
        if not self.config.value_inputs:
            raise ValueError("this model has no value inputs (model.value_inputs=false)")
        for name, tensor in (("low", low), ("high", high), ("loc", loc), ("scale", scale)):
            getattr(self, f"input_{name}").copy_(torch.as_tensor(tensor).reshape(-1))
        if not bool((self.input_scale > 0).all()):
            raise ValueError("value input scales must be positive")
        T = self.config.transition_dim
        dims = torch.arange(T, device=self.token_inputs.device)
        self.token_inputs.copy_(self.normalise_values(torch.as_tensor(token_values).T, dims).T)

    def normalise_values(self, values: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
        """Real values (..., S) of dimensions `dims` (S,) as the model takes them: clipped to
        their dimension's range, centred and scaled."""
        values = values.to(self.input_loc)
        clipped = torch.minimum(torch.maximum(values, self.input_low[dims]), self.input_high[dims])
        return (clipped - self.input_loc[dims]) / self.input_scale[dims]

    def embedding_table(self) -> torch.Tensor:
        """(T * N, d): the input of every token without a value of its own, the value input
        of its decoded value included. The decode paths read their embeddings from it."""
        if not self.config.value_inputs:
            return self.tok_emb.weight
        T, N = self.config.transition_dim, self.config.n_bins
        dims = torch.arange(T, device=self.token_inputs.device).repeat_interleave(N)
        table = self.value_vectors(self.token_inputs.reshape(1, -1), dims)[0]  # (T * N, d)
        return table if self.tok_emb is None else self.tok_emb.weight + table

    def value_vectors(self, normalised: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
        """The input vectors (..., S, d) of normalised values (..., S) of dimensions `dims`
        (S,) (`value_embedding`)."""
        if self.config.value_embedding == "linear":
            return normalised[..., None] * self.value_weight[dims]
        angles = 2 * math.pi * normalised[..., None] * self.value_frequencies[dims]  # (.., S, K)
        features = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., S, 2K)
        mapped = torch.einsum("...sk,skd->...sd", features, self.value_weight[dims])
        return F.relu(mapped + self.value_bias[dims])

    def _embed(
        self,
        tokens: torch.Tensor,
        positions: slice | torch.Tensor,
        values: torch.Tensor | None,
    ) -> torch.Tensor:
        """Token embeddings (B, S, d) of tokens (B, S) at `positions`, with their value inputs:
        `values` (B, S) real values, or None for what the tokens decode to."""
        offsets = self.token_offsets[positions]  # (S,)
        if not self.config.value_inputs or values is None:
            return F.embedding(tokens + offsets, self.embedding_table())
        if values.shape != tokens.shape:
            raise ValueError(
                f"values {tuple(values.shape)} must have the tokens' shape {tuple(tokens.shape)}"
            )
        dims = offsets // self.config.n_bins  # (S,)
        normalised = self.normalise_values(values, dims)  # (B, S)
        embedded = self.value_vectors(normalised, dims)
        return embedded if self.tok_emb is None else self.tok_emb(tokens + offsets) + embedded

    def observation_vectors(
        self, tokens: torch.Tensor, values: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The observation vectors (..., d) of observations (..., O) (`observation_vector`):
        their tokens with their real `values`, or (None) what the tokens decode to. A decode
        step takes its transition's as `observation`."""
        dims = self.token_offsets[: self.config.observation_dim] // self.config.n_bins
        return self.observation_map(self._normalised(tokens, dims, values))

    def _normalised(
        self, tokens: torch.Tensor, dims: torch.Tensor, values: torch.Tensor | None
    ) -> torch.Tensor:
        """The normalised values (..., S) of tokens (..., S) of dimensions `dims` (S,): their
        real `values`, or (None) what they decode to."""
        if values is None:
            return self.token_inputs[dims, tokens]
        return self.normalise_values(values, dims)

    def _span_observation_vectors(
        self,
        tokens: torch.Tensor,
        start: int,
        values: torch.Tensor | None,
        observation: torch.Tensor | None,
    ) -> torch.Tensor:
        """The observation vectors (B, S, d) that tokens (B, S) at [start, start+S) take: each
        transition's own from its observation tokens; a transition the span enters past its
        first token takes `observation` (B, d), its vector computed before."""
        B, S = tokens.shape
        T, O = self.config.transition_dim, self.config.observation_dim  # noqa: E741
        lead = start % T
        n = -(-(lead + S) // T)  # transitions the span touches
        dims = self.token_offsets[start : start + S] // self.config.n_bins
        normalised = self._normalised(tokens, dims, values)  # (B, S)
        padded = F.pad(normalised, (lead, n * T - lead - S)).view(B, n, T)
        vectors = self.observation_map(padded[..., :O])  # (B, n, d)
        if lead > 0 and lead + S > O - 1:  # the first transition's observation came before
            if observation is None:
                raise ValueError(self.OBSERVATION_VECTOR_NEEDED)
            vectors = torch.cat([observation[:, None].to(vectors), vectors[:, 1:]], dim=1)
        per_token = vectors.repeat_interleave(T, dim=1)[:, lead : lead + S]  # (B, S, d)
        return per_token * self.observation_positions[start : start + S, None]

    # --- trunk and heads ------------------------------------------------------------------

    def _trunk(
        self,
        tokens: torch.Tensor,
        start: int | torch.Tensor = 0,
        cache: KVCache | SharedPrefixKVCache | None = None,
        values: torch.Tensor | None = None,
        observation: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states (B, S, d) after the final norm, for tokens at [start, start+S), with
        their real `values` (B, S) or (None) what they decode to. With `observation_vector`,
        `observation` (B, d) is the vector of the transition the tokens start in, where they
        start past its first token (`_span_observation_vectors`).

        A `start` held in a device tensor (1,) is a decode step (S = 1, with a cache): its
        bounds are the caller's to check, since reading them would sync with the device."""
        if isinstance(start, torch.Tensor):
            positions = start  # (1,)
        else:
            end = start + tokens.shape[1]
            if end > self.config.block_size:
                raise ValueError(
                    f"positions [{start}, {end}) exceed the block size {self.config.block_size} "
                    f"({self.config.sequence_transitions} transitions of "
                    f"{self.config.transition_dim} tokens); crop the sequence to its last "
                    f"{self.config.block_size} tokens"
                )
            positions = slice(start, end)
        x = self._embed(tokens, positions, values)  # (B, S, d)
        if self.config.observation_vector:
            if isinstance(positions, slice):
                x = x + self._span_observation_vectors(tokens, start, values, observation)
            elif observation is None:
                raise ValueError(self.OBSERVATION_VECTOR_NEEDED)
            else:  # taken from the transition's last observation token on
                x = x + observation[:, None] * self.observation_positions[positions, None]
        x = self.drop(x + self.pos_emb.weight[positions])  # (B, S, d)
        # Without a cache the positions are [0, S); a cache applies the mask rows itself.
        S = tokens.shape[1]
        mask = self.mask[:S, :S] if cache is None else None
        mode, every = self.config.activation_checkpointing, self.config.checkpoint_every_n_layers
        if cache is None and mode != "none" and self.training and torch.is_grad_enabled():
            x = checkpointed_blocks(self.blocks, x, mask, mode, every)  # (B, S, d)
        else:
            for layer, block in enumerate(self.blocks):
                x = block(x, mask, cache, layer, start)  # (B, S, d)
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

    def forward(self, tokens: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, S, N) for tokens (B, S) of raw bin indices; position i predicts i+1.
        With `value_inputs`, `values` (B, S) are the tokens' real values (None: what the
        tokens decode to); without, they are ignored.

        Tokens are not range-checked (that would sync with the device): an index outside
        [0, n_bins) silently reads another dimension's embedding.
        """
        return self._heads(self._trunk(tokens, values=values))

    def new_cache(self, rows: int, max_len: int | None = None) -> KVCache:
        """An empty KVCache for `rows` sequences of up to `max_len` (<= block_size) tokens."""
        max_len = self.config.block_size if max_len is None else max_len
        if max_len > self.config.block_size:
            raise ValueError(
                f"max_len {max_len} exceeds the block size {self.config.block_size}; plan over "
                "fewer context + horizon transitions"
            )
        c, p = self.config, self.head_weight
        head_dim = c.embedding_dim // c.n_head
        return KVCache(c.n_layer, rows, c.n_head, max_len, head_dim, p.device, p.dtype, self.mask)

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
            self.mask,
        )

    def prefill(
        self,
        tokens: torch.Tensor,
        cache: KVCache | SharedPrefixKVCache,
        start: int = 0,
        values: torch.Tensor | None = None,
        observation: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run tokens (B, S) at positions [start, start+S), with their real `values` (B, S)
        (see `forward`), caching their keys and values. With `observation_vector`, tokens
        that start past a transition's first token take its `observation` vector (B, d)
        (`observation_vectors`).

        Attends over the cached [0, start+S) under the training mask. Returns (B, S, N).
        With a SharedPrefixKVCache, a prefill from 0 writes the shared prefix (B groups) and a
        later one extends every row after it.
        """
        return self._heads(self._trunk(tokens, start, cache, values, observation), start)

    def decode_step(
        self,
        tokens: torch.Tensor,
        cache: KVCache | SharedPrefixKVCache,
        position: int | torch.Tensor,
        observation: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, N) for one new token (B,) at `position`, attending over [0, position].
        With `observation_vector`, `observation` (B, d) is the vector of the token's
        transition (`observation_vectors`), taken from its last observation token on.

        For many steps over one cache, bind it once with `decoder(cache)`.
        """
        return self.decoder(cache)(tokens, position, observation)

    def decoder(self, cache: KVCache | SharedPrefixKVCache) -> Callable[..., torch.Tensor]:
        """`decode_step` bound to one cache: `step(tokens (B,), position, observation=None)
        -> logits (B, N)`. A decoded token's value input is what it decodes to
        (`embedding_table`); its transition's observation vector is the caller's to give.

        A planner makes a hundred dependent decode steps per search, so what can be looked up
        once (parameters, cache buffers, which path applies) is looked up here. The position
        is an int (checked against the cache) or a device tensor (1,) (not checked: that would
        sync). Any whole copies of the cache's rows may decode at any position; the PyTorch
        step (`static_decoder`) is compiled or captured once per number of rows.
        """
        static_step = self.static_decoder(cache)
        device = self.head_weight.device

        def module_step(
            tokens: torch.Tensor,
            position: int | torch.Tensor,
            observation: torch.Tensor | None = None,
        ) -> torch.Tensor:
            if isinstance(position, torch.Tensor):
                return static_step(tokens, position, observation)
            if position >= self.config.block_size:
                raise ValueError(f"position {position} exceeds the block size")
            if isinstance(cache, SharedPrefixKVCache):
                if position == 0:  # this token starts the shared prefix: the prefill path
                    return self.prefill(tokens[:, None], cache)[:, 0]
                cache.own_position(position, tokens.shape[0])  # raises where it cannot go
            elif position >= cache.max_len or tokens.shape[0] > cache.rows:
                raise ValueError(
                    f"{tokens.shape[0]} rows at position {position} do not fit a cache of "
                    f"{cache.rows} rows x {cache.max_len} positions"
                )
            return static_step(tokens, torch.tensor([position], device=device), observation)

        if not self.config.value_sees_itself:  # a mask the native kernel does not implement
            return module_step
        return native.decoder(self, cache, module_step) or module_step

    def static_decoder(self, cache: KVCache | SharedPrefixKVCache) -> Callable[..., torch.Tensor]:
        """The PyTorch decode step over `cache`, `step(tokens (B,), position (1,),
        observation=None) -> (B, N)` (`observation`: see `decode_step`), with the position
        held in a device tensor: the same shapes and no host sync at every position, so
        `torch.compile(step, fullgraph=True, dynamic=False)` traces it whole, once. The
        reference for every other decode path, and the one used on a GPU."""
        T = self.config.transition_dim

        def step(
            tokens: torch.Tensor, position: torch.Tensor, observation: torch.Tensor | None = None
        ) -> torch.Tensor:
            h = self._trunk(tokens[:, None], position, cache, observation=observation)[:, 0]
            dim = position % T  # (1,)
            weight = self.head_weight.index_select(0, dim)[0]  # (d, N)
            return h @ weight + self.head_bias.index_select(0, dim)  # (B, N)

        return step

    def configure_optimizer(
        self,
        learning_rate: float,
        weight_decay: float,
        betas: tuple[float, float],
        fused: bool = False,
    ) -> torch.optim.AdamW:
        """AdamW decaying only weight matrices (Linear weights and the heads); `fused` (one
        kernel for all parameters) is for CUDA."""
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
        # Plain floats: a config's list type would be pickled into every checkpoint.
        betas = tuple(float(beta) for beta in betas)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused or None)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
