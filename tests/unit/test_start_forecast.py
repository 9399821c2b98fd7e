"""When a waiting job may start and what would start it sooner (jobs.start_forecast), from plain values; and the
promise that every alternative it proposes, applied, is what the dispatcher would start."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.allocation_rule import NodeFact, Request, dry_dispatch
from jobs.start_forecast import AlternativeKind, QueueState, forecast

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
SPEC = 1
POOLS = {None: "the public nodes (no pool)", 10: "the pool a", 20: "the pool b"}


def node(name: str, pool_id: int | None = None, holder: int | None = None, **fields) -> NodeFact:
    return NodeFact(**{"name": name, "spec_id": SPEC, "pool_id": pool_id, "public": pool_id is None, "usable": True,
                       "enabled": True, "holder_id": holder, **fields})


def request(job_id: int, node_count: int = 1, pool_id: int | None = None, hours: int | None = None) -> Request:
    return Request(job_id, SPEC, pool_id, node_count, hours)


def state(queue, nodes, holder_ends, free_slots: int = 8) -> QueueState:
    return QueueState(queue=queue, nodes=nodes, holder_ends=holder_ends, pools=POOLS, free_slots=free_slots, now=NOW)


def test_a_job_behind_held_nodes_is_told_who_holds_them_and_a_range_from_their_auto_stops():
    # Job 1 holds both nodes until 14:00; job 2 (4 h) waits for both, job 3 for one: between 14:00 and 18:00.
    result = forecast(state([request(2, 2, hours=4), request(3, 1, hours=1)],
                            [node("n0", holder=1), node("n1", holder=1)], {1: NOW + timedelta(hours=2)}), 3)
    assert (result.position, result.ahead, result.starts_now, result.never) == (2, 1, False, False)
    assert result.earliest == NOW + timedelta(hours=2) and result.latest == NOW + timedelta(hours=6)
    assert "#1 (2 node(s)) until about" in result.reason and "1 job(s) ahead of it in its queue go first" in result.reason
    assert result.estimate.startswith("between about")


def test_a_job_ahead_without_an_auto_stop_makes_the_start_unknown():
    result = forecast(state([request(2, 2), request(3, 1)], [node("n0", holder=1), node("n1", holder=1)],
                            {1: NOW + timedelta(hours=2)}), 3)
    assert result.latest is None and result.estimate == "unknown: a job it waits on has no auto stop limit"


def test_fewer_nodes_and_another_pool_are_proposed_only_when_they_start_now():
    nodes = [node("a0", pool_id=10), node("a1", pool_id=10, holder=1), node("b0", pool_id=20), node("b1", pool_id=20)]
    result = forecast(state([request(2, 2, pool_id=10)], nodes, {1: NOW + timedelta(hours=3)}), 2)
    kinds = {alternative.kind: alternative for alternative in result.alternatives}
    assert kinds[AlternativeKind.FEWER_NODES].node_count == 1
    assert kinds[AlternativeKind.FEWER_NODES].words == "submitted again with 1 node, it could start now"
    assert kinds[AlternativeKind.OTHER_POOL].pool_id == 20
    assert kinds[AlternativeKind.OTHER_POOL].words == (
        "the pool b has 2 free nodes of this spec: submitted there, it could start now")
    assert AlternativeKind.SHORTER_AUTO_STOP not in kinds  # it is the head: nothing to backfill behind


def test_a_shorter_auto_stop_is_the_longest_that_backfills_before_the_head_can_start():
    # The head (job 2) needs 3 nodes and waits until 15:00 for job 1's; job 3 (no limit) fits on the free two.
    nodes = [node("n0"), node("n1"), node("n2", holder=1)]
    result = forecast(state([request(2, 3, hours=1), request(3, 2)], nodes, {1: NOW + timedelta(hours=3)}), 3)
    [shorter] = [alternative for alternative in result.alternatives if alternative.kind == AlternativeKind.SHORTER_AUTO_STOP]
    assert shorter.auto_stop_hours == 3


def test_a_job_whose_pool_lost_its_nodes_is_told_it_can_never_start_there_and_offered_the_rest():
    nodes = [node("a0", pool_id=10), node("a1", pool_id=10, enabled=False, usable=False), node("b0"), node("b1")]
    result = forecast(state([request(2, 2, pool_id=10)], nodes, {}), 2)
    assert result.never and result.estimate == "never in this pool"
    assert "it can never start in its pool: 1 enabled node(s) of its spec are left, it needs 2" == result.reason
    assert {alternative.kind for alternative in result.alternatives} == {AlternativeKind.FEWER_NODES,
                                                                          AlternativeKind.OTHER_POOL}


def test_a_job_with_free_nodes_starts_now_and_is_offered_nothing():
    result = forecast(state([request(2, 1)], [node("n0")], {}), 2)
    assert result.starts_now and result.alternatives == [] and result.estimate == "now, at the next dispatch"


def test_no_free_run_slot_means_no_alternative_claims_a_start_now():
    result = forecast(state([request(2, 2)], [node("n0"), node("n1", holder=1)], {1: None}, free_slots=0), 2)
    assert not result.starts_now and result.alternatives == []


# A small cluster: nodes of one spec in no pool or two pools, some held, some down; a queue of waiting jobs.
pool_ids = st.sampled_from([None, 10, 20])
nodes_strategy = st.lists(st.tuples(pool_ids, st.sampled_from([None, 100, 101, 102]), st.booleans(), st.booleans()),
                          max_size=7).map(lambda rows: [
                              node(f"n{index}", pool_id=pool, holder=holder, usable=usable, enabled=usable or enabled)
                              for index, (pool, holder, usable, enabled) in enumerate(rows)])
queue_strategy = st.lists(st.tuples(st.integers(1, 4), pool_ids, st.one_of(st.none(), st.integers(1, 6))),
                          min_size=1, max_size=5).map(lambda rows: [
                              request(index + 1, count, pool, hours) for index, (count, pool, hours) in enumerate(rows)])
ends_strategy = st.fixed_dictionaries({holder: st.one_of(st.none(), st.integers(0, 8).map(lambda h: NOW + timedelta(hours=h)))
                                       for holder in (100, 101, 102)})


@settings(max_examples=300, deadline=None)
@given(nodes=nodes_strategy, queue=queue_strategy, ends=ends_strategy, slots=st.integers(0, 3))
def test_every_proposed_alternative_applied_is_started_by_the_dispatch_rule(nodes, queue, ends, slots):
    current = state(queue, nodes, ends, free_slots=slots)
    for entry in queue:
        result = forecast(current, entry.job_id)
        for alternative in result.alternatives:
            changed = replace(entry, node_count=alternative.node_count, pool_id=alternative.pool_id,
                              auto_stop_hours=alternative.auto_stop_hours)
            # A waiting job is not changed but submitted again: last in its queue.
            applied = [other for other in queue if other.job_id != entry.job_id] + [changed]
            assert entry.job_id in dry_dispatch(applied, nodes, ends, NOW, slots)
        assert result.latest is None or result.earliest is None or result.earliest <= result.latest
        assert not (result.starts_now and result.never)
        # The forecast's dry run stops at the job: the jobs after it never change whether it starts.
        whole = dry_dispatch(queue, nodes, ends, NOW, slots)
        assert (entry.job_id in whole) == (entry.job_id in dry_dispatch(queue, nodes, ends, NOW, slots, until=entry.job_id))


def test_a_record_of_no_nodes_ahead_holds_nothing_up_and_times_name_their_zone():
    # A node_count of 0 is refused by the form and the API; a record of one ahead must not make the rest unknown.
    nodes = [node("n0", holder=1), node("n1", holder=1)]
    alone = forecast(state([request(3, 1, hours=1)], nodes, {1: NOW + timedelta(hours=2)}), 3)
    behind = forecast(state([request(2, 0), request(3, 1, hours=1)], nodes, {1: NOW + timedelta(hours=2)}), 3)
    assert behind.latest == alone.latest == NOW + timedelta(hours=2)
    assert alone.estimate.startswith("by about 14:00 UTC")
