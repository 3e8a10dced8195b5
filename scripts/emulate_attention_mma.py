#!/usr/bin/env python3
"""scripts/emulate_attention_mma.py — checks the register-level index arithmetic of the CUDA
prefill kernel `mma_pipelined` (src/kernels/cuda/attention_mma_pipelined.cu and the steps it shares with
`mma` in attention_mma_common.cuh) without a GPU.

Every lane's registers are emulated as the kernel fills them: Q's A fragments, the K tile's B
fragments from `ldmatrix.x4` and V's from `ldmatrix.x4.trans` (row addresses exactly as the kernel
computes them), the two shared-memory stages the tile copies alternate between, the shuffles of
the softmax, and P turned into A fragments. `mma.m16n8k16` is emulated by assembling its A, B and
C matrices from the 32 lanes' registers by the PTX ISA's fragment layouts, so a fragment filled
from the wrong place gives a wrong product. The output is compared with a float64 reference; a
correct kernel differs only by the operand rounding (BF16 or F16), a swapped index by O(1).

  python3 scripts/emulate_attention_mma.py          # the cases below, both operand types
  python3 scripts/emulate_attention_mma.py --break  # the same with V's matrices swapped (must fail)
Needs numpy only.
"""
import sys

import numpy as np

BR, BC, WARPS = 64, 64, 4
LOG2E = 1.4426950408889634
LANES = np.arange(32)
G, T = LANES // 4, LANES % 4


def round_bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def round_f16(x):
    return np.clip(np.asarray(x, np.float32), -65504, 65504).astype(np.float16).astype(np.float32)


def mma(d, a, b0, b1):
    """d[32 lanes][4] += A (16x16) B (16x8) with A, B, C assembled from lane registers.
    a: [4 regs][32 lanes][2], b0/b1: [32 lanes][2] (the pair's first element = lower 16 bits)."""
    A = np.zeros((16, 16))
    for i in range(4):  # a0: row g, k 2t..; a1: row g+8; a2: row g, k 2t+8..; a3: row g+8, k 2t+8..
        r = G + (8 if i & 1 else 0)
        c = 2 * T + (8 if i & 2 else 0)
        A[r, c] = a[i][:, 0]
        A[r, c + 1] = a[i][:, 1]
    B = np.zeros((16, 8))
    B[2 * T, G], B[2 * T + 1, G] = b0[:, 0], b0[:, 1]
    B[2 * T + 8, G], B[2 * T + 9, G] = b1[:, 0], b1[:, 1]
    C = np.zeros((16, 8))
    C[G, 2 * T], C[G, 2 * T + 1], C[G + 8, 2 * T], C[G + 8, 2 * T + 1] = d[:, 0], d[:, 1], d[:, 2], d[:, 3]
    D = A @ B + C
    return np.stack([D[G, 2 * T], D[G, 2 * T + 1], D[G + 8, 2 * T], D[G + 8, 2 * T + 1]], axis=1)


def ldmatrix4(smem, row_of_lane, col_of_lane, trans):
    """Four 8x8 matrices; lanes 8i..8i+7 address matrix i's rows. Returns [4 regs][32 lanes][2]."""
    regs = []
    for i in range(4):
        M = np.stack([smem[row_of_lane[8 * i + r], col_of_lane[8 * i + r]:col_of_lane[8 * i + r] + 8] for r in range(8)])
        if trans:
            M = M.T
        regs.append(np.stack([M[G, 2 * T], M[G, 2 * T + 1]], axis=1))
    return regs


def shfl_xor(v, m):
    return v[LANES ^ m]


def emulate(case, rnd, swap_v=False):
    n, heads, kv_heads, D, pos, seq_indptr, kv_len, page_size, page_ids, page_indptr, q, kpool, vpool = case
    group = heads // kv_heads
    kKC, kNT, kDT, ld = D // 16, BC // 8, D // 8, D + 8
    out = np.full((n, heads, D), np.nan)
    tiles_y = (n + BR - 1) // BR
    for h in range(heads):
        kvh = h // group
        for by in range(tiles_y):
            i0 = (tiles_y - 1 - by) * BR
            rows = min(BR, n - i0)
            row_seq = np.full(BR, -1)
            row_vis = np.zeros(BR, int)
            for r in range(rows):
                s = max(j for j in range(len(kv_len)) if seq_indptr[j] <= i0 + r)
                row_seq[r], row_vis[r] = s, min(pos[i0 + r] + 1, kv_len[s])
            stages = np.zeros((2, 2, BC, ld))
            qscale = 1.0 / np.sqrt(D) * LOG2E
            st = []
            for w in range(WARPS):
                qf = np.zeros((kKC, 4, 32, 2))
                for kc in range(kKC):
                    for i in range(4):
                        r = 16 * w + G + (8 if i & 1 else 0)
                        c = 16 * kc + 2 * T + (8 if i & 2 else 0)
                        ok = r < rows
                        rr = np.where(ok, i0 + r, 0)
                        qf[kc, i, :, 0] = np.where(ok, rnd(q[rr, h, c] * qscale), 0)
                        qf[kc, i, :, 1] = np.where(ok, rnd(q[rr, h, c + 1] * qscale), 0)
                st.append(dict(qf=qf, o=np.zeros((kDT, 32, 4)), m=np.full((2, 32), -np.inf), l=np.zeros((2, 32))))

            def copy_tile(page0, t0, vis, stage):
                for tid in range(128):
                    for rnd_ in range(BC * (D // 8) // 128):
                        e = tid + rnd_ * 128
                        key, c8 = e // (D // 8), e % (D // 8)
                        tp = t0 + key
                        for kv, pool in ((0, kpool), (1, vpool)):
                            if tp < vis:
                                slot = page_ids[page0 + tp // page_size] * page_size + tp % page_size
                                stages[stage, kv, key, 8 * c8:8 * c8 + 8] = pool[slot, kvh * D + 8 * c8:kvh * D + 8 * c8 + 8]
                            else:
                                stages[stage, kv, key, 8 * c8:8 * c8 + 8] = 0

            r0 = 0
            while r0 < rows:
                s = row_seq[r0]
                r1, vis = r0, 0
                while r1 < rows and row_seq[r1] == s:
                    vis = max(vis, row_vis[r1])
                    r1 += 1
                page0 = page_indptr[s]
                tiles = (vis + BC - 1) // BC
                if tiles > 0:
                    copy_tile(page0, 0, vis, 0)
                for it in range(tiles):
                    t0 = it * BC
                    if it + 1 < tiles:
                        copy_tile(page0, t0 + BC, vis, (it + 1) & 1)
                    ks, vs = stages[it & 1, 0], stages[it & 1, 1]
                    for w in range(WARPS):
                        S = st[w]
                        limit = []
                        for hr in range(2):
                            r = 16 * w + G + 8 * hr
                            limit.append(np.where((r >= r0) & (r < r1), row_vis[np.minimum(r, BR - 1)], 0))
                        warp_limit = max(limit[0].max(), limit[1].max())
                        if t0 >= warp_limit:
                            continue
                        mi, mr = LANES >> 3, LANES & 7
                        sc = np.zeros((kNT, 32, 4))
                        for j in range(kNT):
                            for kc in range(0, kKC, 2):
                                b = ldmatrix4(ks, 8 * j + mr, 16 * kc + 8 * mi, False)
                                sc[j] = mma(sc[j], S["qf"][kc], b[0], b[1])
                                sc[j] = mma(sc[j], S["qf"][kc + 1], b[2], b[3])
                        for hr in range(2):
                            mx = np.full(32, -np.inf)
                            for j in range(kNT):
                                for e in range(2):
                                    key = t0 + 8 * j + 2 * T + e
                                    sc[j][:, 2 * hr + e] = np.where(key >= limit[hr], -np.inf, sc[j][:, 2 * hr + e])
                                    mx = np.maximum(mx, sc[j][:, 2 * hr + e])
                            mx = np.maximum(mx, shfl_xor(mx, 1))
                            mx = np.maximum(mx, shfl_xor(mx, 2))
                            m_new = np.maximum(S["m"][hr], mx)
                            base = np.where(m_new == -np.inf, 0.0, m_new)
                            corr = np.exp2(S["m"][hr] - base)
                            ssum = np.zeros(32)
                            for j in range(kNT):
                                for e in range(2):
                                    sc[j][:, 2 * hr + e] = np.exp2(sc[j][:, 2 * hr + e] - base)
                                    ssum += sc[j][:, 2 * hr + e]
                            ssum += shfl_xor(ssum, 1)
                            ssum += shfl_xor(ssum, 2)
                            S["l"][hr] = S["l"][hr] * corr + ssum
                            S["m"][hr] = m_new
                            S["o"][:, :, 2 * hr] *= corr
                            S["o"][:, :, 2 * hr + 1] *= corr
                        for kk in range(BC // 16):
                            a = [np.stack([rnd(sc[2 * kk][:, 0]), rnd(sc[2 * kk][:, 1])], 1),
                                 np.stack([rnd(sc[2 * kk][:, 2]), rnd(sc[2 * kk][:, 3])], 1),
                                 np.stack([rnd(sc[2 * kk + 1][:, 0]), rnd(sc[2 * kk + 1][:, 1])], 1),
                                 np.stack([rnd(sc[2 * kk + 1][:, 2]), rnd(sc[2 * kk + 1][:, 3])], 1)]
                            for dn in range(0, kDT, 2):
                                b = ldmatrix4(vs, 16 * kk + 8 * (mi & 1) + mr, 8 * (dn + (mi >> 1)), True)
                                if swap_v:
                                    b = [b[1], b[0], b[2], b[3]]
                                S["o"][dn] = mma(S["o"][dn], a, b[0], b[1])
                                S["o"][dn + 1] = mma(S["o"][dn + 1], a, b[2], b[3])
                r0 = r1
            for w in range(WARPS):
                S = st[w]
                for hr in range(2):
                    for lane in range(32):
                        r = 16 * w + lane // 4 + 8 * hr
                        if r >= rows:
                            continue
                        inv = 1.0 / S["l"][hr][lane] if S["l"][hr][lane] > 0 else 0.0
                        for dn in range(kDT):
                            c = 8 * dn + 2 * (lane % 4)
                            out[i0 + r, h, c] = S["o"][dn][lane, 2 * hr] * inv
                            out[i0 + r, h, c + 1] = S["o"][dn][lane, 2 * hr + 1] * inv
    return out


def make_case(seqs, heads, kv_heads, D, page_size, rnd, seed):
    """seqs: (n tokens, kv_len, pos0) each; a paged pool with scrambled pages."""
    rng = np.random.default_rng(seed)
    pos, seq_indptr, kv_len, page_indptr = [], [0], [], [0]
    pages_total = sum((kl + page_size - 1) // page_size for _, kl, _ in seqs)
    perm = rng.permutation(pages_total + 3)[:pages_total]
    page_ids, used = [], 0
    for n_s, kl, p0 in seqs:
        pos += [p0 + i for i in range(n_s)]
        seq_indptr.append(seq_indptr[-1] + n_s)
        kv_len.append(kl)
        np_ = (kl + page_size - 1) // page_size
        page_ids += list(perm[used:used + np_])
        used += np_
        page_indptr.append(used)
    n = len(pos)
    slots = (pages_total + 3) * page_size
    width = kv_heads * D + 8  # wider than a row: the strides are used
    q = rng.standard_normal((n, heads, D)).astype(np.float32)
    kpool = rnd(rng.standard_normal((slots, width)).astype(np.float32))
    vpool = rnd(rng.standard_normal((slots, width)).astype(np.float32))
    return (n, heads, kv_heads, D, np.array(pos), seq_indptr, kv_len, page_size, np.array(page_ids), page_indptr, q, kpool, vpool)


def reference(case):
    n, heads, kv_heads, D, pos, seq_indptr, kv_len, page_size, page_ids, page_indptr, q, kpool, vpool = case
    out = np.zeros((n, heads, D))
    for s in range(len(kv_len)):
        slots = [page_ids[page_indptr[s] + p // page_size] * page_size + p % page_size for p in range(kv_len[s])]
        for i in range(seq_indptr[s], seq_indptr[s + 1]):
            vis = min(pos[i] + 1, kv_len[s])
            for h in range(heads):
                kvh = h // (heads // kv_heads)
                if vis == 0:
                    continue
                K = kpool[slots[:vis], kvh * D:(kvh + 1) * D].astype(np.float64)
                V = vpool[slots[:vis], kvh * D:(kvh + 1) * D].astype(np.float64)
                sc = K @ q[i, h].astype(np.float64) / np.sqrt(D)
                p = np.exp(sc - sc.max())
                out[i, h] = p @ V / p.sum()
    return out


def main():
    swap = "--break" in sys.argv
    cases = [  # (sequences, heads, kv_heads, D, page size)
        ([(70, 70, 0)], 2, 1, 64, 16),
        ([(20, 150, 130)], 2, 2, 128, 8),
        ([(5, 5, 0), (9, 40, 31), (1, 77, 76), (12, 12, 0)], 4, 2, 64, 1),  # a tile across sequences
        ([(65, 200, 135)], 1, 1, 128, 64),
    ]
    worst = {}
    for name, rnd in (("bf16", round_bf16), ("f16", round_f16)):
        for i, (seqs, heads, kvh, D, ps) in enumerate(cases):
            case = make_case(seqs, heads, kvh, D, ps, rnd, seed=i)
            got, want = emulate(case, rnd, swap_v=swap), reference(case)
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            print(f"{name} case {i}: D={D} heads {heads}/{kvh} page {ps} seqs {seqs}: normalised L2 error {err:.2e}")
            worst[name] = max(worst.get(name, 0), err)
    print("worst:", ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    ok = worst["bf16"] < 1e-2 and worst["f16"] < 3e-3
    print("PASS" if ok else "FAIL", "(tolerances: bf16 1e-2, f16 3e-3, as tests/cuda_ops_attention_test.cpp)")
    return 0 if ok != swap else 1


if __name__ == "__main__":
    sys.exit(main())
