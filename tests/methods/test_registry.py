"""Registry, method records and config validation."""
import dataclasses

import pytest

from hindsight.methods import REGISTRY, ROLLOUTS, get_method
from hindsight.batch import CONTEXT_NAMES

NAMES = ["grpo", "dapo", "drgrpo", "hdl", "pcsd", "craft", "opsd", "opsd_pmi", "demopsd", "rlsd",
         "sdpo", "hsd", "h2sd", "beta_opsd", "cripo", "sft", "gkd", "neuron_opsd",
         "recoverability", "seed"]


def test_registry_holds_every_method():
    assert sorted(REGISTRY) == sorted(NAMES)
    for name in NAMES:
        m = get_method(name)
        assert m.name == name and m.rollout in ROLLOUTS and m.paper
        assert set(m.contexts) <= set(CONTEXT_NAMES)
        assert dataclasses.is_dataclass(m.config)
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.config.temperature = 2.0


def test_unknown_method_lists_registry():
    with pytest.raises(KeyError, match=r"unknown method 'ppo'.*'craft'.*'grpo'"):
        get_method("ppo")


def test_spec_defaults():
    assert get_method("grpo").config.eps_high == 0.2 and get_method("grpo").config.kl_coef == 0.0
    assert get_method("dapo").config.eps_high == 0.28 and get_method("dapo").rollout == "dynamic"
    assert get_method("drgrpo").config.advantage_scale == "none"
    hdl = get_method("hdl").config
    assert (hdl.tail_guard, hdl.counts, hdl.group_size, hdl.baseline) == (8, (4, 3), 16, "flat")
    assert get_method("hdl").rollout == "hdl_tree"
    pcsd = get_method("pcsd").config
    assert (pcsd.lam, pcsd.loss, pcsd.beta_gate, pcsd.n_max) == (0.01, "nll", 5.0, 8)
    craft = get_method("craft").config
    assert (craft.lambda_0, craft.mu_0, craft.theta_kl) == (0.01, 0.001, 0.1)
    assert get_method("craft").init_state is not None
    rlsd = get_method("rlsd").config
    assert (rlsd.eps_w, rlsd.lam_0, rlsd.lam_steps, rlsd.teacher) == (0.2, 0.5, 50, "self")
    assert [float(rlsd.lam(s)) for s in (0, 25, 50, 80)] == [0.5, 0.25, 0.0, 0.0]
    opsd = get_method("opsd").config
    assert (opsd.beta, opsd.temperature) == (0.5, 1.1)
    assert get_method("opsd_pmi").contexts == ("teacher", "probe")
    demo = get_method("demopsd").config
    assert (demo.alpha_max, demo.beta) == (0.15, 25.0)
    sdpo = get_method("sdpo").config
    assert (sdpo.divergence, sdpo.alpha, sdpo.top_k, sdpo.tail, sdpo.is_clip, sdpo.teacher) == (
        "topk", 0.5, 100, True, 2.0, "reference")
    assert sdpo.teacher_context == ("successful_peer|feedback",)
    hsd = get_method("hsd").config
    assert (hsd.lam_hsd, hsd.top_k, hsd.teacher_context) == (
        0.1, 100, ("random_successful_peer", "reference"))
    h2sd = get_method("h2sd").config
    assert (h2sd.eps_w, h2sd.gamma, h2sd.teacher_context) == (0.2, 1.0, ("own_success|hint",))
    beta = get_method("beta_opsd").config
    assert (beta.w_start, beta.w_end, beta.w_steps, beta.gamma, beta.mix, beta.anchor) == (
        0.5, 0.8, 200, 0.99, "geometric", "student")
    assert [round(float(beta.w(k)), 4) for k in (0, 100, 199, 300)] == [0.5, 0.6508, 0.8, 0.8]
    cripo = get_method("cripo").config
    assert (cripo.lam_inj, cripo.share, cripo.tau_flip, cripo.teacher_context) == (
        0.1, 0.95, 0.1, ("criteria",))
    nopsd = get_method("neuron_opsd").config
    assert (nopsd.neurons_per_layer, nopsd.num_neurons, nopsd.select_fraction, nopsd.num_shots,
            nopsd.teacher, nopsd.teacher_context) == (2000, 5000, 0.2, 10, "reference",
                                                      ("few_shot",))
    assert get_method("neuron_opsd").prepare == "neuron_selection"
    rec = get_method("recoverability")
    assert (rec.config.branches, rec.config.recoverable_min, rec.config.irreversible_max,
            rec.config.rollback_min, rec.config.retain_weight, rec.config.rollback_weight,
            rec.config.teacher, rec.config.teacher_context) == (
        4, 0.5, 0.25, 0.5, 1.0, 1.0, "self", ("reference",))
    assert rec.rollout == "recoverability" and rec.extra_rows(rec.config) == 2
    seed = get_method("seed")
    assert (seed.config.beta, seed.config.lambda_opd, seed.config.teacher,
            seed.config.teacher_context, seed.rollout) == (5.0, 0.01, "self", ("skill",), "group")


def test_make_config_and_validation():
    m = get_method("pcsd")
    assert m.make_config(lam=0.5).lam == 0.5
    with pytest.raises(TypeError, match=r"no option\(s\) \['lamda'\].*'lam'"):
        m.make_config(lamda=0.5)
    with pytest.raises(ValueError, match="`loss` must be one of"):
        m.make_config(loss="kl")
    with pytest.raises(ValueError, match="norm"):
        get_method("grpo").make_config(mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="eps_low"):
        get_method("dapo").make_config(eps_low=1.5)
    with pytest.raises(ValueError, match="temperature"):
        get_method("opsd").make_config(temperature=0.0)
    with pytest.raises(ValueError, match="counts"):
        get_method("hdl").make_config(counts=(4, 3, 2))
    with pytest.raises(ValueError, match="`cti` must be a bool"):
        get_method("craft").make_config(cti=1)


def test_needs_reference():
    assert not get_method("grpo").config.needs_reference
    assert get_method("grpo").make_config(kl_coef=1e-3).needs_reference
    assert get_method("opsd").config.needs_reference
    assert not get_method("opsd").make_config(teacher="self").needs_reference
    assert get_method("craft").config.needs_reference
    assert get_method("opsd_pmi").config.needs_reference


def test_sdpo_and_demopsd_configs_default_to_sdpos_ema_teacher():
    """SDPO's teacher (and DemoPSD's, inherited) is an EMA of the policy at rate 0.05."""
    import configs.demopsd
    import configs.sdpo
    from hindsight.train.experiment import resolve
    for module in (configs.sdpo, configs.demopsd):
        xp = resolve(module.get_config("tiny"), num_devices=1, process_count=1)
        assert (xp.reference, xp.config.train.ema_decay) == ("ema", 0.95)


def test_neuron_opsd_config_sets_the_ema_teacher_at_tau_001():
    """Neuron-OPSD's teacher is an EMA of the student, theta_bar <- 0.99 theta_bar + 0.01 theta."""
    import configs.neuron_opsd
    from hindsight.train.experiment import resolve
    xp = resolve(configs.neuron_opsd.get_config("tiny"), num_devices=1, process_count=1)
    assert (xp.reference, xp.config.train.ema_decay) == ("ema", 0.99)


def test_opsd_pmi_refuses_a_moving_base():
    """OPSD-PMI's base P0 is the frozen initial policy: an EMA reference is refused up front."""
    import configs.opsd_pmi
    from hindsight.train.experiment import ConfigError, resolve
    config = configs.opsd_pmi.get_config("tiny")
    assert resolve(config, num_devices=1, process_count=1).reference == "frozen"
    config.train.reference = "ema"
    with pytest.raises(ConfigError, match="opsd_pmi.*frozen initial policy.*'ema'"):
        resolve(config, num_devices=1, process_count=1)
    assert get_method("opsd_pmi").config.target_temperature == 1.0
