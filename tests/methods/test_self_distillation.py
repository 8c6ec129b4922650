"""The self-distillation pieces of SDPO / HSD / H2SD (spec §6, §12, §13): the per-token
divergence against float64 NumPy and the spec's hand-checked numbers, the detached importance
weight, and rows without a teacher context left out of every term."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.methods import LMHead, get_method
from hindsight.methods.distill import TokenDivergence, importance_weight
from hindsight.ops import generalized_jsd_from_logprobs

S = np.array([1.0, 0.0, -1.0, -2.0])
T = np.array([0.0, 1.0, -1.0, -3.0])


def logp(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def div(z_s, z_t, tokens=None, **kw):
    d = TokenDivergence(**kw)
    ls, lt = (jnp.asarray(logp(z), jnp.float32)[None] if np.ndim(z) == 1 else
              jnp.asarray(logp(z), jnp.float32) for z in (z_s, z_t))
    tokens = jnp.zeros(ls.shape[0], jnp.int32) if tokens is None else jnp.asarray(tokens)
    return np.asarray(d(ls, lt, tokens))


def test_spec_section6_numbers():
    for beta, want in ((0.0, 0.42389), (0.5, 0.10113), (1.0, 0.41862)):
        got = generalized_jsd_from_logprobs(jnp.asarray(logp(S), jnp.float32),
                                            jnp.asarray(logp(T), jnp.float32), beta)
        np.testing.assert_allclose(float(got), want, atol=5e-5)
        np.testing.assert_allclose(div(S, T, divergence="full", alpha=beta)[0], want, atol=5e-5)
    # top-2 of the student (ids 0, 1) + tail: s = [.6439, .2369, .1192], t = [.2418, .6572, .1010]
    np.testing.assert_allclose(div(S, T, alpha=0.5, top_k=2)[0], 0.09914, atol=5e-5)
    np.testing.assert_allclose(div(S, T, alpha=1.0, top_k=2)[0], 0.40877, atol=5e-5)


def test_spec_section12_and_13_numbers():
    # HSD: all the credit lands on the divergence position (V = 3: top-100 is the whole vocabulary)
    s = [[3, 0, 0], [0, 3, 0], [2, 1, 0], [0, 0, 3]]
    t = [[3, 0, 0], [0, 3, 0], [0, 1, 3], [0, 0, 3]]
    np.testing.assert_allclose(div(s, t, alpha=1.0), [0, 0, 1.8226, 0], atol=5e-5)
    # H2SD failure, top-2 + tail: s = [.6439, .2369, .1192], t = [.0871, .6439, .2689]
    np.testing.assert_allclose(div([2, 1, 0, -1], [0, 2, 1, -1], alpha=1.0, top_k=2)[0], 0.95395,
                               atol=5e-5)


def test_topk_against_float64_numpy_on_random_logits():
    rng = np.random.default_rng(0)
    zs, zt = rng.normal(size=(2, 6, 50)) * 2
    for alpha in (0.0, 0.3, 1.0):
        for tail in (True, False):
            ls, lt = logp(zs), logp(zt)
            idx = np.argsort(-ls, -1)[:, :7]
            pick = lambda lp: np.take_along_axis(lp, idx, -1)
            if tail:
                cut = lambda lp: np.concatenate(
                    [pick(lp), np.log1p(-np.exp(pick(lp)).sum(-1, keepdims=True))], -1)
            else:
                cut = lambda lp: pick(lp) - np.log(np.exp(pick(lp)).sum(-1, keepdims=True))
            p, q = np.exp(cut(ls)), np.exp(cut(lt))
            kl = lambda a, b: np.sum(a * (np.log(a) - np.log(b)), -1)
            m = (1 - alpha) * p + alpha * q
            want = {0.0: kl(q, p), 1.0: kl(p, q)}.get(alpha, alpha * kl(q, m) + (1 - alpha) * kl(p, m))
            np.testing.assert_allclose(div(zs, zt, alpha=alpha, top_k=7, tail=tail), want,
                                       rtol=2e-5, atol=1e-6)


def test_sampled_mode_is_the_reverse_kl_single_sample_gradient():
    rng = np.random.default_rng(1)
    zs, zt = (jnp.asarray(rng.normal(size=(3, 9)), jnp.float32) for _ in range(2))
    tokens = jnp.asarray([1, 4, 8])
    d = TokenDivergence(divergence="sampled", alpha=1.0)
    f = lambda z: jnp.sum(d(jax.nn.log_softmax(z), jax.nn.log_softmax(zt), tokens))
    ls, lt = jax.nn.log_softmax(zs), jax.nn.log_softmax(zt)
    pick = lambda lp: jnp.take_along_axis(lp, tokens[:, None], 1)[:, 0]
    np.testing.assert_allclose(f(zs), jnp.sum((pick(ls) - pick(lt)) * pick(ls)), rtol=1e-6)
    grad_pick = jax.grad(lambda z: jnp.sum(jax.lax.stop_gradient(pick(ls) - pick(lt))
                                           * pick(jax.nn.log_softmax(z))))(zs)
    np.testing.assert_allclose(jax.grad(f)(zs), grad_pick, rtol=1e-6)
    with pytest.raises(ValueError, match="alpha=1.0"):
        TokenDivergence(divergence="sampled", alpha=0.5)
    with pytest.raises(ValueError, match="`divergence` must be one of"):
        TokenDivergence(divergence="kl")


def test_importance_weight_is_detached_clipped_and_masked():
    lp = jnp.asarray([[0.0, -1.0, 5.0]])
    old = jnp.asarray([[-1.0, -1.0, 100.0]])  # padding holds garbage
    mask = jnp.asarray([[1.0, 1.0, 0.0]])
    w, metrics = importance_weight(lp, old, mask, 2.0)
    np.testing.assert_allclose(w, [[2.0, 1.0, 1.0]])
    assert float(metrics["is_clip_frac"][0]) == 1.0 and float(metrics["is_clip_frac"][1]) == 2.0
    assert float(jnp.sum(jax.grad(lambda x: jnp.sum(importance_weight(x, old, mask, 2.0)[0]))(lp))) == 0.0


@pytest.mark.parametrize("name", ["sdpo", "hsd", "h2sd", "opsd"])
def test_rows_without_a_context_leave_every_term(name, models, batch):
    """A failed row with a response (H2SD distils failures only) marked as having no teacher
    context contributes to no distillation term (its mask cleared gives the same distillation
    sums and counts) while the policy term keeps it."""
    method = get_method(name)
    config = method.make_config(top_k=10)
    run = jax.jit(lambda m, r, b: method.loss_fn(m, b, config=config, head=LMHead(chunk_size=20),
                                                 reference=r))
    b = np.shape(batch["targets"])[0]
    row = next(i for i in range(b) if float(batch["rewards"][i]) < 0.5
               and np.asarray(batch["mask"])[i].sum() > 0)
    keep = np.ones(b, np.float32)
    keep[row] = 0.0
    masked = run(*models, dict(batch, teacher_row_mask=keep))
    full = run(*models, dict(batch, teacher_row_mask=np.ones(b, np.float32)))
    cleared = np.asarray(batch["mask"]).copy()
    cleared[row] = 0
    assert cleared.sum() < np.asarray(batch["mask"]).sum()
    reference = run(*models, dict(batch, mask=cleared, teacher_row_mask=np.ones(b, np.float32)))
    d, r, f = masked.terms["distill"], reference.terms["distill"], full.terms["distill"]
    np.testing.assert_allclose(float(d.sum), float(r.sum), rtol=1e-5)
    assert float(d.count) == float(r.count) < float(f.count)
    if "policy" in masked.terms:
        assert float(masked.terms["policy"].count) == float(full.terms["policy"].count)
    if "context_rows" in masked.metrics:
        assert float(masked.metrics["context_rows"][0]) == b - 1


def test_methods_without_a_recipe_refuse_a_row_masked_batch(models, batch):
    b = np.shape(batch["targets"])[0]
    with pytest.raises(ValueError, match="demopsd.*teacher_row_mask"):
        get_method("demopsd").loss_fn(models[0], dict(batch, teacher_row_mask=np.ones(b)),
                                      reference=models[1])


def test_opsd_top_k_loss_renormalises_over_the_teachers_top_k():
    """OPSD's ``top_k_loss``: the teacher's top-2 of S / T (ids 1, 0), both renormalised over
    them: ``p_S = [.7311, .2689]``, ``p_T = [.2689, .7311]`` at ids (0, 1), JSD_0.5 = 0.11094."""
    config = get_method("opsd").make_config(divergence="topk", top_k=2)
    d = config.token_divergence
    got = d(jnp.asarray(logp(S), jnp.float32)[None], jnp.asarray(logp(T), jnp.float32)[None],
            jnp.zeros(1, jnp.int32))
    p, q = np.array([np.e, 1.0]) / (np.e + 1), np.array([1.0, np.e]) / (np.e + 1)
    m = (p + q) / 2
    want = 0.5 * np.sum(q * np.log(q / m)) + 0.5 * np.sum(p * np.log(p / m))
    np.testing.assert_allclose(float(got[0]), want, rtol=1e-5)
    np.testing.assert_allclose(want, 0.11094, atol=5e-5)
    assert get_method("opsd").make_config(divergence="sampled").token_divergence.alpha == 1.0


def test_opsd_token_clip_caps_each_tokens_divergence(models, batch):
    opsd = get_method("opsd")
    run = lambda **kw: opsd.loss_fn(models[0], batch, config=opsd.make_config(**kw),
                                    reference=models[1])
    free, capped = run(), run(token_clip=1e-4)
    d = capped.terms["distill"]
    assert float(free.terms["distill"].sum) > float(d.sum)
    np.testing.assert_allclose(float(d.sum), 1e-4 * float(d.count), rtol=1e-5)
    with pytest.raises(ValueError, match="token_clip"):
        opsd.make_config(token_clip=0.0)


def test_beta_opsd_reproduces_the_spec():
    """§5 (V = T = 3, w = 0.5, gamma = 0.99, student = reference): rho, G and L = 0.37179, the
    arithmetic mix's log p(y), and the loss the method forms from them."""
    import hindsight as hs
    zs = jnp.asarray([[2.0, 0, -1], [0, 1, 0], [1, 1, 1]])
    zt = jnp.asarray([[0.0, 2, -1], [0, 3, 0], [2, 0, 0]])
    y = jnp.asarray([0, 1, 0])
    ls = jax.nn.log_softmax(zs)
    pick = lambda lp: jnp.take_along_axis(lp, y[:, None], 1)[:, 0]
    target = hs.signals.mixture_target(ls, jax.nn.log_softmax(zt), w=0.5)  # log-probs mix as logits
    np.testing.assert_allclose(jnp.exp(target), [[.4683, .4683, .0634], [.1065, .7870, .1065],
                                                 [.5761, .2119, .2119]], atol=5e-5)
    rho = pick(ls) - pick(target)
    np.testing.assert_allclose(rho, [0.5888, -0.3119, -0.5472], atol=5e-5)
    g = hs.signals.return_to_go(rho[None], jnp.ones((1, 3)), gamma=0.99)[0]
    np.testing.assert_allclose(g, [-0.2563, -0.8536, -0.5472], atol=5e-5)
    np.testing.assert_allclose(jnp.mean(g * pick(ls)), 0.37179, atol=5e-5)
    arith = hs.signals.mixture_target(ls, jax.nn.log_softmax(zt), w=0.5, mix="arithmetic")
    np.testing.assert_allclose(pick(arith), [-0.7361, -0.2974, -0.5795], atol=5e-5)


def test_beta_opsd_schedule_state_and_frozen_teacher():
    import configs.beta_opsd
    from hindsight.train.experiment import ConfigError, resolve
    method = get_method("beta_opsd")
    config = method.config
    state = method.init_state(config)
    for _ in range(3):
        state = method.update_state(state, {}, config)
    assert int(state.step) == 3 and float(config.w(state.step)) == pytest.approx(0.5 + 0.3 * 3 / 199)
    xp = configs.beta_opsd.get_config("tiny")
    assert resolve(xp, num_devices=1, process_count=1).reference == "frozen"
    xp.train.reference = "ema"
    with pytest.raises(ConfigError, match="frozen initial policy"):
        resolve(xp, num_devices=1, process_count=1)
    with pytest.raises(ValueError, match="needs its state"):
        method.loss_fn(None, {}, config=config)


def test_cripo_flip_pieces_equal_the_contract_function():
    """``localise`` + ``flip_at`` on gathered log-probs (what the method computes per position
    through the LM head) equal ``flip_advantages`` on full logits."""
    import hindsight as hs
    rng = np.random.default_rng(3)
    zc, zp = (jnp.asarray(rng.normal(size=(4, 5, 6)) * 2, jnp.float32) for _ in range(2))
    tokens = jnp.asarray(rng.integers(0, 6, (4, 5)))
    mask = jnp.asarray(rng.random((4, 5)) < 0.8)
    adv = jnp.asarray([0.5, -0.7, -1.2, 0.0])
    pick = lambda z: jnp.take_along_axis(jax.nn.log_softmax(z), tokens[..., None], -1)[..., 0]
    loc = hs.objectives.localise(pick(zc), pick(zp), jnp.argmax(zp, -1) != tokens)
    np.testing.assert_array_equal(
        hs.objectives.flip_at(adv, loc, mask, tau_flip=0.1),
        hs.objectives.flip_advantages(adv, zc, zp, tokens, mask, tau_flip=0.1))
