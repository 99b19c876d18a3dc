"""The task schedule of semi-online RL (docs/method.md §6, eq. 6.5): which expert episodes a
training step rolls out, and the refill rounds of dynamic sampling (DAPO: a task whose rollouts
all agree carries no signal; advantage.dynamic_sampling_tasks drops it, a refill round draws its
replacement). Every draw is a pure function of (seed, step,
slot), so all ranks, any world size and a resumed run agree without exchanging episodes; the one
collective is TaskDraw.keep's all-reduce. Tests: tests/test_train_schedule.py.
"""
import hashlib

import numpy as np

from utils import all_sum


def _perm_stream(key: tuple, start: int, n: int, n_episodes: int) -> list[int]:
    """Positions [start, start + n) of the concatenated permutations of range(n_episodes), the
    e-th seeded with (*key, e)."""
    out, pos = [], start
    while len(out) < n:
        epoch, i = divmod(pos, n_episodes)
        perm = np.random.default_rng([*key, epoch]).permutation(n_episodes)
        take = perm[i:i + n - len(out)].tolist()
        out += take
        pos += len(take)
    return out


def step_tasks(seed: int, step: int, round_: int, n: int, n_episodes: int, batch_size: int,
               offset: int = 0) -> list[int]:
    """Episode indices of the n tasks drawn, all ranks together, at (step, refill round).
    Round 0: positions [s, s + n), s = step * batch_size, of an epoch stream (one seeded permutation
    per epoch: an episode may repeat across an epoch's edge). Refills continue the step's draw
    without replacement: positions [offset, offset + n) (offset: what earlier refills drew) of a
    permutation seeded with (seed, step) of the episodes round 0 did not draw, then fresh
    permutations of all. Raises ValueError on a negative seed/step/round/offset or no episodes."""
    if min(seed, step, round_, offset) < 0 or n_episodes < 1:
        raise ValueError(f"step_tasks: seed {seed}, step {step}, round {round_}, offset {offset} "
                         f"must be >= 0 and n_episodes {n_episodes} >= 1")
    if round_ == 0:
        return _perm_stream((seed,), step * batch_size, n, n_episodes)
    first = set(_perm_stream((seed,), step * batch_size, batch_size, n_episodes))
    rest = [e for e in range(n_episodes) if e not in first]
    # tags 2 and 3 keep these seeds apart from round 0's [seed, epoch] (numpy's SeedSequence ignores
    # trailing zeros: [s, t, 0] would seed like [s, t])
    rest = [rest[i] for i in np.random.default_rng([seed, step, 2]).permutation(len(rest)).tolist()]
    out = rest[offset:offset + n]
    if len(out) < n:  # the pool is exhausted: every episode again, in fresh permutations
        out += _perm_stream((seed, step, 3), max(0, offset - len(rest)), n - len(out), n_episodes)
    return out


def stable_seed(*key) -> int:
    """A sampling seed from `key` (numbers, strings, tuples), the same in every process (no Python
    hash randomisation): the task seeds here, the prompt seeds of the rollout driver."""
    h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF


def task_seed(seed: int, step: int, slot: int) -> int:
    """The sampling seed of global slot `slot` of `step` (slots count the step's tasks across
    refill rounds)."""
    return stable_seed("task", seed, step, slot)


class TaskDraw:
    """The tasks of one training step under dynamic sampling: round 0 draws batch_size tasks; each
    round's keep decision is made global (keep), the next round draws the missing number, for at
    most max_rounds rounds; a batch still short is trained on and flagged `partial`. Slot s
    (counted across rounds) holds episode slot_episode[s]; rank r rolls out every world_size-th
    slot of a round. proc: utils.Dist. Used as train_semionline.draw_batch does:
    `while (drawn := draw.next_round()) is not None: ... kept = draw.keep(keep)`."""

    def __init__(self, seed: int, step: int, n_episodes: int, batch_size: int, max_rounds: int,
                 proc):
        self.seed, self.step, self.n_episodes, self.batch_size = seed, step, n_episodes, batch_size
        self.max_rounds, self.proc = max_rounds, proc
        self.slot_episode: dict[int, int] = {}
        self.tried = self.kept = self.rounds = 0
        self._slots: list[int] = []  # the current round's global slots

    def next_round(self) -> tuple[list[int], list[int]] | None:
        """(this rank's slots, their episodes) of the next round; None once full or max_rounds."""
        if self.kept >= self.batch_size or self.rounds >= self.max_rounds:
            return None
        need = self.batch_size - self.kept
        self._slots = list(range(self.tried, self.tried + need))
        # refills continue the step's draw without replacement, from where the last round stopped
        drawn = step_tasks(self.seed, self.step, self.rounds, need, self.n_episodes,
                           self.batch_size, offset=max(0, self.tried - self.batch_size))
        self.slot_episode.update(zip(self._slots, drawn))
        mine = self._slots[self.proc.rank::self.proc.world_size]
        return mine, [self.slot_episode[s] for s in mine]

    def keep(self, keep) -> set[int]:
        """This rank's kept slots -> the round's kept slots over all ranks (collective). Raises
        RuntimeError for a slot that is not this rank's in this round."""
        keep, mine = set(keep), set(self._slots[self.proc.rank::self.proc.world_size])
        if not keep <= mine:
            raise RuntimeError(f"kept slots {sorted(keep - mine)} were not this rank's")
        flags = [1.0 if s in keep else 0.0 for s in self._slots]  # 1 = kept, summed over ranks
        kept = {s for s, f in zip(self._slots, all_sum(flags, self.proc)) if f > 0}
        self.tried, self.kept = self.tried + len(self._slots), self.kept + len(kept)
        self.rounds += 1
        return kept

    def info(self) -> dict:
        """The step's draw for its metrics: rounds, tasks_tried, tasks_kept (global), partial."""
        return {"rounds": self.rounds, "tasks_tried": self.tried, "tasks_kept": self.kept,
                "partial": self.kept < self.batch_size}
