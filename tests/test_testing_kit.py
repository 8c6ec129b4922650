"""The researchers' test kit (``hindsight.testing``): every credit signal and teacher-modulated
advantage of the library passes it against its float64 reference (the references of the signal
tests, written independently of the library), and each check catches the fault it exists for."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight as hs
import hindsight.testing as hst
from tests.signals._reference import gather, log_softmax
from tests.signals.test_barycenter import ref_target as ref_barycenter
from tests.signals.test_counterfactual import ref_credit
from tests.signals.test_hindsight_divergence import ref_scores
from tests.signals.test_persistence import ref_stats
from tests.signals.test_pmi import ref_target as ref_pmi

V = 7


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, np.float64)))  # no overflow on garbage
L, M, TOK, ROW = hst.LOGPROBS, hst.MASK, hst.tokens(V), hst.ROW


def _gap(teacher_logits, student_logits, tokens):
    return gather(log_softmax(teacher_logits), tokens) - gather(log_softmax(student_logits), tokens)


def _turns(turn_row, mask_row):
    return sorted({int(k) for k, m in zip(turn_row, mask_row) if m})


def ref_turn_reweighting(teacher_logprobs, student_logprobs, mask, turn_id):
    out = np.zeros(mask.shape)
    for b in range(mask.shape[0]):
        ks = _turns(turn_id[b], mask[b])
        if not ks:
            continue
        sel = [mask[b] & (turn_id[b] == k) for k in ks]
        d = np.array([np.abs(student_logprobs[b] - teacher_logprobs[b])[s].mean() for s in sel])
        h = np.array([(-student_logprobs[b])[s].mean() for s in sel])
        mm = lambda x: np.full_like(x, 0.5) if np.ptp(x) < 1e-8 else (x - x.min()) / np.ptp(x)
        w = 1 - (1 - mm(d)) * (1 - mm(h))
        for i, s in enumerate(sel):
            out[b, s] = w[i]
    return out


def ref_return_to_go(rewards, mask, gamma=0.99, turn_id=None):
    out = np.zeros(mask.shape)
    b_, t_ = mask.shape
    for b in range(b_):
        for t in range(t_):
            if mask[b, t]:
                out[b, t] = sum(gamma ** (s - t) * rewards[b, s] for s in range(t, t_)
                                if mask[b, s] and (turn_id is None or turn_id[b, s] == turn_id[b, t]))
    return out


def ref_rlsd(advantages, teacher_logprobs, student_logprobs, mask, eps_w=0.2, lam=1.0):
    a = advantages[:, None]
    w = np.clip(np.exp(np.clip(np.sign(a) * (teacher_logprobs - student_logprobs), -30, 30)),
                1 - eps_w, 1 + eps_w)
    return np.where(mask, a * ((1 - lam) + lam * w), 0.0)


def ref_topk_tail_kl(teacher_logits, student_logits, mask, top_k=16, min_residual=1e-6):
    q, p = np.exp(log_softmax(teacher_logits)), np.exp(log_softmax(student_logits))
    out = np.zeros(mask.shape)
    for pos in zip(*np.nonzero(mask)):
        ids = np.argsort(-q[pos], kind="stable")[:min(top_k, q.shape[-1])]
        head = (q[pos][ids] * (np.log(q[pos][ids]) - np.log(p[pos][ids]))).sum()
        qr = max(1 - q[pos][ids].sum(), min_residual)
        pr = max(1 - p[pos][ids].sum(), min_residual)
        out[pos] = head + qr * (np.log(qr) - np.log(pr))
    return out


# (name, function, reference, inputs, kwargs, stop_gradient, group_size)
CASES = [
    ("hindsight_divergence", hs.signals.hindsight_divergence,
     lambda logits, hindsight_logits, tokens, mask: ref_scores(logits, hindsight_logits, tokens,
                                                              mask),
     dict(logits=hst.logits(V), hindsight_logits=hst.logits(V), tokens=TOK, mask=M), {},
     ("logits", "hindsight_logits"), 1),
    ("persistence_gate", hs.signals.persistence_gate,
     lambda teacher_logits, student_logits, tokens, mask: np.where(
         mask, ref_stats(_gap(teacher_logits, student_logits, tokens), mask)[6], 0.0),
     dict(teacher_logits=hst.logits(V), student_logits=hst.logits(V), tokens=TOK, mask=M), {},
     ("teacher_logits", "student_logits"), 1),
    ("counterfactual_credit", hs.signals.counterfactual_credit,
     lambda teacher_logits, student_logits, tokens, mask, advantages, group_size: ref_credit(
         _gap(teacher_logits, student_logits, tokens), mask, advantages, group_size),
     dict(teacher_logits=hst.logits(V), student_logits=hst.logits(V), tokens=TOK, mask=M,
          advantages=ROW), dict(group_size=3), ("teacher_logits", "student_logits"), 3),
    ("pmi_target", hs.signals.pmi_target,
     lambda teacher_logits, probe_logits, base_logits: ref_pmi(
         log_softmax(teacher_logits), log_softmax(probe_logits), log_softmax(base_logits)),
     dict(teacher_logits=hst.logits(V), probe_logits=hst.logits(V), base_logits=hst.logits(V)),
     {}, ("teacher_logits", "probe_logits", "base_logits"), 1),
    ("barycenter_target", hs.signals.barycenter_target,
     lambda teacher_logits, student_logits: ref_barycenter(log_softmax(teacher_logits),
                                                           log_softmax(student_logits)),
     dict(teacher_logits=hst.logits(V), student_logits=hst.logits(V)), {},
     ("teacher_logits", "student_logits"), 1),
    ("skill_shift_gate", hs.signals.skill_shift_gate,
     lambda skill_logprobs, ordinary_logprobs, mask, beta: np.where(
         mask, sigmoid(beta * (skill_logprobs - ordinary_logprobs)), 0.0),
     dict(skill_logprobs=L, ordinary_logprobs=L, mask=M), dict(beta=3.0),
     ("skill_logprobs", "ordinary_logprobs"), 1),
    ("turn_reweighting", hs.signals.turn_reweighting, ref_turn_reweighting,
     dict(teacher_logprobs=L, student_logprobs=L, mask=M, turn_id=hst.TURN_ID), {},
     ("teacher_logprobs", "student_logprobs"), 1),
    ("return_to_go", hs.signals.return_to_go, ref_return_to_go,
     dict(rewards=hst.VALUES, mask=M, turn_id=hst.TURN_ID), dict(gamma=0.9), (), 1),
    ("topk_tail_kl", hs.signals.topk_tail_kl, ref_topk_tail_kl,
     dict(teacher_logits=hst.logits(V), student_logits=hst.logits(V), mask=M), dict(top_k=3),
     ("teacher_logits",), 1),
    ("rlsd_advantages", hs.objectives.rlsd_advantages, ref_rlsd,
     dict(advantages=ROW, teacher_logprobs=L, student_logprobs=L, mask=M),
     dict(eps_w=0.2, lam=0.7), ("advantages", "teacher_logprobs", "student_logprobs"), 1),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_library_signal_passes_the_kit(case):
    _, fn, ref, inputs, kwargs, stop, group = case
    hst.check_signal(fn, ref, inputs=inputs, kwargs=kwargs, stop_gradient=stop,
                     group_size=group, atol=2e-5, rtol=2e-5)


def _gate(teacher_logprobs, student_logprobs, mask, *, beta=5.0):
    g = jax.nn.sigmoid(beta * (jax.lax.stop_gradient(teacher_logprobs) - student_logprobs))
    return jnp.where(mask, g, 0.0)


def _gate_ref(teacher_logprobs, student_logprobs, mask, *, beta=5.0):
    return np.where(mask, sigmoid(beta * (teacher_logprobs - student_logprobs)), 0.0)


GATE = dict(teacher_logprobs=L, student_logprobs=L, mask=M)


def test_the_readme_example_passes():
    hst.check_signal(_gate, _gate_ref, inputs=GATE, kwargs=dict(beta=2.0),
                     stop_gradient=("teacher_logprobs",))


@pytest.mark.parametrize("bug,check", [
    (lambda lt, ls, mask, beta=5.0: jax.nn.sigmoid(beta * (lt - ls)) * mask, "stop_gradient"),
    (lambda lt, ls, mask, beta=5.0: _gate(lt, ls, mask, beta=beta) * 1.01, "reference"),
    # a log of log-probs: NaN everywhere it is taken, masked positions included
    (lambda lt, ls, mask, beta=5.0: _gate(lt, ls, mask, beta=beta) + 0 * jnp.log(ls), "finite"),
    # normalised over the row's length including padding: padding changes the value
    (lambda lt, ls, mask, beta=5.0: _gate(lt, ls, mask, beta=beta) / ls.shape[1] * 10,
     "padding"),
    # normalised over the batch: rows are not independent
    (lambda lt, ls, mask, beta=5.0: _gate(lt, ls, mask, beta=beta)
     / jnp.maximum(jnp.sum(mask), 1) * 50, "microbatch"),
], ids=["missing_stop_gradient", "wrong_value", "nan", "padding_dependent", "batch_dependent"])
def test_each_check_catches_its_fault(bug, check):
    fn = lambda teacher_logprobs, student_logprobs, mask, beta=5.0: bug(
        teacher_logprobs, student_logprobs, mask, beta)
    with pytest.raises(AssertionError, match=f"check '{check}'"):
        hst.check_signal(fn, _gate_ref if check in ("reference",) else None, inputs=GATE,
                         stop_gradient=("teacher_logprobs",),
                         checks=(check,) if check != "finite" else ("finite", "gradients"))


def test_mask_patterns_hold_what_they_say():
    for pattern in hst.MASK_PATTERNS:
        mask, turn = hst.layout(pattern)
        assert not mask[0].any()  # every pattern: an all-masked row
        assert (turn[~mask] == -1).all() and (turn[mask] >= 0).all()
    mask, _ = hst.layout("one_token_row")
    assert mask[1].sum() == 1
    mask, _ = hst.layout("holes")
    assert any(np.any(np.diff(r.astype(int)) == 1) for r in mask)  # a hole followed by tokens
    mask, turn = hst.layout("multi_turn")
    row = turn[3][mask[3]]
    assert len(set(row)) > 1 and np.any(np.diff(np.unique(row)) > 1)  # turns, skipped ids
    x = hst.draw(GATE, "holes")
    assert (x["student_logprobs"][~x["mask"]] <= 0).all() and x["student_logprobs"].min() < -10
    with pytest.raises(ValueError, match="pattern"):
        hst.layout("ragged")
    with pytest.raises(ValueError, match="stop_gradient"):
        hst.check_signal(_gate, None, inputs=GATE, stop_gradient=("teacher",))
