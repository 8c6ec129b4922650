"""An environment that fails on demand, for the pool's failure tests (imported by the workers
through ``EnvSpec.of("faulty", module="tests.envs.faulty")``)."""
import os
import time

from hindsight.envs import Step, register_env


@register_env("faulty")
class Faulty:
    """Actions: ``"crash"`` exits the worker, ``"hang"`` sleeps, ``"raise"`` raises, anything else
    echoes; ``reset({"secret": ...})`` reports whether the worker sees the parent's environment
    variable ``HINDSIGHT_TEST_CANARY``."""
    deterministic = True

    def reset(self, setup):
        self.n = 0
        return f"ready pid={os.getpid()}"

    def step(self, action):
        self.n += 1
        if action == "crash":
            os._exit(7)
        if action == "hang":
            time.sleep(600)
        if action == "raise":
            raise RuntimeError("the environment broke")
        return Step(f"echo {action} {self.n}", reward=0.25, done=action == "stop")

    def close(self):
        pass
