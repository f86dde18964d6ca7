"""The heads a cycle leaves out: those it cannot start whatever it does before their turn, and whose stored
reason already names what stops them (planning.plan_cycle's `reasons`).

A head that holds no room, whose class may not preempt, whose queue may not reclaim (it is not below its
guarantee), that may not reserve room now (it has not waited long enough, or every cluster it could
reserve is reserved), and that is over a maximum of its queue or that placement would put on no cluster
it sees (it fits none, or its pods do not pack), waits at its turn and changes nothing. When its stored
reason already says what stops it (a maximum of the same queue, room held for the same job, or no room), the
cycle leaves it out and keeps that reason, whose figures are those of the cycle that wrote it; the other
heads go in the same order without it: a queue's heads come in key order, and a wait changes no share
(but for a queue whose heads' classes differ in weight, which divides its share in the key: it keeps
every head).
Every change the plan makes (a place, a preemption, a hold made, moved or given up) is followed by asking
the heads left out again, against the plan as it stands then, which is the state each of them would meet
at its turn; if one of them might start, the cycle is planned again leaving none out (Replan): the two
plans agree up to there. So a plan that leaves heads out makes the same places, preemptions and holds as
one that does not, and the reason of every head it leaves out says what stopped it at the cycle's start.
"""
from __future__ import annotations

from collections.abc import Callable

from dispatcher.policy.held import HELD_BACK, HeldView, held_back, reservation_cluster, unpaid
from dispatcher.policy.placing import NO_FIT, NO_MATCH, Clusters, Place, QueuedJob, may_fit, shape_key
from dispatcher.policy.plans import Candidate, ClassPolicy, CyclePlan, class_weight, may_reserve
from dispatcher.policy.quotas import OVER_MAX, QuotaTree

NO_ROOM = (NO_FIT, NO_MATCH)  # the reasons of a head no cluster has room for
MAY_STAND = (*NO_ROOM, OVER_MAX, HELD_BACK)  # how every reason that may stand begins


class Replan(Exception):
    """What the plan did before a left-out head's turn may let that head start: plan the cycle again,
    leaving none out."""


class OutOfReach:
    """The heads of one plan left out of its order (above), and the check that they stay out of reach.
    `reasons`: the heads' reasons as stored (a head without one always takes its turn)."""

    def __init__(self, tree: QuotaTree, state: Clusters, views: HeldView, classes: dict[str, ClassPolicy],
                 out: CyclePlan, now: float, reasons: dict[int, str]):
        self._tree, self._state, self._views, self._classes = tree, state, views, classes
        self._out, self._now, self._reasons = out, now, reasons
        self._left: dict[tuple, Candidate] = {}  # one head per kind left out (_asker): all of a kind answer alike
        self._mark = out.mark()

    def leave_out(self, heads: dict[str, list[Candidate]]) -> dict[str, list[Candidate]]:
        """The heads that take their turn in the plan; the rest are left out."""
        kept: dict[str, list[Candidate]] = {}
        verdict, reasons, left, classes = self._asker(), self._reasons, self._left, self._classes
        holds = self._out.holds
        for queue, candidates in heads.items():
            # A head's class weight divides its queue's share in the order's key, so a queue's key may drop
            # when a head of a lighter class has had its turn: leaving that head out would bring the heads
            # behind it forward, past other queues'. Such a queue keeps all its heads.
            if len({class_weight(c, classes) for c in candidates}) > 1:
                kept[queue] = candidates
                continue
            mine = []
            for c in candidates:
                job = c.job
                reason = reasons.get(job.id)
                if not reason or not reason.startswith(MAY_STAND) or job.id in holds:
                    mine.append(c)
                    continue
                kind = (*shape_key(job), queue, c.service_class, may_reserve(c, classes))
                stops = verdict(kind, c)
                if stops and reason.startswith(stops):
                    left.setdefault(kind, c)
                else:
                    mine.append(c)
            if mine:
                kept[queue] = mine
        return kept

    def check(self) -> None:
        """After a head's turn: if the plan changed, whether every head left out still cannot start."""
        if not self._left:
            return
        mark = self._out.mark()
        if mark == self._mark:
            return
        self._mark = mark
        verdict = self._asker(why=False)  # whether one might start; not what its reason would say
        if not all(verdict(kind, c) for kind, c in self._left.items()):
            raise Replan

    def _asker(self, why: bool = True) -> Callable[[tuple, Candidate], tuple[str, ...]]:
        """What stops a head of a kind in the plan as it stands now, as the beginnings of the reasons that
        say it (those of the reason made at its turn, up to its figures): a maximum of its queue's path,
        room held for another job, or no room (NO_ROOM); () when it might do anything (then it takes its
        turn). Found once per kind: what the answer depends on, the job's shape (placing.shape_key, its
        first entries), its queue and class, and whether it may reserve room by now (the last entry).
        why=False: NO_ROOM for room held for another job too (no placement is worked out for it)."""
        tree, classes, out, state, views = self._tree, self._classes, self._out, self._state, self._views
        now = self._now
        taken = {h.cluster for h in out.holds.values() if h.kind == "reservation"}
        unpaid_state = list(unpaid(state).values())
        open_to_reserve = {c.name: c for c in unpaid_state if c.name not in taken}
        known: dict[tuple, tuple[str, ...]] = {}

        def starts(job: QueuedJob) -> bool:
            """Whether placement puts the job on a cluster it sees (asked only where the aggregate checks pass)."""
            seen = views.seen_by(out.holds, job, now)
            return any(may_fit(job, cluster) for cluster in seen.values() if not cluster.paid) \
                and isinstance(seen.best(job), Place)

        def verdict(kind: tuple, c: Candidate) -> tuple[str, ...]:
            found = known.get(kind)
            if found is None:
                job, cls = c.job, classes.get(c.service_class)
                if (cls is not None and cls.can_preempt) or tree.below_guarantee(c.queue, job.requests) \
                        or (kind[-1] and reservation_cluster(job, open_to_reserve) is not None):
                    found = ()
                elif over := tree.over_max(c.queue, job.requests):
                    found = (over.split(":", 1)[0] + ":",)
                elif not any(may_fit(job, cluster) for cluster in unpaid_state):  # nor in a view: holds keep room
                    found = NO_ROOM
                elif starts(job):
                    found = ()
                else:
                    held = held_back(job, state, out.holds) if why else None
                    found = (held,) if held else NO_ROOM
                known[kind] = found
            return found
        return verdict
