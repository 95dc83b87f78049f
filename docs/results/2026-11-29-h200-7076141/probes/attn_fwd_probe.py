"""A minimal causal attention forward (the plain case only) for comparing compiled loops."""
import triton
import triton.language as tl


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, Kp, Vp, offs_m, offs_n, offs_d, lo, hi, qk_scale,
              D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = tl.load(Kp + cols[:, None] * D + offs_d[None, :])
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            s = tl.where(cols[None, :] <= offs_m[:, None], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = tl.load(Vp + cols[:, None] * D + offs_d[None, :])
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def fwd_probe(Q, K, V, O, LSE, N, qk_scale, H: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = h // (H // HK)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_off = (b * H + h).to(tl.int64) * N * D
    kv_off = (b * HK + kvh).to(tl.int64) * N * D
    q = tl.load(Q + q_off + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K + kv_off, V + kv_off, offs_m, offs_n, offs_d,
                              0, start_m * BLOCK_M, qk_scale, D, BLOCK_N, False)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K + kv_off, V + kv_off, offs_m, offs_n, offs_d,
                              start_m * BLOCK_M, (start_m + 1) * BLOCK_M, qk_scale, D, BLOCK_N,
                              True)
    out = acc / l_i[:, None]
    tl.store(O + q_off + offs_m[:, None] * D + offs_d[None, :], out.to(O.dtype.element_ty))
    tl.store(LSE + (b * H + h).to(tl.int64) * N + offs_m, (m_i + tl.log2(l_i)) * 0.6931471805599453)
