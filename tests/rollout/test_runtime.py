"""PhaseClock's engine stepping: a batched side engine waits for a full slot batch while the main
engine has queued work, and runs as soon as the main engine has none; slot occupancy per engine."""
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

    @property
    def queued_rows(self):
        return len(self.queue)

    @property
    def active_rows(self):
        return len(self.active)

    def step(self):
        while self.queue and len(self.active) < self.slots:
            self.active.append(self.queue.pop(0))
        self.log.append((self.name, len(self.active)))
        time.sleep(self.cost)
        self.stats["steps"] += 1
        self.stats["row_steps"] += len(self.active)
        done, self.active = self.active, []
        return [(t, None) for t in done]


def test_batched_engine_waits_for_a_full_batch_or_a_starved_main():
    log = []
    main, side = FakeEngine("main", 2, log), FakeEngine("side", 4, log)
    for i in range(6):
        main.submit(("root", i))

    def on_result(tag, _):
        if tag[0] == "root":  # each finished root asks for one side row
            side.submit(("reflect", tag[1]))

    clock = PhaseClock()
    clock.run([main, side], on_result, batched=[side])
    # roots 0-3 finish in main's first two steps; the side engine, 2 then 4 rows pending while
    # main still has queued roots, runs once it has 4 (a full batch); the last 2 rows run when
    # main has nothing queued
    assert log == [("main", 2), ("main", 2), ("side", 4), ("main", 2), ("side", 2)]
    assert main.idle and side.idle
    # main: 6 rows in 3 steps of 2 slots; side: 6 rows in 2 steps of 4 slots
    assert clock.occupancy() == {"main": 1.0, "side": 0.75}


def test_unbatched_engines_step_in_turn():
    log = []
    a, b = FakeEngine("a", 1, log), FakeEngine("b", 4, log)
    a.submit(0), a.submit(1), b.submit(2)
    PhaseClock().run([a, b], lambda *_: None)
    assert log == [("a", 1), ("b", 1), ("a", 1)]


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

    clock.run([main, side], on_result, batched=[side])
    sec = clock.seconds()
    assert clock.tokens == {"roots": 6, "reflect": 6}
    assert sec["reflect"] >= 0.1 and sec["roots"] < 0.05  # 2 side steps vs 3 main steps
    assert abs(sec["total"] - sec["reflect"] - sec["roots"]) < 1e-9
