"""A tiny deterministic text game, written for the tests and the tiny configs (no JVM, steps in
microseconds): find the key, carry it to the chest, open the chest.

Rooms lie on a corridor; the player starts in the first. Rewards: 0.5 for taking the key, 0.5 for
opening the chest (the episode ends); an invalid action changes nothing and says which actions
are valid. The game ends after ``max_steps`` actions. ``snapshot`` / ``restore`` copy the state.
"""
from __future__ import annotations

import copy

from hindsight.envs.base import Step, register_env

ROOMS = ("hall", "kitchen", "library", "garden", "cellar", "attic", "study", "pantry")


def _norm(action: str) -> str:
    return " ".join(action.lower().replace(".", " ").split())


@register_env("textgame")
class TextGame:
    """``setup``: ``{"rooms": [names...], "key": room index, "chest": room index}``."""

    deterministic = True

    def __init__(self, *, max_steps: int = 8):
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"`max_steps` must be a positive int, got {max_steps!r}")
        self.max_steps = max_steps
        self.state = None

    def reset(self, setup: dict) -> str:
        rooms = list(setup["rooms"])
        if len(rooms) < 2 or not all(isinstance(r, str) and r for r in rooms):
            raise ValueError(f"textgame setup needs two or more room names, got {rooms!r}")
        for name in ("key", "chest"):
            if not 0 <= int(setup[name]) < len(rooms):
                raise ValueError(f"textgame setup[{name!r}]={setup[name]!r} is not a room index")
        self.state = dict(rooms=rooms, at=0, key_at=int(setup["key"]), chest=int(setup["chest"]),
                          holding=False, steps=0, done=False)
        return self._look()

    def valid_actions(self) -> list[str]:
        s = self.state
        out = [f"go {s['rooms'][i]}" for i in (s["at"] - 1, s["at"] + 1) if 0 <= i < len(s["rooms"])]
        if not s["holding"] and s["key_at"] == s["at"]:
            out.append("take key")
        if s["chest"] == s["at"]:
            out.append("open chest")
        return out + ["look"]

    def _look(self) -> str:
        s = self.state
        seen = []
        if not s["holding"] and s["key_at"] == s["at"]:
            seen.append("a key")
        if s["chest"] == s["at"]:
            seen.append("a locked chest")
        things = f" You see {' and '.join(seen)}." if seen else ""
        return (f"You are in the {s['rooms'][s['at']]}.{things} "
                f"Valid actions: {', '.join(self.valid_actions())}.")

    def step(self, action: str) -> Step:
        s = self.state
        if s is None or s["done"]:
            raise RuntimeError("step() before reset() or after the episode ended")
        act, valid = _norm(action), self.valid_actions()
        s["steps"] += 1
        reward, text = 0.0, None
        if act not in valid:
            text = (f"Nothing happens: {action.strip()[:60]!r} is not a valid action. "
                    f"Valid actions: {', '.join(valid)}.")
        elif act.startswith("go "):
            s["at"] = s["rooms"].index(act[3:])
        elif act == "take key":
            s["holding"], reward = True, 0.5
            text = "You take the key. " + self._look()
        elif act == "open chest":
            if s["holding"]:
                s["done"], reward = True, 0.5
                text = "You unlock the chest with the key and open it. You win!"
            else:
                text = "The chest is locked; you need the key. " + self._look()
        if text is None:
            text = self._look()
        won = s["done"]
        if not won and s["steps"] >= self.max_steps:
            s["done"] = True
            text += " You are out of moves."
        feedback = ("opened the chest" if won else
                    f"took the key but did not open the chest in {s['steps']} moves" if s["holding"]
                    else f"did not find the key in {s['steps']} moves" if s["done"] else "")
        return Step(text, reward, s["done"], {"feedback": feedback, "valid": self.valid_actions(),
                                              "score": 50 * s["holding"] + 50 * won})

    def snapshot(self) -> dict:
        return copy.deepcopy(self.state)

    def restore(self, state: dict) -> None:
        self.state = copy.deepcopy(state)

    def close(self) -> None:
        self.state = None
