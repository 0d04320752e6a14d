"""What the parts of one coordinator loop share: the jobs it drives, and the one way to move them.

A ``DrivenJob`` is a job whose lease this coordinator holds. ``Loop`` holds what every part (lease
keeper, cancel server, submitter, outcome handler) works with, and is the only writer of a driven
job's state: every move is the edge's guarded transition, fenced by the lease epoch, and a
``Reaction`` (``coordinator.lifecycle.reactions``) is applied here with what it must do in the same
transaction (withdraw the published archives, or require evidence of them).

A terminal move also ends the lease (in its guarded statement) and settles the job's archive records
in its transaction (``coordinator.service.cleanup.settle_all_within``, reusing the evidence a
finalising move read): one transaction ends the job instead of three. The settlement runs in a
savepoint, so that a failure of it never costs the job its move: the records are then settled
after the move, as before, or by the sweep. Only an outage (a MariaDB deadlock rolls the whole
transaction back) fails the move, which the next tick retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from coordinator import metrics
from coordinator.config.clp import CompressionCoordinator
from coordinator.lifecycle import (
    UNPUBLISHED,
    Actor,
    JobStatus,
    Reaction,
    Trigger,
)
from coordinator.service.cleanup import Ending, Settlement, settle_all_within
from coordinator.service.logs import LOOP_LOGGER, job_fields
from coordinator.spider.port import JobState, SpiderPort
from coordinator.store.archives import withdraw_archives
from coordinator.store.database import is_transient, retrying_deadlocks
from coordinator.store.evidence import (
    PublicationEvidence,
    publication_gap,
    read_publications,
    recorded_sizes,
)
from coordinator.store.guarded import (
    Applied,
    LostRace,
    TransitionRequest,
    TransitionResult,
    validate_request,
)
from coordinator.store.jobs import Effects, JobStore, count_committed
from coordinator.store.polling_reads import PollingReads

_log = logging.getLogger(LOOP_LOGGER)


@dataclass
class DrivenJob:
    """A job this coordinator holds the lease of."""

    job_id: int
    epoch: int
    status: JobStatus
    spider_id: int | None
    dataset: str
    clp_config: bytes
    backoff_ms: int
    next_poll: float = 0.0
    cancel_seen: JobState | None = None
    """The Spider state the last cancel attempt left (for the log only: a cancel counts as
    delivered when Spider reports Cancelled, and the persisted request is served until then)."""
    retry_submit_at: float = 0.0
    failed_attempts: int = 0
    """Attempts that failed with an error that is not an outage (bounded by ``max_attempts``)."""
    cancel_requested: bool = False
    """The claim found an operator's cancel request on the row: the job is killed, not submitted
    (a request made later is served by ``CancelServer`` or refused by the ``submitted`` move's
    guard)."""
    settled: Settlement | None = None
    """The settlement of the job's archive records made inside its terminal move's transaction;
    its files are removed after the move (``OutcomeHandler.clean_up``); ``None``: not settled."""

    def log(self) -> dict[str, object]:
        return job_fields(self.job_id, self.spider_id)


Clock = Callable[[], float]
"""A monotonic clock in seconds (``time.monotonic``; tests inject their own)."""

Driven = dict[int, DrivenJob]
"""The jobs a coordinator drives, by job id (shared by the loop's parts)."""

_Moves = list[tuple[DrivenJob, TransitionRequest, TransitionResult]]
"""Finalising moves taken in one transaction, with their results."""


@dataclass(frozen=True)
class Loop:
    """One coordinator's loop: its collaborators, its driven jobs, and the moves it makes."""

    store: JobStore
    spider: SpiderPort
    settings: CompressionCoordinator
    instance_id: str
    """The lease owner's name, recorded as the actor of every move."""
    cleanup_task: bool
    """Whether the task graphs carry ``compression::cleanup``, which makes CancelJob safe in
    CommitReady; CLP's own task package (on a Spider cluster) has no such task."""
    monotonic: Clock
    """The loop's clock for schedules and back-offs (rows are stamped by the store's clock)."""
    driven: Driven = field(default_factory=dict)

    @property
    def engine(self) -> Engine:
        return self.store.engine

    @cached_property
    def reads(self) -> PollingReads:
        """The reads made every polling interval, on a connection of their own (the loop
        thread's alone; ``Coordinator.run`` closes it)."""
        return PollingReads(self.store.engine)

    def move(
        self,
        job: DrivenJob,
        trigger: Trigger,
        target: JobStatus,
        reason: str,
        effects: Effects | None = None,
    ) -> TransitionResult:
        """Move ``job`` from its known state to ``target`` by ``trigger``, fenced by its lease.

        A terminal move ends the lease (in its UPDATE) and settles the archive records in its own
        transaction; a terminal move or a lost race stops driving the job. Raises what
        ``JobStore.transition`` raises (``effects``' exceptions roll the move back).
        """
        if target.is_terminal:
            effects = _ending(job, effects)
        result = self.store.transition(self._request(job, trigger, target, reason), effects=effects)
        self._moved(job, trigger, target, reason, result)
        return result

    def finalise_or_unpublish(self, jobs: Sequence[tuple[DrivenJob, Reaction]]) -> None:
        """``finalise`` the jobs; each whose publication has a gap then takes ``UNPUBLISHED`` on
        its own, what is missing in its ``status_msg``. No job is driven afterwards. Raises what
        ``finalise`` and ``react`` raise."""
        for job, gap in self.finalise(jobs):
            _log.warning("not finalised: %s", gap, extra=job.log())
            self.react(job, UNPUBLISHED, error=gap)

    def finalise(self, jobs: Sequence[tuple[DrivenJob, Reaction]]) -> list[tuple[DrivenJob, str]]:
        """Take each job's move on evidence (``reaction.on_evidence``: Committed → Succeeded), all
        in one transaction; the jobs whose publication has a gap, with what is missing.

        The jobs' evidence is read first, together (``read_publications``, ``recorded_sizes``), and
        each job's move taken only without a gap: its own guarded transition fenced by its lease
        (whose UPDATE ends the lease), with its history row (the moves' rows in one statement,
        ``JobStore.apply_together``) and settlement (as ``move`` takes it), so one job's gap or
        lost race leaves the others' moves alone. Every job is no longer driven
        afterwards, except those returned (the caller reacts to their gap).
        A transaction MariaDB picks as a deadlock's victim runs again (``retrying_deadlocks``).
        Raises what ``JobStore.apply`` raises, and the evidence's errors: the whole transaction is
        then rolled back and no job has moved.
        """
        if not jobs:
            return []
        moves = []
        for job, reaction in jobs:
            assert reaction.on_evidence and reaction.trigger and reaction.target
            message = reaction.status_msg(spider_id=job.spider_id)
            request = self._request(job, reaction.trigger, reaction.target, message)
            validate_request(request)  # before BEGIN: a refused request must not take a lock
            moves.append((job, request))

        def finalise_all() -> tuple[list[tuple[DrivenJob, str]], _Moves]:
            gaps: list[tuple[DrivenJob, str]] = []
            results: _Moves = []
            ended: list[_Ended] = []
            with self.engine.begin() as connection:
                evidence = read_publications(
                    connection, [(j.job_id, j.spider_id) for j, _ in moves]
                )
                recorded = recorded_sizes(connection, [job.job_id for job, _ in moves])
                proven: list[tuple[DrivenJob, TransitionRequest, PublicationEvidence]] = []
                for job, request in moves:
                    publication = evidence[job.job_id]
                    gap = publication_gap(publication, recorded.get(job.job_id))
                    if gap is None:
                        proven.append((job, request, publication))
                    else:
                        gaps.append((job, gap))
                applied = self.store.apply_together(connection, [move for _, move, _ in proven])
                for (job, request, publication), result in zip(proven, applied, strict=True):
                    if isinstance(result, Applied):
                        ended.append(_Ended(job, result, publication))
                    results.append((job, request, result))
                _settle_all(connection, ended)  # the moves' last effect, one savepoint for all
            return gaps, results

        gaps, results = retrying_deadlocks(finalise_all)
        for job, request, result in results:
            count_committed(request, result)
            self._moved(job, request.trigger, request.target, request.reason, result)
        return gaps

    def _request(
        self, job: DrivenJob, trigger: Trigger, target: JobStatus, reason: str
    ) -> TransitionRequest:
        """The move of ``job`` from its known state, fenced by its lease, by this coordinator."""
        return TransitionRequest(
            job.job_id,
            trigger,
            job.status,
            target,
            Actor.COORDINATOR,
            reason=reason,
            actor_id=self.instance_id,
            spider_id=job.spider_id,
            fence=job.epoch,
        )

    def _moved(
        self,
        job: DrivenJob,
        trigger: Trigger,
        target: JobStatus,
        reason: str,
        result: TransitionResult,
    ) -> None:
        """After a move's transaction: the job's new state, the log line, and whether it is still
        driven (not after a terminal move or a lost race)."""
        if isinstance(result, Applied):
            job.status = target
            _log.info("%s → %s: %s", trigger, target.label, reason, extra=job.log())
        elif isinstance(result, LostRace):
            _log.info("lost a race: %s", result.describe(), extra=job.log())
        if target.is_terminal or not isinstance(result, Applied):
            self.driven.pop(job.job_id, None)

    def react(
        self, job: DrivenJob, reaction: Reaction, **fields: object
    ) -> TransitionResult | None:
        """Take ``reaction``'s move from the job's state, with its message's ``fields``; the
        move's result (``None`` for no move or a move on evidence).

        A withdrawing move deletes the published archive rows in its own transaction; a move on
        evidence is taken only when the job's archives are found published in its transaction,
        else ``UNPUBLISHED`` is taken instead (what is missing in ``status_msg``). No move: the job
        is no longer driven.
        """
        if reaction.trigger is None or reaction.target is None:
            self.driven.pop(job.job_id, None)
            return None
        message = reaction.status_msg(spider_id=job.spider_id, **fields)
        if reaction.on_evidence:
            self.finalise_or_unpublish([(job, reaction)])
            return None
        if not reaction.withdraws:
            return self.move(job, reaction.trigger, reaction.target, message)
        withdrawn: list[int] = []
        result = self.move(
            job, reaction.trigger, reaction.target, message, self._withdraw(job, withdrawn)
        )
        if isinstance(result, Applied):
            metrics.ROLLBACKS.labels(reaction.target.name.lower()).inc()
            metrics.ARCHIVES_WITHDRAWN.labels("rollback").inc(sum(withdrawn))
        return result

    @staticmethod
    def _withdraw(job: DrivenJob, counts: list[int]) -> Effects:
        """The effects of a rollback's move; each run appends how many rows it withdrew."""
        assert job.spider_id is not None
        job_id, spider_id = job.job_id, job.spider_id

        def withdraw(connection: Connection, _: Applied) -> None:
            withdrawn = withdraw_archives(connection, job_id, spider_id)
            counts.append(len(withdrawn))
            _log.info("rolled back %d published archive(s)", len(withdrawn), extra=job.log())

        return withdraw


@dataclass(frozen=True)
class _Ended:
    """A job a terminal move just ended, in the move's transaction: what ``_settle_all`` needs."""

    job: DrivenJob
    applied: Applied
    publication: PublicationEvidence | None = None
    """The evidence a finalising move read in this transaction, reused by the settlement."""


def _ending(job: DrivenJob, effects: Effects | None) -> Effects:
    """``effects``, then the settlement of ``job``'s archive records (``_settle_all``), as the
    effects of a terminal move. Its lease ends in the move's own statement
    (``coordinator.store.guarded``)."""

    def end(connection: Connection, applied: Applied) -> None:
        if effects is not None:
            effects(connection, applied)
        _settle_all(connection, [_Ended(job, applied)])

    return end


def _settle_all(connection: Connection, ended: Sequence[_Ended]) -> None:
    """Settle the archive records of the jobs terminal moves just ended, in one savepoint of
    the moves' transaction; sets each ``job.settled``.

    A failure that is not an outage rolls back the savepoint only (logged; every one of these
    jobs' records is then settled after the moves instead, ``OutcomeHandler.clean_up``); an
    outage is raised, and with it the moves are rolled back.
    """
    submitted = [item for item in ended if item.job.spider_id is not None]
    for item in ended:
        item.job.settled = None  # never submitted: no task stored anything for it
    if not submitted:
        return
    try:
        with connection.begin_nested():
            endings = [
                Ending(
                    item.job.job_id, item.applied.edge.dest, item.job.spider_id, item.publication
                )
                for item in submitted
            ]
            settlements = settle_all_within(connection, endings)
            for item, settlement in zip(submitted, settlements, strict=True):
                item.job.settled = settlement
    except Exception as error:
        if isinstance(error, SQLAlchemyError) and is_transient(error):
            raise
        for item in submitted:
            item.job.settled = None
        _log.exception(
            "settling the archives in the move failed; done after it (job(s) %s)",
            ", ".join(str(item.job.job_id) for item in submitted),
            extra=submitted[0].job.log() if len(submitted) == 1 else {},
        )
