"""The launcher as a user runs it: ``python -m experiments.run --config=configs/<m>.py:variant``
with command-line overrides; a wrong key fails before anything runs."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_launch_with_overrides_writes_the_run_directory(tmp_path):
    workdir = str(tmp_path / "run")
    out = _launch("--config=configs/grpo.py:tiny", f"--workdir={workdir}", "--noprogress",
                  "--config.train.num_steps=1", "--config.eval.num_examples=2",
                  "--config.train.optim.learning_rate=0.05")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["final_step"] == 1
    with open(os.path.join(workdir, "config.json")) as f:
        resolved = json.load(f)
    assert resolved["train"]["optim"]["learning_rate"] == 0.05
    assert resolved["model"]["name"] == "tiny-random" and resolved["train"]["num_steps"] == 1
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    assert [x["step"] for x in lines] == [0, 1] and "eval_reward" in lines[0]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "1"))
    assert "verify_wait_seconds" in lines[1] and lines[1]["verify_worker_seconds"] > 0
    # a fresh process traces the rollout's programs (its sampling params are not the greedy
    # evaluation's): part of the first rollout's seconds, and said so
    assert 0 < lines[1]["rollout_compile_seconds"] <= lines[1]["rollout_seconds"]
    # the evaluation command on that checkpoint: greedy pass@1 and sampled pass@k, JSON last
    out = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "--config=configs/grpo.py:tiny",
         f"--checkpoint={workdir}", f"--output={tmp_path / 'eval'}", "--noprogress",
         "--config.eval.num_examples=3", "--config.eval.num_samples=4"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["num_problems"] == 3 and set(result["pass@k"]) == {"1", "2", "4"}
    assert result["model"] == f"{workdir} (step 1)" and result["seconds"] > 0
    with open(tmp_path / "eval" / "results.json") as f:
        saved = json.load(f)
    assert len(saved["problems"]) == 3 and saved["pass@1"] == result["pass@1"]
    assert (tmp_path / "eval" / "results.md").read_text().startswith("# even_length (test split)")
    # the saved responses checked again under the current verifier: the same verdicts
    out = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "--config=configs/grpo.py:tiny",
         f"--rescore={tmp_path / 'eval' / 'results.json'}", "--config.eval.num_examples=3"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    again = json.loads(out.stdout.strip().splitlines()[-1])
    assert again["pass@1"] == again["saved_pass@1"] == result["pass@1"] and again["changed"] == []
    assert (tmp_path / "eval-rescored" / "results.json").exists()


def test_wrong_key_and_missing_workdir_fail_fast(tmp_path):
    out = _launch("--config=configs/grpo.py:tiny", f"--workdir={tmp_path}",
                  "--config.train.optim.learning_rat=1e-5", timeout=120)
    # one line, the whole dotted key and the closest known one
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "config error: unknown key 'train.optim.learning_rat' (--config.train.optim.learning_rat)"
        "; did you mean 'train.optim.learning_rate'?"]
    out = _launch("--config=configs/grpo.py:tiny", timeout=120)
    assert out.returncode != 0 and "workdir" in out.stderr
    out = _launch("--config=configs/grpo.py:nonsense", f"--workdir={tmp_path}", timeout=120)
    assert out.returncode != 0 and "unknown config variant 'nonsense'" in out.stderr


def test_config_json_follows_the_command_line_for_derived_keys(tmp_path):
    """Overrides of the rollout reach the method options derived from it (DAPO's overlong
    window) in the resolved config.json."""
    workdir = tmp_path / "run"
    out = _launch("--config=configs/dapo.py:tiny", f"--workdir={workdir}", "--noprogress",
                  "--config.train.num_steps=1", "--config.rollout.max_new_tokens=20",
                  "--config.eval.num_examples=0")
    assert out.returncode == 0, out.stderr[-3000:]
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["rollout"]["max_new_tokens"] == 20
    assert (saved["method_config"]["max_response_length"],
            saved["method_config"]["overlong_buffer"]) == (20, 4)


def test_sigterm_checkpoints_and_exits_zero(tmp_path):
    """What a scheduler's preemption sends: the run stops at the next step boundary with a
    checkpoint, exits 0, and resumes from it."""
    import signal
    import time
    workdir = tmp_path / "run"
    args = ["--config=configs/grpo.py:tiny", f"--workdir={workdir}", "--noprogress",
            "--config.train.num_steps=50", "--config.train.save_every=100",
            "--config.eval.num_examples=0"]
    proc = subprocess.Popen([sys.executable, "-m", "experiments.run", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["interrupted"] and result["stop_signal"] == "SIGTERM"
    assert 1 <= result["final_step"] < 50 and "SIGTERM: stopping" in stdout + stderr
    saved = sorted(int(s) for s in os.listdir(workdir / "checkpoints"))
    assert max(saved) == result["final_step"]
    out = _launch(*args[:-3], "--config.train.num_steps=" + str(result["final_step"] + 1),
                  "--config.train.save_every=100", "--config.eval.num_examples=0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["final_step"] == result["final_step"] + 1


def test_nonfinite_training_exits_non_zero(tmp_path):
    out = _launch("--config=configs/grpo.py:tiny", f"--workdir={tmp_path / 'run'}", "--noprogress",
                  "--config.train.num_steps=4", "--config.eval.num_examples=0",
                  "--config.train.optim.learning_rate=1e30")
    assert out.returncode == 3 and "not finite" in out.stderr, out.stderr[-3000:]
