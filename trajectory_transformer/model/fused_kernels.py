"""Triton kernels of the fused decode step (`fused.py` binds them to a model and a cache).

Imported only where that step runs: Triton decides at import whether the kernels compile for
the GPU or run through its interpreter on the CPU (`TRITON_INTERPRET=1`).
"""

import triton
import triton.language as tl


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
def attend_tile(q, m_i, l_i, acc, k_ptr, v_ptr, offsets, load_ok, visible, scale):
    """One tile of keys and values (R, K, HSP) at `offsets` in the online softmax of the
    queries q (R, HSP); `visible` (R, K) or (1, K) masks the scores."""
    keys = tl.load(k_ptr + offsets, mask=load_ok, other=0.0)
    scores = tl.sum(q[:, None, :] * keys, axis=2) * scale  # (R, K)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp(m_i - m_new)
    probs = tl.exp(scores - m_new[:, None])
    values = tl.load(v_ptr + offsets, mask=load_ok, other=0.0)
    acc = acc * alpha[:, None] + tl.sum(probs[:, :, None] * values, axis=1)
    return m_new, l_i * alpha + tl.sum(probs, axis=1), acc


@triton.jit
def block_kernel(
    x_ptr,  # (R, C) residual stream, read and written in place
    tokens_ptr,  # (R,) this step's tokens (first block)
    position_ptr,  # (1,) absolute position of the tokens
    prefix_end_ptr,  # (1,) the shared prefix's length
    tok_emb_ptr,
    pos_emb_ptr,
    ln1_w,
    ln1_b,
    w_attn,  # (C, 3C)
    b_attn,
    w_proj,  # (C, C)
    b_proj,
    ln2_w,
    ln2_b,
    w_fc,  # (C, HID)
    b_fc,
    w_out,  # (HID, C)
    b_out,
    prefix_k,  # (prefix rows, NH, P_CAP, HS)
    prefix_v,
    own_k,  # (rows, NH, L_CAP, HS)
    own_v,
    lnf_w,
    lnf_b,
    head_w,  # (T, C, N)
    head_b,  # (T, N)
    logits_ptr,  # (R, N) (last block)
    R,
    MEMBERS,
    GROUPS,
    P_CAP,
    L_CAP,
    T,
    N,
    C,
    HID,
    eps1,
    eps2,
    eps_f,
    scale,
    NH: tl.constexpr,
    HS: tl.constexpr,
    CP: tl.constexpr,
    HSP: tl.constexpr,
    NP: tl.constexpr,
    HIDP: tl.constexpr,
    BR: tl.constexpr,
    KB: tl.constexpr,
    HB: tl.constexpr,
    FIRST: tl.constexpr,
    LAST: tl.constexpr,
):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    row_ok = rows < R
    cols = tl.arange(0, CP)
    col_ok = cols < C
    tile = row_ok[:, None] & col_ok[None, :]
    position = tl.load(position_ptr)
    prefix_end = tl.load(prefix_end_ptr)
    own = position - prefix_end  # this token's slot among the rows' own positions
    if FIRST:
        tokens = tl.load(tokens_ptr + rows, mask=row_ok, other=0)
        table_row = tokens + (position % T) * N  # the dimension's own embedding table
        x = tl.load(tok_emb_ptr + table_row[:, None] * C + cols[None, :], mask=tile, other=0.0)
        x += tl.load(pos_emb_ptr + position * C + cols, mask=col_ok, other=0.0)[None, :]
    else:
        x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=tile, other=0.0)

    # Attention, head by head.
    h = layer_norm(x, ln1_w, ln1_b, cols, col_ok, C, eps1)
    group = (rows // MEMBERS) % GROUPS  # the prefix this row continues
    hcols = tl.arange(0, HSP)
    h_ok = hcols < HS
    kidx = tl.arange(0, KB)
    head_tile = row_ok[:, None] & h_ok[None, :]
    attn = tl.zeros((BR, CP), dtype=tl.float32)
    for head in range(NH):  # a loop, not unrolled: ptxas took minutes over the unrolled kernel
        out = head * HS + hcols
        wq = load_matrix(w_attn, cols, out, col_ok, h_ok, 3 * C)  # (CP, HSP)
        wk = load_matrix(w_attn + C, cols, out, col_ok, h_ok, 3 * C)
        wv = load_matrix(w_attn + 2 * C, cols, out, col_ok, h_ok, 3 * C)
        q = tl.dot(h, wq, input_precision="ieee")
        q += tl.load(b_attn + out, mask=h_ok, other=0.0)[None, :]
        k = tl.dot(h, wk, input_precision="ieee")
        k += tl.load(b_attn + C + out, mask=h_ok, other=0.0)[None, :]
        v = tl.dot(h, wv, input_precision="ieee")
        v += tl.load(b_attn + 2 * C + out, mask=h_ok, other=0.0)[None, :]
        slot = ((rows[:, None] * NH + head) * L_CAP + own) * HS + hcols[None, :]
        tl.store(own_k + slot, k, mask=head_tile)
        tl.store(own_v + slot, v, mask=head_tile)

        # The online softmax starts from the token itself (always visible), so no tile
        # ever leaves a row with nothing to normalise.
        m_i = tl.sum(q * k, axis=1) * scale
        l_i = tl.full((BR,), 1.0, dtype=tl.float32)
        acc = v
        for start in range(0, prefix_end, KB):
            p = start + kidx  # absolute positions in the prefix
            visible = (p < prefix_end) & (p % T != T - 1)  # earlier values are hidden
            offsets = ((group[:, None, None] * NH + head) * P_CAP + p[None, :, None]) * HS
            offsets += hcols[None, None, :]
            load_ok = row_ok[:, None, None] & visible[None, :, None] & h_ok[None, None, :]
            m_i, l_i, acc = attend_tile(
                q, m_i, l_i, acc, prefix_k, prefix_v, offsets, load_ok, visible[None, :], scale
            )
        for start in range(0, own, KB):
            o = start + kidx  # own slots written before this token
            visible = (o < own) & ((prefix_end + o) % T != T - 1)
            offsets = ((rows[:, None, None] * NH + head) * L_CAP + o[None, :, None]) * HS
            offsets += hcols[None, None, :]
            load_ok = row_ok[:, None, None] & visible[None, :, None] & h_ok[None, None, :]
            m_i, l_i, acc = attend_tile(
                q, m_i, l_i, acc, own_k, own_v, offsets, load_ok, visible[None, :], scale
            )
        y = acc / l_i[:, None]  # (BR, HSP)
        wp = load_matrix(w_proj, out, cols, h_ok, col_ok, C)  # (HSP, CP)
        attn += tl.dot(y, wp, input_precision="ieee")
    x += attn + tl.load(b_proj + cols, mask=col_ok, other=0.0)[None, :]

    # MLP, a tile of hidden columns at a time.
    h = layer_norm(x, ln2_w, ln2_b, cols, col_ok, C, eps2)
    mlp = tl.zeros((BR, CP), dtype=tl.float32)
    hb = tl.arange(0, HB)
    for start in range(0, HIDP, HB):
        hid = start + hb
        hid_ok = hid < HID
        wf = load_matrix(w_fc, cols, hid, col_ok, hid_ok, HID)  # (CP, HB)
        u = tl.dot(h, wf, input_precision="ieee")
        u += tl.load(b_fc + hid, mask=hid_ok, other=0.0)[None, :]
        u = 0.5 * u * (1.0 + tl.erf(u * 0.7071067811865476))  # exact GELU, as F.gelu
        wo = load_matrix(w_out, hid, cols, hid_ok, col_ok, C)  # (HB, CP)
        mlp += tl.dot(u, wo, input_precision="ieee")
    x += mlp + tl.load(b_out + cols, mask=col_ok, other=0.0)[None, :]

    if LAST:
        f = layer_norm(x, lnf_w, lnf_b, cols, col_ok, C, eps_f)
        dim = position % T  # this position's head
        nb = tl.arange(0, HB)
        for start in range(0, NP, HB):  # a tile of bins at a time, as the MLP's columns
            bins = start + nb
            bin_ok = bins < N
            weight = load_matrix(head_w + dim * C * N, cols, bins, col_ok, bin_ok, N)  # (CP, HB)
            logits = tl.dot(f, weight, input_precision="ieee")
            logits += tl.load(head_b + dim * N + bins, mask=bin_ok, other=0.0)[None, :]
            tl.store(
                logits_ptr + rows[:, None] * N + bins[None, :],
                logits,
                mask=row_ok[:, None] & bin_ok[None, :],
            )
    else:
        tl.store(x_ptr + rows[:, None] * C + cols[None, :], x, mask=tile)
