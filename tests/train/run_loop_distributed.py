"""Child process ``PROCESS_ID PROCESSES PORT OUT_DIR [--steps=N] METHOD...`` of the multi-process
loop tests:
runs :func:`hindsight.train.loop.run` on each method's documented tiny config (one CPU device
per process; ``PROCESSES=1`` is the single-process reference, without ``jax.distributed``) in
``OUT_DIR/<processes>/<method>``, and saves what this process sampled at every step (its rows'
prompt and response tokens, per-group generated tokens) to
``OUT_DIR/<processes>/<method>-p<id>.npz``. Prints one JSON line: per method, the run's
``process_generated_tokens``, ``final_step``, its evaluations and ``stop_signal``. ``--steps``
sets ``train.num_steps`` (the preemption test runs many and stops them with SIGTERM).
"""
import importlib
import json
import sys

import numpy as np

import hindsight.train.loop as loop


def _recording(store: list):
    """``loop.rollout_step`` that also keeps this process's rows of each step."""
    original = loop.rollout_step

    def rollout_step(*args, **kwargs):
        batch, stats = original(*args, **kwargs)
        attention = np.asarray(batch["attention_mask"]) > 0
        store.append(dict(
            prompts=[np.asarray(batch["tokens"])[b][attention[b]].tolist()
                     for b in range(attention.shape[0])],
            targets=np.asarray(batch["targets"]), mask=np.asarray(batch["mask"]),
            group_tokens=np.asarray(stats.generated_tokens)))
        return batch, stats
    return rollout_step


def main():
    pid, processes, port, out_dir = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                     sys.argv[4])
    rest = sys.argv[5:]
    steps = int(rest.pop(0).split("=", 1)[1]) if rest[0].startswith("--steps=") else None
    report = {}
    for method in rest:
        config = importlib.import_module(f"configs.{method}").get_config("tiny")
        config.eval.num_examples = 4   # split between the processes
        if steps is not None:
            config.train.update(num_steps=steps, save_every=steps)
        if processes > 1:
            config.distributed.update(coordinator_address=f"127.0.0.1:{port}",
                                      num_processes=processes, process_id=pid,
                                      initialization_timeout=120)
        store = []
        loop.rollout_step = _recording(store)
        summary = loop.run(config, f"{out_dir}/{processes}/{method}", progress=False)
        np.savez(f"{out_dir}/{processes}/{method}-p{pid}.npz",
                 targets=np.stack([s["targets"] for s in store]),
                 mask=np.stack([s["mask"] for s in store]),
                 group_tokens=np.stack([s["group_tokens"] for s in store]),
                 prompts=np.array(json.dumps([s["prompts"] for s in store])))
        report[method] = dict(tokens=summary["process_generated_tokens"],
                              final_step=summary["final_step"],
                              eval=[e[1] for e in summary["eval_reward"]],
                              stop_signal=summary["stop_signal"])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
