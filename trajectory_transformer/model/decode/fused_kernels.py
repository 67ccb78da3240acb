"""Triton kernels of the fused decode step (`fused.py` binds them to a model and a cache).

A block is three kernels, each of many short programs: the query, key and value, a program
per tile of rows and head; the attention, a program per tile of rows, head and part of the
keys (the group's shared prefix, or a run of the row's own positions); and the projection with
the MLP, a program per tile of rows and tile of hidden columns. One long program per row tile,
running the whole block in series, was bound by that serial chain.

Imported only where that step runs: Triton decides at import whether the kernels compile for
the GPU or run through its interpreter on the CPU (`TRITON_INTERPRET=1`).
"""

import triton
import triton.language as tl

NO_SCORE = tl.constexpr(-1.0e30)
"""The running maximum before any key: finite, so that a part with no visible key yet keeps
its weights at exp(NO_SCORE - NO_SCORE) = 1 over sums of 0, never exp(-inf + inf)."""


@triton.jit
def row_tile(R, C, BR: tl.constexpr, CP: tl.constexpr):
    """This program's tile of rows of an (R, C) tensor: rows, their mask, the columns padded
    to CP, theirs, and the tile's."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    row_ok = rows < R
    cols = tl.arange(0, CP)
    col_ok = cols < C
    return rows, row_ok, cols, col_ok, row_ok[:, None] & col_ok[None, :]


@triton.jit
def layer_norm(x, weight_ptr, bias_ptr, cols, col_ok, C, eps):
    """Rows of x (R, CP) normalised over their first C columns (the rest are 0)."""
    mean = tl.sum(x, axis=1) / C
    diff = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
    var = tl.sum(diff * diff, axis=1) / C
    weight = tl.load(weight_ptr + cols, mask=col_ok, other=0.0)
    bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0)
    return diff / tl.sqrt(var + eps)[:, None] * weight[None, :] + bias[None, :]


@triton.jit
def load_matrix(ptr, rows, cols, row_ok, col_ok, stride):
    """The tile [rows, cols] of a row-major matrix of `stride` columns at `ptr`, 0 outside."""
    return tl.load(
        ptr + rows[:, None] * stride + cols[None, :],
        mask=row_ok[:, None] & col_ok[None, :],
        other=0.0,
    )


@triton.jit
def residual_stream(a_ptr, partial_ptr, b_out, rows, cols, tile, col_ok, R, C, SPLITS):
    """The stream after a block: the stream after its attention, plus its MLP's output (the
    hidden tiles' partial products, summed here, and the output bias)."""
    x = tl.load(a_ptr + rows[:, None] * C + cols[None, :], mask=tile, other=0.0)
    for split in range(SPLITS):
        offsets = (split * R + rows[:, None]) * C + cols[None, :]
        x += tl.load(partial_ptr + offsets, mask=tile, other=0.0)
    return x + tl.load(b_out + cols, mask=col_ok, other=0.0)[None, :]


@triton.jit
def attend_tile(q, m_i, l_i, acc, k_ptr, v_ptr, offsets, load_ok, visible, scale):
    """Fold one tile of keys and values (R, K, HSP), each row its own, at `offsets` into the
    online softmax of the queries q (R, HSP): the running maximum, sum and weighted values of
    each row. `visible` (1, K) masks the scores."""
    keys = tl.load(k_ptr + offsets, mask=load_ok, other=0.0)
    scores = tl.sum(q[:, None, :] * keys, axis=2) * scale  # (R, K)
    scores = tl.where(visible, scores, float("-inf"))
    values = tl.load(v_ptr + offsets, mask=load_ok, other=0.0)
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp(m_i - m_new)
    probs = tl.exp(scores - m_new[:, None])
    acc = acc * alpha[:, None] + tl.sum(probs[:, :, None] * values, axis=1)
    return m_new, l_i * alpha + tl.sum(probs, axis=1), acc


@triton.jit
def qkv_kernel(
    x_ptr,  # (R, C) out: the stream entering this block
    a_ptr,  # (R, C) the stream after the previous block's attention (not the first block)
    partial_ptr,  # (SPLITS, R, C) the previous block's MLP, per hidden tile
    b_prev_out,  # the previous block's MLP output bias
    tokens_ptr,  # (R,) this step's tokens (first block)
    position_ptr,  # (1,) absolute position of the tokens
    prefix_end_ptr,  # (1,) the shared prefix's length
    tok_emb_ptr,
    pos_emb_ptr,
    observation_ptr,  # (R, C) the rows' observation vectors (with HAS_OBSERVATION)
    last_observation,  # the last observation token's dimension: the vectors count from it
    ln1_w,
    ln1_b,
    w_attn,  # (C, 3C)
    b_attn,
    q_ptr,  # (R, C) out: the queries
    own_k,  # (rows, NH, L_CAP, HS) out: this token's key and value at its own slot
    own_v,
    R,
    L_CAP,
    T,
    N,
    C,
    eps1,
    NH: tl.constexpr,
    HS: tl.constexpr,
    CP: tl.constexpr,
    HSP: tl.constexpr,
    BR: tl.constexpr,
    SPLITS: tl.constexpr,
    FIRST: tl.constexpr,
    HAS_OBSERVATION: tl.constexpr,
):
    head = tl.program_id(1)
    rows, row_ok, cols, col_ok, tile = row_tile(R, C, BR, CP)
    position = tl.load(position_ptr)
    if FIRST:
        tokens = tl.load(tokens_ptr + rows, mask=row_ok, other=0)
        table_row = tokens + (position % T) * N  # the dimension's own embedding table
        x = tl.load(tok_emb_ptr + table_row[:, None] * C + cols[None, :], mask=tile, other=0.0)
        x += tl.load(pos_emb_ptr + position * C + cols, mask=col_ok, other=0.0)[None, :]
        if HAS_OBSERVATION:  # taken from the transition's last observation token on
            taken = (position % T >= last_observation).to(tl.float32)
            vectors = tl.load(
                observation_ptr + rows[:, None] * C + cols[None, :], mask=tile, other=0.0
            )
            x += taken * vectors
    else:
        x = residual_stream(a_ptr, partial_ptr, b_prev_out, rows, cols, tile, col_ok, R, C, SPLITS)
    if head == 0:
        tl.store(x_ptr + rows[:, None] * C + cols[None, :], x, mask=tile)

    h = layer_norm(x, ln1_w, ln1_b, cols, col_ok, C, eps1)
    hcols = tl.arange(0, HSP)
    h_ok = hcols < HS
    head_tile = row_ok[:, None] & h_ok[None, :]
    out = head * HS + hcols
    wq = load_matrix(w_attn, cols, out, col_ok, h_ok, 3 * C)  # (CP, HSP)
    wk = load_matrix(w_attn + C, cols, out, col_ok, h_ok, 3 * C)
    wv = load_matrix(w_attn + 2 * C, cols, out, col_ok, h_ok, 3 * C)
    q = tl.dot(h, wq, input_precision="tf32x3")
    q += tl.load(b_attn + out, mask=h_ok, other=0.0)[None, :]
    k = tl.dot(h, wk, input_precision="tf32x3")
    k += tl.load(b_attn + C + out, mask=h_ok, other=0.0)[None, :]
    v = tl.dot(h, wv, input_precision="tf32x3")
    v += tl.load(b_attn + 2 * C + out, mask=h_ok, other=0.0)[None, :]
    tl.store(q_ptr + rows[:, None] * C + out[None, :], q, mask=head_tile)
    own = position - tl.load(prefix_end_ptr)  # this token's slot among the rows' own positions
    slot = ((rows[:, None] * NH + head) * L_CAP + own) * HS + hcols[None, :]
    tl.store(own_k + slot, k, mask=head_tile)
    tl.store(own_v + slot, v, mask=head_tile)


@triton.jit
def attention_kernel(
    q_ptr,  # (R, C) the queries (qkv_kernel)
    position_ptr,  # (1,) absolute position of the tokens
    prefix_end_ptr,  # (1,) the shared prefix's length
    prefix_k,  # (prefix rows, NH, P_CAP, HS)
    prefix_v,
    own_k,  # (rows, NH, L_CAP, HS), this token's slot written by qkv_kernel
    own_v,
    acc_ptr,  # (PARTS, R, C) out: per part, each head's values weighted by exp(score - max)
    max_ptr,  # (PARTS, R, NH) out: per part and head, the largest score
    sum_ptr,  # (PARTS, R, NH) out: per part and head, the sum of exp(score - max)
    R,
    MEMBERS,
    GROUPS,
    P_CAP,
    L_CAP,
    T,
    C,
    scale,
    NH: tl.constexpr,
    HS: tl.constexpr,
    HSP: tl.constexpr,
    BR: tl.constexpr,
    KB: tl.constexpr,
    PKB: tl.constexpr,
    PARTS: tl.constexpr,
    SHARED_PREFIX: tl.constexpr,
):
    head = tl.program_id(1)
    # Part 0: the shared prefix; parts 1 to PARTS - 1: consecutive runs of the row's own
    # earlier positions, the token itself in part 1.
    part = tl.program_id(2)
    rows, row_ok, hcols, h_ok, head_tile = row_tile(R, HS, BR, HSP)  # the head's columns
    out = head * HS + hcols
    position = tl.load(position_ptr)
    prefix_end = tl.load(prefix_end_ptr)
    own = position - prefix_end  # this token's slot among the rows' own positions
    q = tl.load(q_ptr + rows[:, None] * C + out[None, :], mask=head_tile, other=0.0)
    m_i = tl.full((BR,), NO_SCORE, dtype=tl.float32)
    l_i = tl.zeros((BR,), dtype=tl.float32)
    acc = tl.zeros((BR, HSP), dtype=tl.float32)
    if part == 0:
        if SHARED_PREFIX:
            # Every row of the tile continues one prefix: its keys are one matrix product.
            group = (tl.program_id(0) * BR // MEMBERS) % GROUPS
            pk = tl.arange(0, PKB)
            for start in range(0, prefix_end, PKB):
                p = start + pk  # absolute positions in the prefix
                visible = (p < prefix_end) & (p % T != T - 1)  # earlier values are hidden
                offsets = ((group * NH + head) * P_CAP + p[:, None]) * HS + hcols[None, :]
                load_ok = visible[:, None] & h_ok[None, :]
                keys = tl.load(prefix_k + offsets, mask=load_ok, other=0.0)  # (PKB, HSP)
                scores = tl.dot(q, tl.trans(keys), input_precision="tf32x3") * scale
                scores = tl.where(visible[None, :], scores, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(scores, axis=1))
                alpha = tl.exp(m_i - m_new)
                probs = tl.exp(scores - m_new[:, None])
                values = tl.load(prefix_v + offsets, mask=load_ok, other=0.0)
                acc = acc * alpha[:, None] + tl.dot(probs, values, input_precision="tf32x3")
                l_i = l_i * alpha + tl.sum(probs, axis=1)
                m_i = m_new
        else:
            group = (rows // MEMBERS) % GROUPS  # the prefix each row continues
            kidx = tl.arange(0, KB)
            for start in range(0, prefix_end, KB):
                p = start + kidx
                visible = (p < prefix_end) & (p % T != T - 1)
                offsets = ((group[:, None, None] * NH + head) * P_CAP + p[None, :, None]) * HS
                offsets += hcols[None, None, :]
                load_ok = row_ok[:, None, None] & visible[None, :, None] & h_ok[None, None, :]
                m_i, l_i, acc = attend_tile(
                    q, m_i, l_i, acc, prefix_k, prefix_v, offsets, load_ok, visible[None, :], scale
                )
    else:
        if part == 1:  # the token itself, always visible
            slot = ((rows[:, None] * NH + head) * L_CAP + own) * HS + hcols[None, :]
            k = tl.load(own_k + slot, mask=head_tile, other=0.0)
            m_i = tl.sum(q * k, axis=1) * scale
            l_i = tl.full((BR,), 1.0, dtype=tl.float32)
            acc = tl.load(own_v + slot, mask=head_tile, other=0.0)
        # Runs of whole key tiles, as even as they come.
        run = tl.cdiv(own, (PARTS - 1) * KB) * KB
        first = (part - 1) * run
        last = tl.minimum(first + run, own)
        kidx = tl.arange(0, KB)
        for start in range(first, last, KB):
            o = start + kidx  # own slots written before this token
            visible = (o < last) & ((prefix_end + o) % T != T - 1)
            offsets = ((rows[:, None, None] * NH + head) * L_CAP + o[None, :, None]) * HS
            offsets += hcols[None, None, :]
            load_ok = row_ok[:, None, None] & visible[None, :, None] & h_ok[None, None, :]
            m_i, l_i, acc = attend_tile(
                q, m_i, l_i, acc, own_k, own_v, offsets, load_ok, visible[None, :], scale
            )
    stats = (part * R + rows) * NH + head
    tl.store(max_ptr + stats, m_i, mask=row_ok)
    tl.store(sum_ptr + stats, l_i, mask=row_ok)
    tl.store(acc_ptr + (part * R + rows[:, None]) * C + out[None, :], acc, mask=head_tile)


@triton.jit
def mlp_kernel(
    x_ptr,  # (R, C) the stream entering this block
    a_ptr,  # (R, C) out: the stream after this block's attention
    partial_ptr,  # (SPLITS, R, C) out: this block's MLP, per hidden tile
    acc_ptr,  # (PARTS, R, C) the attention's parts (attention_kernel)
    max_ptr,
    sum_ptr,
    w_proj,  # (C, C)
    b_proj,
    ln2_w,
    ln2_b,
    w_fc,  # (C, HID)
    b_fc,
    w_out,  # (HID, C)
    R,
    C,
    HID,
    eps2,
    NH: tl.constexpr,
    HS: tl.constexpr,
    CP: tl.constexpr,
    HSP: tl.constexpr,
    BR: tl.constexpr,
    HB: tl.constexpr,
    SPLIT_COLS: tl.constexpr,
    PARTS: tl.constexpr,
):
    split = tl.program_id(1)
    rows, row_ok, cols, col_ok, tile = row_tile(R, C, BR, CP)
    hcols = tl.arange(0, HSP)
    h_ok = hcols < HS
    head_tile = row_ok[:, None] & h_ok[None, :]

    # The parts of each head's softmax joined, then the output projection.
    attn = tl.zeros((BR, CP), dtype=tl.float32)
    for head in range(NH):
        out = head * HS + hcols
        m = tl.full((BR,), NO_SCORE, dtype=tl.float32)
        for part in range(PARTS):
            stats = (part * R + rows) * NH + head
            m = tl.maximum(m, tl.load(max_ptr + stats, mask=row_ok, other=NO_SCORE))
        total = tl.zeros((BR,), dtype=tl.float32)
        y = tl.zeros((BR, HSP), dtype=tl.float32)
        for part in range(PARTS):
            stats = (part * R + rows) * NH + head
            weight = tl.exp(tl.load(max_ptr + stats, mask=row_ok, other=NO_SCORE) - m)
            total += tl.load(sum_ptr + stats, mask=row_ok, other=0.0) * weight
            offsets = (part * R + rows[:, None]) * C + out[None, :]
            y += tl.load(acc_ptr + offsets, mask=head_tile, other=0.0) * weight[:, None]
        y = y / tl.where(row_ok, total, 1.0)[:, None]  # (BR, HSP)
        wp = load_matrix(w_proj, out, cols, h_ok, col_ok, C)  # (HSP, CP)
        attn += tl.dot(y, wp, input_precision="tf32x3")
    x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=tile, other=0.0)
    x += attn + tl.load(b_proj + cols, mask=col_ok, other=0.0)[None, :]
    if split == 0:
        tl.store(a_ptr + rows[:, None] * C + cols[None, :], x, mask=tile)

    # This program's tile of the MLP's hidden columns.
    h = layer_norm(x, ln2_w, ln2_b, cols, col_ok, C, eps2)
    mlp = tl.zeros((BR, CP), dtype=tl.float32)
    hb = tl.arange(0, HB)
    for start in range(split * SPLIT_COLS, split * SPLIT_COLS + SPLIT_COLS, HB):
        hid = start + hb
        hid_ok = hid < HID
        wf = load_matrix(w_fc, cols, hid, col_ok, hid_ok, HID)  # (CP, HB)
        u = tl.dot(h, wf, input_precision="tf32x3")
        u += tl.load(b_fc + hid, mask=hid_ok, other=0.0)[None, :]
        u = 0.5 * u * (1.0 + tl.erf(u * 0.7071067811865476))  # exact GELU, as F.gelu
        wo = load_matrix(w_out, hid, cols, hid_ok, col_ok, C)  # (HB, CP)
        mlp += tl.dot(u, wo, input_precision="tf32x3")
    tl.store(partial_ptr + (split * R + rows[:, None]) * C + cols[None, :], mlp, mask=tile)


@triton.jit
def head_kernel(
    a_ptr,  # (R, C) the stream after the last block's attention
    partial_ptr,  # (SPLITS, R, C) the last block's MLP, per hidden tile
    b_out,  # the last block's MLP output bias
    position_ptr,  # (1,) absolute position of the tokens
    lnf_w,
    lnf_b,
    head_w,  # (T, C, N)
    head_b,  # (T, N)
    logits_ptr,  # (R, N) out
    R,
    T,
    N,
    C,
    eps_f,
    CP: tl.constexpr,
    BR: tl.constexpr,
    HB: tl.constexpr,
    SPLITS: tl.constexpr,
):
    rows, row_ok, cols, col_ok, tile = row_tile(R, C, BR, CP)
    x = residual_stream(a_ptr, partial_ptr, b_out, rows, cols, tile, col_ok, R, C, SPLITS)
    f = layer_norm(x, lnf_w, lnf_b, cols, col_ok, C, eps_f)
    dim = tl.load(position_ptr) % T  # this position's head
    bins = tl.program_id(1) * HB + tl.arange(0, HB)
    bin_ok = bins < N
    weight = load_matrix(head_w + dim * C * N, cols, bins, col_ok, bin_ok, N)  # (CP, HB)
    logits = tl.dot(f, weight, input_precision="tf32x3")
    logits += tl.load(head_b + dim * N + bins, mask=bin_ok, other=0.0)[None, :]
    tl.store(
        logits_ptr + rows[:, None] * N + bins[None, :],
        logits,
        mask=row_ok[:, None] & bin_ok[None, :],
    )
