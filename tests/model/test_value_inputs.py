"""Value inputs: each token's real value beside it, alike on every path that runs the model.

Real tokens carry the values given; a token given none (one a search feeds back) carries what
it decodes to. The reference is the plain forward pass over the whole sequence with every
value spelled out.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.model import TrajectoryGPT
from trajectory_transformer.model.decode import native

OBS, ACT, N = 3, 2, 9
T = OBS + ACT + 2


def value_model(
    seed: int = 0,
    token_embeddings: bool = True,
    value_embedding: str = "linear",
    observation_vector: bool = False,
) -> tuple[TrajectoryGPT, torch.Tensor]:
    """A tiny model with value inputs (and the tokens' embeddings, unless told), and what its
    tokens decode to (T, N), raw."""
    model = tiny_gpt(
        OBS,
        ACT,
        N,
        4,
        seed,
        value_inputs=True,
        token_embeddings=token_embeddings,
        value_embedding=value_embedding,
        observation_vector=observation_vector,
    )
    g = torch.Generator().manual_seed(seed)
    decoded = torch.randn(T, N, generator=g).sort(dim=1).values
    loc, scale = torch.randn(T, generator=g), torch.rand(T, generator=g) + 0.5
    model.set_value_inputs(decoded, decoded[:, 0] - 0.1, decoded[:, -1] + 0.1, loc, scale)
    return model, decoded


def decode(decoded: torch.Tensor, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
    """What tokens (B, S) at positions [start, start+S) decode to."""
    dims = (torch.arange(tokens.shape[1]) + start) % T
    return decoded[dims, tokens]


def real_values(decoded: torch.Tensor, shape: tuple[int, int], seed: int = 1) -> torch.Tensor:
    """Values (B, S) inside each dimension's range, but none where a token decodes to."""
    g = torch.Generator().manual_seed(seed)
    dims = torch.arange(shape[1]) % T
    low, high = decoded[dims, 0], decoded[dims, -1]
    return low + (high - low) * torch.rand(shape, generator=g)


def random_tokens(shape: tuple[int, int], seed: int = 2) -> torch.Tensor:
    return torch.randint(0, N, shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_a_token_without_a_value_carries_what_it_decodes_to() -> None:
    model, decoded = value_model()
    tokens = random_tokens((3, model.config.block_size))
    torch.testing.assert_close(model(tokens), model(tokens, decode(decoded, tokens)))
    # ... and the values are used: other values, other logits.
    assert not torch.allclose(model(tokens), model(tokens, real_values(decoded, tokens.shape)))


@torch.no_grad()
def test_a_value_changes_its_own_and_later_predictions_only() -> None:
    model, decoded = value_model()
    tokens = random_tokens((2, 3 * T))
    values = real_values(decoded, tokens.shape)
    changed = values.clone()
    p = T + 1  # an action's value
    changed[:, p] = (
        decoded[p % T, 0] if values[0, p] > decoded[p % T].mean() else decoded[p % T, -1]
    )
    before, after = model(tokens, values), model(tokens, changed)
    torch.testing.assert_close(before[:, :p], after[:, :p], rtol=0, atol=0)
    assert (before[:, p] - after[:, p]).abs().amax() > 1e-3
    assert (before[:, p + 1 :] - after[:, p + 1 :]).abs().amax() > 1e-5


@torch.no_grad()
def test_values_beyond_the_data_range_clip_to_it() -> None:
    model, decoded = value_model()
    tokens = random_tokens((2, 2 * T))
    values = real_values(decoded, tokens.shape)
    dims = torch.arange(tokens.shape[1]) % T
    high, low = decoded[dims, -1] + 0.1, decoded[dims, 0] - 0.1
    torch.testing.assert_close(
        model(tokens, high.expand_as(values) + 50.0), model(tokens, high.expand_as(values))
    )
    torch.testing.assert_close(
        model(tokens, low.expand_as(values) - 50.0), model(tokens, low.expand_as(values))
    )


def test_the_papers_model_has_no_value_inputs_and_ignores_values() -> None:
    model = tiny_gpt(OBS, ACT, N, sequence_transitions=4)
    assert not any("value_weight" in k or k.startswith("input_") for k in model.state_dict())
    assert model.embedding_table() is model.tok_emb.weight
    tokens = random_tokens((2, 2 * T))
    with torch.no_grad():
        assert torch.equal(model(tokens), model(tokens, torch.randn(tokens.shape)))
    with pytest.raises(ValueError, match="no value inputs"):
        model.set_value_inputs(torch.zeros(T, N), *torch.zeros(4, T))


def test_value_input_settings_are_checked() -> None:
    model, decoded = value_model()
    with pytest.raises(ValueError, match="scales must be positive"):
        model.set_value_inputs(
            decoded, decoded[:, 0], decoded[:, -1], torch.zeros(T), torch.zeros(T)
        )
    tokens = random_tokens((2, T))
    with pytest.raises(ValueError, match="must have the tokens' shape"):
        model(tokens, torch.zeros(2, T - 1))


@pytest.mark.parametrize(
    "token_embeddings, value_embedding, observation_vector",
    [
        (True, "linear", False),
        (False, "linear", False),
        (True, "periodic", False),
        (True, "linear", True),
        (False, "linear", True),
    ],
)
@pytest.mark.parametrize("path", ["plain", "shared", "shared-native", "static"])
@torch.no_grad()
def test_real_context_then_decoded_tokens_equal_the_forward_pass(
    path: str, token_embeddings: bool, value_embedding: str, observation_vector: bool
) -> None:
    """A planner's sequence: a context of real values (prefill), then tokens fed back one at a
    time, which carry what they decode to. Every decode path equals the forward pass over the
    whole sequence with those values spelled out, with the tokens' embeddings or without, and
    with the observation vector, each step given its transition's."""
    model, decoded = value_model(
        token_embeddings=token_embeddings,
        value_embedding=value_embedding,
        observation_vector=observation_vector,
    )
    rows, groups, context_len = 4, 2, T + OBS
    tokens = random_tokens((rows, model.config.block_size))
    values = decode(decoded, tokens)
    # Two contexts of real values; row r continues context r % 2 (a shared cache's layout:
    # two groups of one row each, in two copies).
    context = random_tokens((groups, context_len), seed=3)
    tokens[:, :context_len] = context.repeat(2, 1)
    real = real_values(decoded, (groups, context_len))
    values[:, :context_len] = real.repeat(2, 1)
    expected = model(tokens, values)
    if path == "plain":
        cache = model.new_cache(rows)
        model.prefill(tokens[:, :context_len], cache, values=values[:, :context_len])
    else:
        cache = model.new_shared_prefix_cache(groups, 1, rows, context_len, 2 * T)
        model.prefill(context, cache, values=real)
    with native.native_kernels(path == "shared-native"):
        step = model.static_decoder(cache) if path == "static" else model.decoder(cache)
        for position in range(context_len, context_len + 2 * T):
            at = torch.tensor([position]) if path == "static" else position
            observation = None
            if observation_vector:  # the vector of the position's transition
                first = position // T * T
                span = slice(first, first + OBS)
                observation = model.observation_vectors(tokens[:, span], values[:, span])
            logits = step(tokens[:, position], at, observation)
            torch.testing.assert_close(logits, expected[:, position], atol=1e-5, rtol=0)


@torch.no_grad()
def test_without_token_embeddings_a_token_is_its_value_alone() -> None:
    model, decoded = value_model(token_embeddings=False)
    assert model.tok_emb is None
    tokens = random_tokens((3, model.config.block_size))
    values = real_values(decoded, tokens.shape)
    # Other tokens, the same values: the same predictions.
    torch.testing.assert_close(model(tokens, values), model((tokens + 1) % N, values))
    assert not torch.allclose(model(tokens, values), model(tokens, values + 0.3))


def test_a_model_without_token_embeddings_needs_value_inputs() -> None:
    with pytest.raises(ValueError, match=r"needs model\.value_inputs=true"):
        tiny_gpt(OBS, ACT, N, token_embeddings=False)


@torch.no_grad()
def test_a_periodic_value_embedding_turns_with_the_value() -> None:
    """`value_embedding=periodic`: a value's vector is a ReLU of a linear map of its sines and
    cosines, spelled out here; two values' vectors differ in direction, not only length."""
    model, _ = value_model(value_embedding="periodic")
    dims = torch.tensor([0, 0])
    values = torch.tensor([0.3, -0.6])
    got = model.value_vectors(values, dims)
    angles = 2 * torch.pi * values[:, None] * model.value_frequencies[0]
    features = torch.cat([angles.sin(), angles.cos()], dim=-1)
    expected = torch.relu(features @ model.value_weight[0] + model.value_bias[0])
    torch.testing.assert_close(got, expected)
    cosine = torch.nn.functional.cosine_similarity(got[0], got[1], dim=0)
    assert cosine < 0.99
    with pytest.raises(ValueError, match=r"model\.value_embedding must be one of"):
        tiny_gpt(OBS, ACT, N, value_inputs=True, value_embedding="fourier")


@torch.no_grad()
def test_the_observation_vector_enters_from_the_last_observation_token_on() -> None:
    """`observation_vector`: each token from its transition's last observation token to its
    value token takes the map of its transition's whole observation (normalised values);
    the observation's other tokens take nothing. Spelled out per position; a span that
    starts inside a transition takes the vector it is given for that transition."""
    model, decoded = value_model(observation_vector=True)
    tokens = random_tokens((2, model.config.block_size))
    values = real_values(decoded, tokens.shape)
    dims = torch.arange(OBS)
    expected = torch.zeros(*tokens.shape, model.config.embedding_dim)
    for p in range(tokens.shape[1]):
        if p % T >= OBS - 1:
            first = p // T * T
            normalised = model.normalise_values(values[:, first : first + OBS], dims)
            expected[:, p] = normalised @ model.observation_map.weight.T
            expected[:, p] += model.observation_map.bias
    got = model._span_observation_vectors(tokens, 0, values, None)
    torch.testing.assert_close(got, expected)
    start = T + 2  # inside the second transition: its vector is given
    given = torch.randn(2, model.config.embedding_dim)
    later = model._span_observation_vectors(tokens[:, start:], start, values[:, start:], given)
    torch.testing.assert_close(later[:, : T - 2], given[:, None].expand(-1, T - 2, -1))
    torch.testing.assert_close(later[:, T - 2 :], expected[:, 2 * T :])
    with pytest.raises(ValueError, match="need the transition's observation vector"):
        model._span_observation_vectors(tokens[:, start:], start, values[:, start:], None)


def test_with_the_observation_vector_a_value_changes_its_own_and_later_predictions_only() -> None:
    model, decoded = value_model(observation_vector=True)
    tokens = random_tokens((1, 2 * T))
    values = real_values(decoded, tokens.shape).requires_grad_()
    logits = model(tokens, values)
    for p in range(tokens.shape[1]):
        (gradient,) = torch.autograd.grad(logits[0, p].sum(), values, retain_graph=True)
        assert torch.equal(gradient[0, p + 1 :], torch.zeros_like(gradient[0, p + 1 :])), p


@pytest.mark.parametrize("path", ["plain", "shared-native", "static"])
@torch.no_grad()
def test_a_decode_step_without_its_observation_vector_is_refused(path: str) -> None:
    model, decoded = value_model(observation_vector=True)
    context = random_tokens((1, T + OBS))
    if path == "plain":
        cache = model.new_cache(1)
    else:
        cache = model.new_shared_prefix_cache(1, 1, 1, T + OBS, T)
    model.prefill(context, cache, values=real_values(decoded, context.shape))
    with native.native_kernels(path == "shared-native"):
        step = model.static_decoder(cache) if path == "static" else model.decoder(cache)
        at = torch.tensor([T + OBS]) if path == "static" else T + OBS
        with pytest.raises(ValueError, match="need the transition's observation vector"):
            step(torch.zeros(1, dtype=torch.long), at)


def test_the_observation_vector_needs_value_inputs() -> None:
    with pytest.raises(ValueError, match=r"needs model\.value_inputs=true"):
        tiny_gpt(OBS, ACT, N, observation_vector=True)
