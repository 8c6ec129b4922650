"""PhaseClock's engine stepping: engines step in turn, slot occupancy and seconds per engine."""
import collections
import time

from hindsight.rollout.runtime import PhaseClock


class FakeEngine:
    """Rows run one chunk each; ``log`` records (name, rows placed) per step."""

    def __init__(self, name, slots, log, cost=0.0):
        self.name, self.slots, self.log, self.cost = name, slots, log, cost
        self.queue, self.active = [], []
        self.stats = collections.Counter()

    def submit(self, tag):
        self.queue.append(tag)

    @property
    def idle(self):
        return not self.queue and not self.active

    def step(self):
        while self.queue and len(self.active) < self.slots:
            self.active.append(self.queue.pop(0))
        self.log.append((self.name, len(self.active)))
        time.sleep(self.cost)
        self.stats["steps"] += 1
        self.stats["row_steps"] += len(self.active)
        self.stats["slot_steps"] += self.slots
        done, self.active = self.active, []
        return [(t, None) for t in done]


def test_engines_step_in_turn_and_report_occupancy():
    log = []
    a, b = FakeEngine("a", 1, log), FakeEngine("b", 4, log)
    a.submit(0), a.submit(1), b.submit(2)
    clock = PhaseClock()
    clock.run([a, b], lambda *_: None)
    assert log == [("a", 1), ("b", 1), ("a", 1)]
    assert clock.occupancy() == {"a": 1.0, "b": 0.25}


def test_each_engine_time_is_charged_to_the_phases_it_generated():
    """A slow side engine's seconds go to its own phase, not spread over the main engine's by
    token count."""
    log = []
    main, side = FakeEngine("main", 2, log, cost=0.001), FakeEngine("side", 4, log, cost=0.05)
    for i in range(6):
        main.submit(("root", i))
    clock = PhaseClock()

    def on_result(tag, _):
        clock.tokens["roots" if tag[0] == "root" else "reflect"] += 1
        if tag[0] == "root":
            side.submit(("reflect", tag[1]))

    clock.run([main, side], on_result)
    sec = clock.seconds()
    assert clock.tokens == {"roots": 6, "reflect": 6}
    # steps: main 2 rows, side 2 rows, main 2, side 2, main 2, side 2
    assert sec["reflect"] >= 0.15 and sec["roots"] < 0.05
    assert abs(sec["total"] - sec["reflect"] - sec["roots"]) < 1e-9
