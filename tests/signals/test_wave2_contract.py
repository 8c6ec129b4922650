"""The wave-2 contract functions (``shared/spec/contract-wave2.md``) against independent float64
NumPy loops on random inputs with the standard mask patterns (an all-masked row, a one-token row,
holes, multi-turn rows with skipped turn ids and masked observation tokens, garbage log-probs down
to -1e3 where masked), the spec's hand-checked numbers (``other-methods-tests.py``), the
stop-gradient rules, finite gradients for every mask, and jit == eager."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight as hs

B, T, V, G = 6, 14, 9, 3


def lsm(z):
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def sig(x):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, np.float64)))  # no overflow


def layout(seed=0):
    """``mask``, ``turn_id`` [B, T]: row 0 all masked, row 1 one token, row 2 holes in one turn,
    rows 3-5 multi-turn with observation tokens between turns and skipped ids."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((B, T), bool)
    turn = np.full((B, T), -1, np.int64)
    mask[1, 4] = True
    turn[1, 4] = 0
    mask[2, [0, 1, 3, 6, 7, 10]] = True
    turn[2, mask[2]] = 0
    for b in range(3, B):
        at, k = 0, int(rng.integers(0, 2))
        while at < T:
            n = int(rng.integers(1, 4))
            mask[b, at:at + n] = True
            turn[b, at:at + n] = k
            at += n + int(rng.integers(1, 3))  # observation tokens between turns
            k += int(rng.integers(1, 3))       # ids may skip
    turn[~mask] = -1
    return mask, turn


def logprobs(seed, mask):
    rng = np.random.default_rng(seed)
    x = -np.abs(rng.normal(size=mask.shape)) * 2.0
    return np.where(mask, x, -1e3 * rng.random(mask.shape))  # garbage where masked


def logits(seed, scale=3.0):
    return np.random.default_rng(seed).normal(size=(B, T, V)) * scale


def turns_of(turn_row, mask_row):
    return sorted({int(k) for k, m in zip(turn_row, mask_row) if m})


def f32(x):
    return jnp.asarray(np.asarray(x, np.float32))


MASK, TURN = layout()
LT, LS = logprobs(1, MASK), logprobs(2, MASK)
ADV = np.array([0.0, 1.3, -0.7, 0.9, -1.1, 0.4])


def close(got, want, atol=2e-5, rtol=2e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=atol, rtol=rtol)


# ------------------------------------------------------------------ float64 references
def ref_grsd(a, lt, ls, mask, turn, g, valid, lam, eta, clip, floor):
    e = {}
    for b in range(B):
        for k in turns_of(turn[b], mask[b]):
            sel = mask[b] & (turn[b] == k)
            delta = lt[b, sel].mean() - ls[b, sel].mean()
            e[b, k] = np.expm1(np.clip(np.sign(a[b]) * delta, -20, 20))
    out = np.zeros((B, T))
    for b in range(B):
        grp = range(b // g * g, b // g * g + g)
        vals = [abs(v) for (r, k), v in e.items() if r in grp and valid[r]]
        ebar = np.mean(vals) if vals else 0.0
        for t in range(T):
            if not mask[b, t]:
                continue
            if not valid[b]:
                out[b, t] = a[b]
                continue
            q = e[b, turn[b, t]] / (ebar + 1e-6)
            gg = q if abs(q) > eta else 0.0
            gh = np.clip(gg * valid[b], -clip, clip)
            out[b, t] = a[b] * max(1 + lam * gh * valid[b], floor)
    return out


def ref_rlsd(a, lt, ls, mask, eps, lam):
    w = np.clip(np.exp(np.clip(np.sign(a)[:, None] * (lt - ls), -30, 30)), 1 - eps, 1 + eps)
    return np.where(mask, a[:, None] * ((1 - lam) + lam * w), 0.0)


def ref_turn_reweighting(lt, ls, mask, turn):
    out = np.zeros((B, T))
    for b in range(B):
        ks = turns_of(turn[b], mask[b])
        if not ks:
            continue
        d = np.array([np.abs(ls[b] - lt[b])[mask[b] & (turn[b] == k)].mean() for k in ks])
        h = np.array([(-ls[b])[mask[b] & (turn[b] == k)].mean() for k in ks])

        def mm(x):
            r = x.max() - x.min()
            return np.full_like(x, 0.5) if r < 1e-8 else (x - x.min()) / r

        w = 1 - (1 - mm(d)) * (1 - mm(h))
        for i, k in enumerate(ks):
            out[b, mask[b] & (turn[b] == k)] = w[i]
    return out


def ref_return_to_go(r, mask, gamma, turn=None):
    out = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            out[b, t] = sum(gamma ** (s - t) * r[b, s] for s in range(t, T)
                            if mask[b, s] and (turn is None or turn[b, s] == turn[b, t]))
    return out


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("opts", [dict(), dict(lam=1.0, eta=0.5, clip=0.2, floor=0.3)])
def test_grsd_advantages(opts):
    valid = np.array([1, 1, 0, 1, 1, 1])
    kw = dict(lam=0.5, eta=0.0, clip=3.0, floor=0.1) | opts
    got = hs.objectives.grsd_advantages(f32(ADV), f32(LT), f32(LS), MASK, TURN, G, valid, **kw)
    close(got, ref_grsd(ADV, LT, LS, MASK, TURN, G, valid, **kw), atol=1e-4)
    # a valid = 0 row gets exactly A on its tokens
    assert (np.asarray(got)[2][MASK[2]] == np.float32(ADV[2])).all()


def test_grsd_reproduces_the_spec():
    """§1: A = (1, 1, -1), delta = (0.5, -0.2, 0.3): q_exp = (0.6487, -0.1813, -0.2592), one turn
    per row, one group of 3; A_hat = (1.8934, 0.7504, -0.6431) with clip 3, (1.1, 0.9, -0.9) with
    clip 0.2 (the official launcher's)."""
    a = np.array([1.0, 1.0, -1.0])
    mask = np.zeros((3, 2), bool)
    mask[:, 0] = True
    turn = np.where(mask, 0, -1)
    ls = np.zeros((3, 2))
    lt = np.array([[0.5, 0.0], [-0.2, 0.0], [0.3, 0.0]])
    got = hs.objectives.grsd_advantages(f32(a), f32(lt), f32(ls), mask, turn, 3, np.ones(3))
    qe = np.expm1(np.sign(a) * lt[:, 0])
    mod = np.maximum(1 + 0.5 * np.clip(qe / (np.abs(qe).mean() + 1e-6), -3, 3), 0.1)
    close(np.asarray(got)[:, 0], a * mod)
    close(np.asarray(got)[:, 0], [1.8934, 0.7504, -0.6431], atol=1e-4)
    tight = hs.objectives.grsd_advantages(f32(a), f32(lt), f32(ls), mask, turn, 3, np.ones(3),
                                          clip=0.2)
    close(np.asarray(tight)[:, 0], [1.1, 0.9, -0.9], atol=1e-5)
    assert (np.asarray(tight)[:, 1] == 0).all()


def test_rlsd_advantages_and_the_spec():
    for lam in (1.0, 0.5, 0.0):
        got = hs.objectives.rlsd_advantages(f32(ADV), f32(LT), f32(LS), MASK, eps_w=0.2, lam=lam)
        close(got, ref_rlsd(ADV, LT, LS, MASK, 0.2, lam))
    # §2: delta = (0.3, -0.1, -0.5), A = +-1: clip(exp(+-delta)) = (1.2, 0.9048, 0.8) / (0.8, 1.1052, 1.2)
    dl = np.array([[0.3, -0.1, -0.5]] * 2)
    got = hs.objectives.rlsd_advantages(f32([1.0, -1.0]), f32(dl), f32(np.zeros((2, 3))),
                                        np.ones((2, 3), bool))
    close(got, [[1.2, 0.904837, 0.8], [-0.8, -1.105171, -1.2]], atol=1e-5)


def test_h2sd_advantages():
    success = np.array([0, 1, 0, 1, 1, 0])
    adv, rkl = hs.objectives.h2sd_advantages(f32(ADV), f32(LT), f32(LS), MASK, success,
                                             eps_w=0.2, gamma=0.7)
    w = np.clip(np.exp(np.clip(np.sign(ADV)[:, None] * (LT - LS), -30, 30)), 0.8, 1.2)
    want = np.where(success[:, None] > 0, ADV[:, None] * w, ADV[:, None])
    close(adv, np.where(MASK, want, 0.0))
    close(rkl, np.where(MASK, np.where(success[:, None] > 0, 0.0, 0.7), 0.0))
    # §13: a success row, A = 1.2, delta = (0.4, -0.3): 1.2 * clip(exp(delta)) = (1.44, 0.96)
    got, _ = hs.objectives.h2sd_advantages(f32([1.2]), f32([[0.4, -0.3]]), f32([[0.0, 0.0]]),
                                           np.ones((1, 2), bool), np.ones(1))
    close(got, [[1.44, 0.96]], atol=1e-5)  # exp(-0.3) = 0.741 clips to 0.8


def test_turn_reweighting_and_atod():
    got = hs.signals.turn_reweighting(f32(LT), f32(LS), MASK, TURN)
    w = ref_turn_reweighting(LT, LS, MASK, TURN)
    close(got, w)
    assert np.asarray(got)[1, 4] == pytest.approx(0.75)  # one turn: 1 - 0.5 * 0.5
    for step in (0, 40, 80, 150):
        got = hs.objectives.atod_advantages(f32(ADV), f32(LT), f32(LS), MASK, TURN, step)
        p = min(step / 80, 1)
        kappa, rho = max(0.1, 1 - 0.9 * p), 1 + p
        close(got, np.where(MASK, kappa * (LT - LS) * w + rho * ADV[:, None], 0.0), atol=1e-4)


def test_turn_reweighting_reproduces_the_spec():
    """§4: d = (0.101, 0.228, 0.022, 0.019, 0.138), h = (0.037, 0.025, 0.010, 0.006, 0.008) over
    five one-token turns; the ATOD example at step 40 is 0.55 * 0.4 * w_4 + 1.5 * (-0.7)."""
    d = np.array([0.101, 0.228, 0.022, 0.019, 0.138])
    h = np.array([0.037, 0.025, 0.010, 0.006, 0.008])
    ls = -h[None]
    lt = ls + d[None]  # |l_S - l_T| = d
    mask = np.ones((1, 5), bool)
    turn = np.arange(5)[None]
    w = np.asarray(hs.signals.turn_reweighting(f32(lt), f32(ls), mask, turn))[0]
    mm = lambda x: (x - x.min()) / (x.max() - x.min())
    close(w, 1 - (1 - mm(d)) * (1 - mm(h)), atol=1e-4)
    close(w, [1.0, 1.0, 0.1415, 0.0, 0.5972], atol=1e-4)
    # the ATOD token: l_T - l_S = 0.4 on turn 4 at step 40, A = -0.7
    lt2 = ls.copy()
    lt2[0, 4] += 0.4
    ls2 = ls.copy()
    atod = hs.objectives.atod_advantages(f32([-0.7]), f32(lt2), f32(ls2), mask, turn, 40)
    w2 = np.asarray(hs.signals.turn_reweighting(f32(lt2), f32(ls2), mask, turn))[0, 4]
    assert float(np.asarray(atod)[0, 4]) == pytest.approx(0.55 * 0.4 * w2 + 1.5 * -0.7, abs=1e-5)
    assert 0.55 * 0.4 * w[4] + 1.5 * -0.7 == pytest.approx(-0.9186, abs=1e-4)  # the spec's


def test_topk_forward_kl():
    zt, zs = logits(3), logits(4)
    zt[0, 0, :] = 1.0  # ties: the smaller ids first
    for k in (3, V, V + 4):
        got = hs.signals.topk_forward_kl(f32(zt), f32(zs), MASK | (np.arange(T) == 0), top_k=k)
        kk = min(k, V)
        want = np.zeros((B, T))
        for b in range(B):
            for t in range(T):
                ids = sorted(range(V), key=lambda i: (-zt[b, t, i], i))[:kk]
                pt = np.exp(lsm(zt[b, t, ids]))
                want[b, t] = (pt * (np.log(pt) - lsm(zs[b, t, ids]))).sum()
        want[~(MASK | (np.arange(T) == 0))] = 0.0
        close(got, want, atol=1e-5)
    # §3: teacher (2, 1, 0), student (1, 1.5, 0.2) on the top-3 ids: fKL = 0.5107
    got = hs.signals.topk_forward_kl(f32([[[2.0, 1.0, 0.0]]]), f32([[[1.0, 1.5, 0.2]]]),
                                     np.ones((1, 1), bool), top_k=3)
    pt = np.exp(lsm([2.0, 1.0, 0.0]))
    close(got, [[(pt * (np.log(pt) - lsm([1.0, 1.5, 0.2]))).sum()]])


def test_topk_tail_kl():
    zt, zs = logits(5), logits(6)
    for k in (1, 4, V, V + 3):
        got = hs.signals.topk_tail_kl(f32(zt), f32(zs), MASK, top_k=k)
        q, p = np.exp(lsm(zt)), np.exp(lsm(zs))
        want = np.zeros((B, T))
        for b in range(B):
            for t in range(T):
                ids = np.argsort(-q[b, t], kind="stable")[:min(k, V)]
                head = (q[b, t, ids] * (np.log(q[b, t, ids]) - np.log(p[b, t, ids]))).sum()
                qr = max(1 - q[b, t, ids].sum(), 1e-6)
                pr = max(1 - p[b, t, ids].sum(), 1e-6)
                want[b, t] = head + qr * (np.log(qr) - np.log(pr))
        close(got, np.where(MASK, want, 0.0), atol=3e-5)
    # §7: q = (0.5, 0.3 | 0.2), p = (0.4, 0.2 | 0.4): 0.0660
    zq, zp = np.log([[[0.5, 0.3, 0.2]]]), np.log([[[0.4, 0.2, 0.4]]])
    got = hs.signals.topk_tail_kl(f32(zq), f32(zp), np.ones((1, 1), bool), top_k=2)
    want = 0.5 * np.log(0.5 / 0.4) + 0.3 * np.log(0.3 / 0.2) + 0.2 * np.log(0.2 / 0.4)
    close(got, [[want]], atol=1e-6)


def test_cbsd_credit_and_the_spec():
    rng = np.random.default_rng(7)
    action = rng.random((B, T)) < 0.4
    gaps = np.array([0.04, 0.05, 0.1, 0.3, 0.6, 0.9])
    got = hs.signals.cbsd_credit(f32(LT), f32(LS), MASK, action, f32(gaps))
    w = np.where(gaps > 0.05, np.clip(gaps / 0.2, 0, 2.0), 0.0)
    want = sig(5 * (LT - LS)) * w[:, None] * np.where(action, 2.0, 1.0)
    close(got, np.where(MASK, want, 0.0))
    # §3: gate sigmoid(5 * 0.7) = 0.9707, weight min(0.3 / 0.2, 2) * 2 = 3
    one = hs.signals.cbsd_credit(f32([[-0.2]]), f32([[-0.9]]), np.ones((1, 1)), np.ones((1, 1)),
                                 f32([0.3]))
    close(one, [[sig(3.5) * 3.0]])


def test_skill_shift_gate_and_the_spec():
    got = hs.signals.skill_shift_gate(f32(LT), f32(LS), MASK, beta=5.0)
    close(got, np.where(MASK, sig(5 * (LT - LS)), 0.0))
    g = hs.signals.skill_shift_gate(f32([[0.8, 0.0, -0.6]]), f32(np.zeros((1, 3))),
                                    np.ones((1, 3)))
    close(g, [[0.982014, 0.5, 0.047426]], atol=1e-6)


def test_turn_loss_weights_and_the_spec():
    for alpha in (0.0, 0.3, 1.0):
        got = np.asarray(hs.signals.turn_loss_weights(MASK, TURN, alpha))
        want = np.zeros((B, T))
        for b in range(B):
            ks = turns_of(TURN[b], MASK[b])
            n = {k: (MASK[b] & (TURN[b] == k)).sum() for k in ks}
            for k in ks:
                q = (1 - alpha) * n[k] / sum(n.values()) + alpha / len(ks)
                want[b, MASK[b] & (TURN[b] == k)] = q / n[k]
        close(got, want)
        sums = got.sum(-1)
        close(sums[MASK.any(-1)], 1.0)
        assert sums[0] == 0.0
    # §9: n = (6, 3, 1), K̄ = (0.4, 0.2, 0.1): losses 0.31 / 0.27167 / 0.23333 at alpha 0 / .5 / 1
    turn = np.array([[0] * 6 + [-1] + [1] * 3 + [-1] + [2]])
    kl = np.where(turn == 0, 0.4, np.where(turn == 1, 0.2, 0.1))
    for alpha, loss in ((0.0, 0.31), (0.5, 0.271667), (1.0, 0.233333)):
        w = np.asarray(hs.signals.turn_loss_weights(turn >= 0, turn, alpha))
        assert (w * kl).sum() == pytest.approx(loss, abs=1e-5)


def test_mixture_target():
    zr, zt = logits(8, 30.0), logits(9, 30.0)  # scale-30 logits stay finite
    for w in (0.0, 0.3, 0.5, 1.0):
        geo = hs.signals.mixture_target(f32(zr), f32(zt), w=w)
        close(geo, lsm((1 - w) * zr + w * zt), atol=1e-3)
        ari = np.asarray(hs.signals.mixture_target(f32(zr), f32(zt), w=w, mix="arithmetic"))
        with np.errstate(divide="ignore"):
            want = np.logaddexp(np.log(1 - w) + lsm(zr), np.log(w) + lsm(zt))
        finite = np.isfinite(want)
        close(ari[finite], want[finite], atol=1e-3)
        assert (ari[~finite] < -1e3).all() or not (~finite).any()
    close(hs.signals.mixture_target(f32(zr), f32(zt), w=1.0), lsm(zt), atol=1e-3)
    # §5: the spec's 3-position example, geometric mix at w = 0.5
    zr3 = np.array([[2., 0., -1.], [0., 1., 0.], [1., 1., 1.]])
    zt3 = np.array([[0., 2., -1.], [0., 3., 0.], [2., 0., 0.]])
    close(hs.signals.mixture_target(f32(zr3), f32(zt3)), lsm(0.5 * zr3 + 0.5 * zt3), atol=1e-6)
    grads = jax.grad(lambda a, b: hs.signals.mixture_target(a, b, w=1.0, mix="arithmetic").sum(),
                     argnums=(0, 1))(f32(zr), f32(zt))
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_return_to_go_and_the_spec():
    r = logprobs(10, MASK)
    close(hs.signals.return_to_go(f32(r), MASK, gamma=0.9), ref_return_to_go(r, MASK, 0.9),
          atol=1e-4)
    close(hs.signals.return_to_go(f32(r), MASK, gamma=0.9, turn_id=TURN),
          ref_return_to_go(r, MASK, 0.9, TURN), atol=1e-4)
    # §5: rho = l_S(y) - log p_mix(y) on the 3-position example, G by gamma = 0.99
    zr3 = np.array([[2., 0., -1.], [0., 1., 0.], [1., 1., 1.]])
    zt3 = np.array([[0., 2., -1.], [0., 3., 0.], [2., 0., 0.]])
    y = np.array([0, 1, 0])
    rho = lsm(zr3)[np.arange(3), y] - lsm(0.5 * zr3 + 0.5 * zt3)[np.arange(3), y]
    got = np.asarray(hs.signals.return_to_go(f32(rho[None]), np.ones((1, 3)), gamma=0.99))[0]
    want = np.array([rho[0] + 0.99 * rho[1] + 0.99 ** 2 * rho[2], rho[1] + 0.99 * rho[2], rho[2]])
    close(got, want, atol=1e-6)
    # linear: the gradient w.r.t. r_s is sum_t gamma^(s-t) over valid t <= s of the same turn
    g = np.asarray(jax.grad(lambda x: hs.signals.return_to_go(x, MASK, gamma=0.9,
                                                              turn_id=TURN).sum())(f32(r)))
    want = np.zeros((B, T))
    for b in range(B):
        for s in range(T):
            if MASK[b, s]:
                want[b, s] = sum(0.9 ** (s - t) for t in range(s + 1)
                                 if MASK[b, t] and TURN[b, t] == TURN[b, s])
    close(g, want, atol=1e-5)


def test_recoverability_labels_and_the_spec():
    p_cont = jnp.asarray([[0.6, 0.2, 0.4, 0.1], [0.5, 0.25, 0.25, 0.3]])
    p_roll = jnp.asarray([[0.1, 0.7, 0.6, 0.3], [0.0, 0.5, 0.49, 0.9]])
    got = np.asarray(hs.signals.recoverability_labels(p_cont, p_roll))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[1, 2, 0, 0], [1, 2, 0, 0]])


def test_contribution_filter_and_the_spec():
    rng = np.random.default_rng(11)
    fkl = np.where(MASK, rng.random((B, T)), 1e3)
    fkl[4, :] = np.where(MASK[4], 0.5, 1e3)  # ties: the smaller t first
    for share in (0.5, 0.95):
        got = np.asarray(hs.signals.contribution_filter(f32(fkl), MASK, share=share))
        want = np.zeros((B, T))
        for b in range(B):
            idx = [t for t in range(T) if MASK[b, t]]
            order = sorted(idx, key=lambda t: (-fkl[b, t], t))
            total, acc = sum(fkl[b, t] for t in idx), 0.0
            for t in order:
                if acc < share * total:
                    want[b, t] = 1.0
                acc += fkl[b, t]
        np.testing.assert_array_equal(got, want)
    # §14: six tokens, keep the smallest prefix reaching 95%: 4 tokens
    klt = np.array([[0.01, 0.50, 0.05, 0.30, 0.12, 0.02]])
    got = np.asarray(hs.signals.contribution_filter(f32(klt), np.ones((1, 6))))
    np.testing.assert_array_equal(got, [[0, 1, 1, 1, 1, 0]])
    zero = hs.signals.contribution_filter(f32(np.zeros((1, 3))), np.ones((1, 3)))
    assert not np.asarray(zero).any()


def test_flip_advantages_and_the_spec():
    zc, zp = logits(12), logits(13)
    tokens = np.random.default_rng(14).integers(0, V, (B, T))
    got = hs.objectives.flip_advantages(f32(ADV), f32(zc), f32(zp), tokens, MASK, tau_flip=0.1)
    lc = np.take_along_axis(lsm(zc), tokens[..., None], -1)[..., 0]
    lp = np.take_along_axis(lsm(zp), tokens[..., None], -1)[..., 0]
    loc = (lc - lp > 0) & (zp.argmax(-1) != tokens)
    want = np.where((ADV < 0)[:, None] & loc, 0.1, ADV[:, None])
    close(got, np.where(MASK, want, 0.0))
    # §14: A = -0.8, loc on token 1: (-0.8, 0.1, -0.8, ...)
    zc1 = np.zeros((1, 3, 2))
    zc1[0, 1, 1] = 2.0  # the criterion raises token 1 at position 1
    zp1 = np.zeros((1, 3, 2))
    zp1[0, :, 0] = 1.0  # plain argmax 0 everywhere
    got = hs.objectives.flip_advantages(f32([-0.8]), f32(zc1), f32(zp1), np.array([[0, 1, 0]]),
                                        np.ones((1, 3)))
    close(got, [[-0.8, 0.1, -0.8]])


# ------------------------------------------------------------------ contract rules
def _calls():
    """(name, fn of the float inputs, float inputs, sg): every contract function."""
    zt, zs = f32(logits(3)), f32(logits(4))
    lt, ls, a = f32(LT), f32(LS), f32(ADV)
    action = np.random.default_rng(7).random((B, T)) < 0.4
    return [
        ("grsd", lambda a, x, y: hs.objectives.grsd_advantages(a, x, y, MASK, TURN, G, np.ones(B)),
         (a, lt, ls), True),
        ("rlsd", lambda a, x, y: hs.objectives.rlsd_advantages(a, x, y, MASK), (a, lt, ls), True),
        ("atod", lambda a, x, y: hs.objectives.atod_advantages(a, x, y, MASK, TURN, 10),
         (a, lt, ls), True),
        ("h2sd", lambda a, x, y: hs.objectives.h2sd_advantages(a, x, y, MASK, ADV > 0)[0],
         (a, lt, ls), True),
        ("flip", lambda a, x, y: hs.objectives.flip_advantages(
            a, x, y, np.zeros((B, T), np.int32), MASK), (a, zt, zs), True),
        ("cbsd", lambda x, y: hs.signals.cbsd_credit(x, y, MASK, action, f32(np.full(B, 0.3))),
         (lt, ls), True),
        ("tdur", lambda x, y: hs.signals.turn_reweighting(x, y, MASK, TURN), (lt, ls), True),
        ("seed", lambda x, y: hs.signals.skill_shift_gate(x, y, MASK), (lt, ls), True),
        ("filter", lambda x: hs.signals.contribution_filter(x, MASK), (jnp.abs(lt),), True),
        ("turnopd", lambda x: hs.signals.turn_loss_weights(MASK, TURN, x), (jnp.float32(0.4),),
         True),
        ("fkl", lambda x, y: hs.signals.topk_forward_kl(x, y, MASK, top_k=4), (zt, zs), False),
        ("tailkl", lambda x, y: hs.signals.topk_tail_kl(x, y, MASK, top_k=4), (zt, zs), False),
        ("rtg", lambda x: hs.signals.return_to_go(x, MASK, turn_id=TURN), (lt,), False),
        ("mix", lambda x, y: hs.signals.mixture_target(x, y, w=0.3, mix="arithmetic"), (zt, zs),
         False),
    ]


@pytest.mark.parametrize("case", _calls(), ids=lambda c: c[0])
def test_contract_rules(case):
    name, fn, inputs, stopped = case
    out = fn(*inputs)
    assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
    if name != "mix":
        assert (np.asarray(out)[~MASK] == 0).all()  # masked positions give exactly 0
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(*inputs)), np.asarray(out), rtol=1e-5,
                               atol=1e-6)
    grads = jax.grad(lambda *xs: fn(*xs).sum(), argnums=tuple(range(len(inputs))))(*inputs)
    for g in grads:
        g = np.asarray(g)
        assert np.isfinite(g).all()
        if stopped:
            assert (g == 0).all(), name
    if name in ("fkl", "tailkl"):  # the teacher is stop-gradient, the student gets the gradient
        assert (np.asarray(grads[0]) == 0).all() and np.abs(np.asarray(grads[1])).sum() > 0


def test_all_masked_batch_is_finite():
    mask = np.zeros((B, T), bool)
    turn = np.full((B, T), -1)
    for fn in (lambda x: hs.objectives.grsd_advantages(f32(ADV), x, x, mask, turn, G, np.ones(B)),
               lambda x: hs.signals.turn_reweighting(x, x, mask, turn),
               lambda x: hs.signals.turn_loss_weights(mask, turn, 0.5) + 0 * x,
               lambda x: hs.signals.return_to_go(x, mask, turn_id=turn),
               lambda x: hs.signals.contribution_filter(x, mask)):
        out, grad = jax.value_and_grad(lambda x: fn(x).sum())(f32(LT))
        assert float(out) == 0.0 and np.isfinite(np.asarray(grad)).all()
