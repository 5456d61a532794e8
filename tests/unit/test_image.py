"""MetadataImage / MetadataDelta: replay rules, O(changed) sharing, local changes, checksums."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid

import msgpack
import pytest

from kraft.metadata.delta import MetadataDelta, ReplayError
from kraft.metadata.image import MetadataImage
from kraft.metadata.partition_map import PartitionMap
from kraft.metadata.registrations import PartitionRegistration
from kraft.metadata.replay import image_from_records
from kraft.records import (
    FENCE,
    FENCE_UNCHANGED,
    LEADER_NONE,
    LEADER_UNCHANGED,
    RECOVERED,
    RECOVERING,
    RECOVERY_UNCHANGED,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    UNFENCE,
    ZERO_HASH,
    Batch,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    LeaderChangeRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Provenance,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    batch_hash,
)

T1 = str(uuid.UUID(int=1))
T2 = str(uuid.UUID(int=2))
T3 = str(uuid.UUID(int=3))
ENDPOINTS = (
    {"name": "PLAINTEXT", "host": "localhost", "port": 9092, "security_protocol": "PLAINTEXT"},
)


def register(broker_id, epoch, fenced=True, rack=None, incarnation=None, shutdown=False):
    return RegisterBrokerRecord(
        broker_id,
        incarnation or str(uuid.UUID(int=1000 + broker_id)),
        epoch,
        ENDPOINTS,
        (),
        rack,
        fenced,
        shutdown,
    )


def partition(tid, pid, replicas, leader=None, isr=None, leader_epoch=0, partition_epoch=0):
    replicas = tuple(replicas)
    leader = replicas[0] if leader is None else leader
    return PartitionRecord(
        pid,
        tid,
        replicas,
        tuple(replicas if isr is None else isr),
        (),
        (),
        leader,
        RECOVERED,
        leader_epoch,
        partition_epoch,
    )


def change(
    tid,
    pid,
    *,
    isr=None,
    leader=LEADER_UNCHANGED,
    replicas=None,
    recovery=RECOVERY_UNCHANGED,
    election=None,
):
    return PartitionChangeRecord(
        pid,
        tid,
        None if isr is None else tuple(isr),
        leader,
        None if replicas is None else tuple(replicas),
        None,
        None,
        recovery,
        election,
    )


def build(*records, image=MetadataImage.EMPTY) -> MetadataImage:
    delta = MetadataDelta(image)
    for r in records:
        delta.replay(r)
    return delta.apply()


def base_image() -> MetadataImage:
    """3 brokers (1, 2 unfenced; 3 fenced), topics a (2 partitions) and b (1 partition)."""
    return build(
        FeatureLevelRecord("metadata.version", 1),
        register(1, 10, fenced=False, rack="r1"),
        register(2, 11, fenced=False, rack="r2"),
        register(3, 12, fenced=True, rack="r3"),
        TopicRecord("a", T1),
        partition(T1, 0, [1, 2]),
        partition(T1, 1, [2, 3]),
        TopicRecord("b", T2),
        partition(T2, 0, [3, 1], leader=3),
        ConfigRecord(RESOURCE_TOPIC, "a", "retention.ms", "1000"),
    )


# ---- registrations ----------------------------------------------------------------------------


def test_partition_merge_bumps_epochs():
    reg = PartitionRegistration((1, 2, 3), (1, 2, 3), (), (), 1, RECOVERED, 4, 7)
    isr_only = reg.merge(change(T1, 0, isr=[1, 2]))
    assert (isr_only.isr, isr_only.leader, isr_only.leader_epoch, isr_only.partition_epoch) == (
        (1, 2),
        1,
        4,
        8,
    )
    same_leader = reg.merge(change(T1, 0, leader=1))
    assert (same_leader.leader, same_leader.leader_epoch, same_leader.partition_epoch) == (1, 5, 8)
    none = reg.merge(change(T1, 0, leader=LEADER_NONE, recovery=RECOVERING))
    assert (none.leader, none.leader_epoch, none.leader_recovery_state) == (
        LEADER_NONE,
        5,
        RECOVERING,
    )
    moved = reg.merge(change(T1, 0, replicas=[3, 2, 1]))
    assert moved.replicas == (3, 2, 1) and moved.isr == (1, 2, 3)


def test_registrations_are_frozen():
    reg = PartitionRegistration((1,), (1,), (), (), 1, 0, 0, 0)
    with pytest.raises(AttributeError):
        reg.leader = 2  # type: ignore[misc]  # deliberately mutating an immutable value
    assert reg._replace(leader=5).leader == 5
    assert reg == PartitionRegistration((1,), (1,), (), (), 1, 0, 0, 0)
    # a registration is its fields in order: a snapshot row's tail, and what a digest packs
    row = (7, "t", (1,), (1,), (), (), 1, 0, 0, 0)
    assert (
        PartitionRegistration(*row[2:])
        == reg
        == PartitionRegistration.from_record(PartitionRecord(*row))
    )
    assert reg.to_record("t", 7) == PartitionRecord(*row)
    assert hash(reg) == hash(PartitionRegistration((1,), (1,), (), (), 1, 0, 0, 0))


# ---- replay of every record type -------------------------------------------------------------


def test_register_broker_and_change_records():
    image = build(register(1, 5))
    b = image.brokers[1]
    assert (b.epoch, b.fenced, b.in_controlled_shutdown, b.endpoints) == (5, True, False, ENDPOINTS)
    image = build(BrokerRegistrationChangeRecord(1, 5, UNFENCE, 0), image=image)
    assert image.brokers[1].fenced is False
    assert [x.broker_id for x in image.active_brokers()] == [1]
    image = build(BrokerRegistrationChangeRecord(1, 5, FENCE_UNCHANGED, 1), image=image)
    assert image.brokers[1].in_controlled_shutdown and not image.brokers[1].fenced
    assert image.active_brokers() == []
    image = build(BrokerRegistrationChangeRecord(1, 5, FENCE, 0), image=image)
    assert image.brokers[1].fenced and image.brokers[1].in_controlled_shutdown
    # a new registration replaces everything, including the shutdown state
    image = build(register(1, 9, fenced=True), image=image)
    assert (image.brokers[1].epoch, image.brokers[1].in_controlled_shutdown) == (9, False)


def test_broker_change_with_wrong_epoch_or_unknown_broker_fails():
    image = build(register(1, 5))
    with pytest.raises(ReplayError, match="epoch"):
        build(BrokerRegistrationChangeRecord(1, 4, UNFENCE, 0), image=image)
    with pytest.raises(ReplayError, match="not registered"):
        build(BrokerRegistrationChangeRecord(2, 5, UNFENCE, 0), image=image)
    with pytest.raises(ReplayError, match="fenced"):
        build(BrokerRegistrationChangeRecord(1, 5, 7, 0), image=image)


def test_unregister_broker():
    image = build(register(1, 5), register(2, 6))
    image2 = build(UnregisterBrokerRecord(1, 5), image=image)
    assert sorted(image2.brokers) == [2]
    assert image2.brokers[2] is image.brokers[2]
    with pytest.raises(ReplayError):
        build(UnregisterBrokerRecord(1, 5), image=image2)
    with pytest.raises(ReplayError):
        build(UnregisterBrokerRecord(2, 99), image=image2)


def test_topic_and_partition_records():
    image = base_image()
    a = image.topic("a")
    assert a is not None and a.topic_id == T1 and sorted(a.partitions) == [0, 1]
    assert image.partition(T1, 1).replicas == (2, 3)
    assert image.partition(T1, 5) is None and image.partition(T3, 0) is None
    assert image.topic("zzz") is None
    assert image.partition_count() == 3
    # PartitionRecord replaces an existing partition
    image2 = build(partition(T1, 0, [2, 1], leader_epoch=3, partition_epoch=4), image=image)
    assert image2.partition(T1, 0).replicas == (2, 1) and image2.partition(T1, 0).leader_epoch == 3


def test_duplicate_topic_name_or_id_fails():
    image = base_image()
    with pytest.raises(ReplayError, match="name"):
        build(TopicRecord("a", T3), image=image)
    with pytest.raises(ReplayError, match="id"):
        build(TopicRecord("c", T1), image=image)
    with pytest.raises(ReplayError):
        build(TopicRecord("c", T3), TopicRecord("c", str(uuid.uuid4())))


def test_partition_records_need_a_known_topic_and_partition():
    image = base_image()
    with pytest.raises(ReplayError, match="unknown topic"):
        build(partition(T3, 0, [1]), image=image)
    with pytest.raises(ReplayError, match="unknown partition"):
        build(change(T1, 7, isr=[1]), image=image)
    with pytest.raises(ReplayError, match="unknown topic"):
        build(change(T3, 0, isr=[1]), image=image)


def test_partition_change_record():
    image = base_image()
    image2 = build(change(T1, 0, isr=[1], leader=1, election="clean"), image=image)
    p = image2.partition(T1, 0)
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1,), 1, 1, 1)
    # a change in the same delta as the PartitionRecord that created the partition
    image3 = build(
        TopicRecord("c", T3),
        partition(T3, 0, [1, 2]),
        change(T3, 0, isr=[1]),
        change(T3, 0, leader=2),
        image=image,
    )
    p = image3.partition(T3, 0)
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1,), 2, 1, 2)


def test_remove_topic_removes_partitions_and_configs():
    image = base_image()
    assert image.config(RESOURCE_TOPIC, "a") == {"retention.ms": "1000"}
    image2 = build(RemoveTopicRecord(T1), image=image)
    assert image2.topic("a") is None and T1 not in image2.topics_by_id
    assert image2.config(RESOURCE_TOPIC, "a") == {}
    assert (RESOURCE_TOPIC, "a") not in image2.configs
    assert image2.partition_count() == 1
    with pytest.raises(ReplayError):
        build(RemoveTopicRecord(T1), image=image2)
    # the name can be reused, even in the same delta
    image3 = build(RemoveTopicRecord(T1), TopicRecord("a", T3), partition(T3, 0, [1]), image=image)
    assert image3.topic("a").topic_id == T3 and T1 not in image3.topics_by_id
    # create and delete in one delta leaves nothing behind
    image4 = build(TopicRecord("c", T3), partition(T3, 0, [1]), RemoveTopicRecord(T3), image=image)
    assert image4.topic("c") is None and T3 not in image4.topics_by_id


def test_config_records():
    image = build(
        ConfigRecord(RESOURCE_BROKER, "", "log.retention.ms", "5"),
        ConfigRecord(RESOURCE_BROKER, "1", "a", "x"),
        ConfigRecord(RESOURCE_BROKER, "1", "b", "y"),
    )
    assert image.config(RESOURCE_BROKER, "") == {"log.retention.ms": "5"}
    image2 = build(ConfigRecord(RESOURCE_BROKER, "1", "a", None), image=image)
    assert image2.config(RESOURCE_BROKER, "1") == {"b": "y"}
    assert image.config(RESOURCE_BROKER, "1") == {"a": "x", "b": "y"}  # old image untouched
    image3 = build(ConfigRecord(RESOURCE_BROKER, "1", "b", None), image=image2)
    assert (RESOURCE_BROKER, "1") not in image3.configs
    # deleting a missing key is harmless
    build(ConfigRecord(RESOURCE_BROKER, "9", "nope", None), image=image3)


def test_feature_producer_ids_leader_change_noop():
    image = build(
        FeatureLevelRecord("metadata.version", 3),
        FeatureLevelRecord("x", 2),
        ProducerIdsRecord(1, 5, 1000),
        LeaderChangeRecord(2, 7),
        NoOpRecord(),
    )
    assert image.features == {"metadata.version": 3, "x": 2}
    assert image.next_producer_id == 1000 and image.controller_id == 2
    image2 = build(FeatureLevelRecord("x", 0), ProducerIdsRecord(1, 5, 2000), image=image)
    assert image2.features == {"metadata.version": 3} and image2.next_producer_id == 2000
    with pytest.raises(ReplayError, match="advance"):
        build(ProducerIdsRecord(1, 5, 2000), image=image2)


# ---- batches -------------------------------------------------------------------------------------


def make_batch(image: MetadataImage, *records, term=3, raft_index=17, ts=12345) -> Batch:
    return Batch(
        image.offset + 1,
        term,
        raft_index,
        ts,
        Provenance(api="Test"),
        image.last_hash,
        tuple(records),
    )


def test_replay_batch_adopts_position_and_hash():
    delta = MetadataDelta(MetadataImage.EMPTY)
    b1 = make_batch(MetadataImage.EMPTY, FeatureLevelRecord("metadata.version", 1), register(1, 1))
    delta.replay_batch(b1)
    assert delta.offset == 1
    h1 = batch_hash(b1.encode())
    b2 = Batch(2, 4, 18, 999, Provenance(), h1, (NoOpRecord(),))
    delta.replay_batch(b2, batch_hash_bytes=b"\x01" * 32)
    image = delta.apply()
    assert (image.offset, image.term, image.raft_index, image.timestamp_ms, image.last_hash) == (
        2,
        4,
        18,
        999,
        b"\x01" * 32,
    )
    assert image.next_offset == 3


def test_replay_batch_refuses_gaps_wrong_hash_and_names_the_offset():
    image = build(register(1, 1))  # offset -1 still (no batch)
    with pytest.raises(ReplayError, match="does not follow"):
        MetadataDelta(image).replay_batch(
            Batch(5, 1, 1, 0, Provenance(), ZERO_HASH, (NoOpRecord(),))
        )
    with pytest.raises(ReplayError, match="prev_hash"):
        MetadataDelta(image).replay_batch(
            Batch(0, 1, 1, 0, Provenance(), b"\x02" * 32, (NoOpRecord(),))
        )
    bad = make_batch(image, NoOpRecord(), BrokerRegistrationChangeRecord(1, 99, UNFENCE, 0))
    with pytest.raises(ReplayError, match="^offset 1: "):
        MetadataDelta(image).replay_batch(bad)


def test_replay_batch_sees_a_topic_removed_between_two_of_its_partition_changes():
    image = base_image()
    batch = make_batch(
        image,
        change(T1, 0, isr=[1]),
        change(T1, 1, isr=[2]),
        RemoveTopicRecord(T1),
        change(T1, 0, isr=[2]),
    )
    with pytest.raises(ReplayError, match="unknown topic id"):
        MetadataDelta(image).replay_batch(batch)
    batch = make_batch(
        image,
        change(T1, 0, isr=[1]),
        RemoveTopicRecord(T1),
        TopicRecord("a", T3),
        partition(T3, 0, [1]),
        change(T3, 0, isr=[1]),
        change(T1, 1, isr=[2]),
    )
    with pytest.raises(ReplayError, match="unknown topic id"):
        MetadataDelta(image).replay_batch(batch)
    batch = make_batch(
        image, change(T1, 0, isr=[1]), change(T2, 0, isr=[1]), change(T1, 1, isr=[3])
    )
    delta = MetadataDelta(image)
    delta.replay_batch(batch)
    after = delta.apply()
    assert (after.partition(T1, 0).isr, after.partition(T1, 1).isr, after.partition(T2, 0).isr) == (
        (1,),
        (3,),
        (1,),
    )


# ---- O(changed) sharing ---------------------------------------------------------------------------


def test_apply_shares_unchanged_objects():
    image = base_image()
    image2 = build(change(T1, 0, isr=[1]), image=image)
    assert image2.topics_by_id[T2] is image.topics_by_id[T2]
    assert image2.topics_by_id[T1] is not image.topics_by_id[T1]
    assert image2.topics_by_id[T1].partitions[1] is image.topics_by_id[T1].partitions[1]
    assert image2.brokers is image.brokers and image2.configs is image.configs
    assert image2.features is image.features
    image3 = build(register(2, 20), image=image2)
    assert image3.topics_by_id is image2.topics_by_id
    assert image3.brokers[1] is image2.brokers[1]
    # the old image is untouched
    assert image.partition(T1, 0).isr == (1, 2)


def test_sorted_topic_names_are_shared_until_a_topic_comes_or_goes():
    image = build(TopicRecord("c", T3), partition(T3, 0, [1]), image=base_image())
    names = image.topic_names()
    assert names == ("a", "b", "c") and image.topic_names() is names
    changed = build(change(T1, 0, isr=[1]), image=image)
    assert changed.topic_names() is names
    removed = build(RemoveTopicRecord(T2), image=changed)
    assert removed.topic_names() == ("a", "c")
    recreated = build(TopicRecord("b", str(uuid.UUID(int=99))), image=removed)
    assert recreated.topic_names() == ("a", "b", "c") and recreated.topic_names() is not names


def test_partition_map_chunks():
    regs = {pid: PartitionRegistration((pid,), (pid,), (), (), pid, 0, 0, 0) for pid in range(5000)}
    pm = PartitionMap.of(regs)
    assert len(pm) == 5000 and list(pm) == list(range(5000)) and dict(pm.items()) == regs
    assert 4999 in pm and 5000 not in pm and "x" not in pm and pm.get(7000) is None
    new = PartitionRegistration((9,), (9,), (), (), 9, 0, 1, 1)
    pm2 = pm.updated({3000: new, 7000: new, 1: new})
    assert len(pm2) == 5001 and pm2[3000] is new and pm2[7000] is new and pm2[1] is new
    assert pm[3000] is regs[3000] and len(pm) == 5000
    assert pm2._chunks[4] is pm._chunks[4]  # untouched chunk shared
    assert pm == regs and pm2 != pm
    with pytest.raises(KeyError):
        pm[123456]


def test_big_topic_change_copies_only_its_chunk():
    records = [TopicRecord("big", T1)] + [partition(T1, p, [1, 2]) for p in range(20000)]
    image = build(*records)
    image2 = build(change(T1, 12345, isr=[1]), image=image)
    old, new = image.topics_by_id[T1].partitions, image2.topics_by_id[T1].partitions
    assert new[12345].isr == (1,) and old[12345].isr == (1, 2)
    shared = sum(1 for ci in old._chunks if old._chunks[ci] is new._chunks[ci])
    assert shared == len(old._chunks) - 1


# ---- delta introspection and local changes -------------------------------------------------------


def test_delta_introspection():
    image = base_image()
    delta = MetadataDelta(image)
    for r in (
        change(T1, 0, isr=[1]),
        RemoveTopicRecord(T2),
        TopicRecord("c", T3),
        partition(T3, 0, [1]),
        partition(T3, 1, [2]),
        register(4, 40),
        ConfigRecord(RESOURCE_BROKER, "", "k", "v"),
        FeatureLevelRecord("f", 1),
    ):
        delta.replay(r)
    assert delta.created_topics == {T3}
    assert set(delta.deleted_topics) == {T2} and delta.deleted_topics[T2] is image.topics_by_id[T2]
    assert delta.changed_partitions == {T1: {0}, T3: {0, 1}}
    assert delta.changed_brokers == {4}
    assert delta.changed_configs == {(RESOURCE_BROKER, "")}
    assert delta.changed_features == {"f"}


def test_local_changes():
    image = base_image()  # a-0 [1,2] leader 1; a-1 [2,3] leader 2; b-0 [3,1] leader 3
    delta = MetadataDelta(image)
    for r in (
        change(T1, 0, leader=2, election="clean"),  # broker 1 becomes follower of a-0
        change(T1, 1, replicas=[2, 1], isr=[2, 1]),  # broker 1 joins a-1 as follower
        RemoveTopicRecord(T2),  # b deleted
        TopicRecord("c", T3),
        partition(T3, 0, [1, 2]),
        partition(T3, 1, [2, 3]),
    ):
        delta.replay(r)
    lc = delta.local_changes(1)
    assert lc.deletes == [("b", T2, 0)]
    assert set(lc.leaders) == {("c", 0)}
    assert lc.leaders[("c", 0)][0] == T3
    assert set(lc.followers) == {("a", 0), ("a", 1)}
    assert lc.followers[("a", 0)] == (T1, delta.apply().partition(T1, 0))
    lc3 = delta.local_changes(3)
    assert lc3.deletes == [("a", T1, 1), ("b", T2, 0)]
    assert set(lc3.followers) == {("c", 1)} and lc3.leaders == {}


def test_local_changes_leader_and_unchanged_partitions():
    image = base_image()
    image = build(change(T1, 0, isr=[1]), image=image)  # a-0 epoch 1
    delta = MetadataDelta(image)
    delta.replay(change(T1, 0, isr=[1, 2]))
    lc = delta.local_changes(1)
    assert set(lc.leaders) == {("a", 0)} and lc.followers == {} and lc.deletes == []
    # a PartitionRecord that repeats the same partition epoch is no change for the broker
    delta = MetadataDelta(image)
    delta.replay(dataclasses.replace(image.partition(T1, 0).to_record(T1, 0)))
    assert delta.local_changes(1) == type(lc)([], {}, {})


def test_local_changes_topic_recreated_under_same_name():
    image = base_image()
    delta = MetadataDelta(image)
    for r in (RemoveTopicRecord(T1), TopicRecord("a", T3), partition(T3, 0, [1, 2])):
        delta.replay(r)
    lc = delta.local_changes(1)
    assert lc.deletes == [("a", T1, 0)]
    assert lc.leaders == {("a", 0): (T3, delta.apply().partition(T3, 0))}


# ---- canonical records, checksum, round trip ----------------------------------------------------


def full_image() -> MetadataImage:
    image = base_image()
    delta = MetadataDelta(image)
    delta.replay_batch(
        make_batch(
            image,
            ProducerIdsRecord(1, 10, 1000),
            LeaderChangeRecord(2, 3),
            ConfigRecord(RESOURCE_BROKER, "", "x", "y"),
        )
    )
    return delta.apply()


def test_to_records_canonical_order():
    image = full_image()
    names = [type(r).__name__ for r in image.to_records()]
    assert names == [
        "FeatureLevelRecord",
        "RegisterBrokerRecord",
        "RegisterBrokerRecord",
        "RegisterBrokerRecord",
        "TopicRecord",
        "PartitionRecord",
        "PartitionRecord",
        "TopicRecord",
        "PartitionRecord",
        "ConfigRecord",
        "ConfigRecord",
        "ProducerIdsRecord",
        "LeaderChangeRecord",
    ]
    assert image.record_count() == len(names)
    configs = [
        (r.resource_type, r.resource_name)
        for r in image.to_records()
        if isinstance(r, ConfigRecord)
    ]
    assert configs == sorted(configs)


def test_checksum_matches_the_definition_and_is_stable():
    image = full_image()
    records = image.to_records()
    legacy = hashlib.sha256(
        msgpack.packb([image.offset, [r.to_dict() for r in records]], use_bin_type=True)
    ).hexdigest()
    assert image.checksum(1) == legacy
    assert MetadataImage.EMPTY.checksum(1) == hashlib.sha256(msgpack.packb([-1, []])).hexdigest()
    # version 2: head records, one digest per topic (by name), tail records
    head = [
        r.to_dict() for r in records if isinstance(r, (FeatureLevelRecord, RegisterBrokerRecord))
    ]
    tail = [
        r.to_dict()
        for r in records
        if not isinstance(
            r, (FeatureLevelRecord, RegisterBrokerRecord, TopicRecord, PartitionRecord)
        )
    ]
    digests = []
    for t in (r for r in records if isinstance(r, TopicRecord)):
        parts = [r for r in records if isinstance(r, PartitionRecord) and r.topic_id == t.topic_id]
        body = [
            t.name,
            t.topic_id,
            [r.partition_id for r in parts],
            [
                [
                    r.replicas,
                    r.isr,
                    r.removing_replicas,
                    r.adding_replicas,
                    r.leader,
                    r.leader_recovery_state,
                    r.leader_epoch,
                    r.partition_epoch,
                ]
                for r in parts
            ],
        ]
        digests.append(hashlib.sha256(msgpack.packb(body, use_bin_type=True)).digest())
    expected = hashlib.sha256(
        msgpack.packb([2, image.offset, head, digests, tail], use_bin_type=True)
    ).hexdigest()
    assert image.checksum() == image.checksum(2) == expected
    assert (
        MetadataImage.EMPTY.checksum()
        == hashlib.sha256(msgpack.packb([2, -1, [], [], []])).hexdigest()
    )
    # order of replay does not matter for the checksum; content and offset do
    shuffled = build(
        *reversed(
            [r for r in image.to_records() if not isinstance(r, (TopicRecord, PartitionRecord))]
        ),
        *[r for r in image.to_records() if isinstance(r, (TopicRecord, PartitionRecord))],
    )
    shuffled = dataclasses.replace(shuffled, offset=image.offset, term=image.term)
    assert shuffled.checksum() == image.checksum()
    assert dataclasses.replace(image, offset=image.offset + 1).checksum() != image.checksum()
    assert build(change(T1, 0, isr=[1]), image=image).checksum() != image.checksum()


def test_checksum_after_a_change_rehashes_the_changed_topic_only():
    image = full_image()
    before = image.checksum()  # caches the topic digests on the shared topics
    after = build(change(T1, 0, isr=[1]), image=image)
    assert after.topics_by_id[T2] is image.topics_by_id[T2]  # shared, digest reused
    assert after.topics_by_name is image.topics_by_name  # no topic created or deleted
    fresh = image_from_records(after.to_records(), offset=after.offset, term=after.term)
    assert after.checksum() == fresh.checksum() != before
    assert after.checksum(1) == fresh.checksum(1)
    with pytest.raises(ValueError, match="checksum version 3"):
        image.checksum(3)


@pytest.mark.parametrize("version", [1, 2])
def test_broker_checkpoint_verifies_the_checksum_version_its_format_names(tmp_path, version):
    from broker.metadata.checkpoint import image_from_snapshot
    from kraft.log import CorruptSnapshotError, SnapshotHeader, write_snapshot

    image = full_image()

    def snapshot(checksum: str):
        header = SnapshotHeader(
            end_offset=image.offset + 1,
            term=image.term,
            raft_index=image.raft_index,
            timestamp_ms=image.timestamp_ms,
            last_hash=image.last_hash,
            record_count=image.record_count(),
            image_checksum=checksum,
            format=version,
        )
        return write_snapshot(tmp_path, header, image.iter_records())

    assert image_from_snapshot(snapshot(image.checksum(version))) == image
    with pytest.raises(CorruptSnapshotError, match="image checksum does not match"):
        image_from_snapshot(snapshot(image.checksum(3 - version)))


def test_full_delta_equals_replaying_the_image_records():
    image = full_image()
    replayed = MetadataDelta(MetadataImage.EMPTY)
    for record in image.iter_records():
        replayed.replay(record)
    replayed.set_provenance(
        offset=image.offset,
        term=image.term,
        raft_index=image.raft_index,
        timestamp_ms=image.timestamp_ms,
        last_hash=image.last_hash,
    )
    full = MetadataDelta.full(image)
    assert full.apply() == replayed.apply() == image
    assert full.created_topics == replayed.created_topics
    assert full.changed_partitions == replayed.changed_partitions
    assert full.changed_brokers == replayed.changed_brokers
    assert full.changed_configs == replayed.changed_configs
    assert full.changed_features == replayed.changed_features
    for broker_id in (1, 2, 3):
        assert full.local_changes(broker_id) == replayed.local_changes(broker_id)
    # it goes on like any delta: later batches replay on top of it
    for delta in (full, replayed):
        delta.replay_batch(make_batch(image, change(T1, 0, isr=[1])))
    after = full.apply()
    assert after == replayed.apply() != image
    assert full.changed_partitions == replayed.changed_partitions
    for broker_id in (1, 2, 3):
        assert full.local_changes(broker_id) == replayed.local_changes(broker_id)
    # O(topics): topics nothing changed are the image's own objects (their digests cached too)
    assert all(after.topics_by_id[tid] is t for tid, t in image.topics_by_id.items() if tid != T1)
    assert after.topics_by_id[T1] is not image.topics_by_id[T1]


def test_replay_of_a_decoded_batch_adopts_the_hash_of_its_bytes():
    from kraft.records import decode_batch

    image = base_image()
    encoded = make_batch(image, change(T1, 0, isr=[1])).encode()
    for batch in (decode_batch(encoded), dataclasses.replace(decode_batch(encoded))):
        delta = MetadataDelta(image)
        delta.replay_batch(batch)  # no hash given: the digest, or (replaced) a re-encode
        assert delta.apply().last_hash == batch_hash(encoded)


def test_round_trip_through_records():
    image = full_image()
    copy = image_from_records(
        image.to_records(),
        offset=image.offset,
        term=image.term,
        raft_index=image.raft_index,
        timestamp_ms=image.timestamp_ms,
        last_hash=image.last_hash,
    )
    assert copy == image
    assert copy.checksum() == image.checksum()
    assert copy.to_records() == image.to_records()


def test_replay_batch_partition_records_fast_path():
    image = base_image()
    ok = make_batch(
        image,
        TopicRecord("c", T3),
        partition(T3, 0, [1, 2]),
        partition(T3, 1, [2, 1]),
        partition(T1, 0, [2, 1], leader_epoch=5, partition_epoch=5),
    )
    delta = MetadataDelta(image)
    delta.replay_batch(ok)
    after = delta.apply()
    assert sorted(after.topic("c").partitions) == [0, 1]
    assert after.partition(T1, 0).leader_epoch == 5
    assert delta.changed_partitions == {T3: {0, 1}, T1: {0}}
    bad = make_batch(image, NoOpRecord(), NoOpRecord(), partition(str(uuid.uuid4()), 0, [1]))
    with pytest.raises(ReplayError, match="^offset 2: unknown topic"):
        MetadataDelta(image).replay_batch(bad)


def test_a_topics_leaderless_partitions_are_found_and_cached_per_topic():
    """``TopicImage.leaderless()``: the partitions without a leader, ascending; a topic a later
    image shares answers from its cache, a changed topic is a new object and looks again."""
    image = build(
        register(1, 1, fenced=False),
        register(2, 2, fenced=False),
        TopicRecord("a", T1),
        partition(T1, 2, [1, 2], leader=LEADER_NONE),
        partition(T1, 0, [1, 2]),
        partition(T1, 1, [2, 1], leader=LEADER_NONE),
        TopicRecord("b", T2),
        partition(T2, 0, [2, 1]),
    )
    a, b = image.topics_by_id[T1], image.topics_by_id[T2]
    assert a.leaderless() == (1, 2) and b.leaderless() == ()
    later = build(change(T1, 1, leader=2), image=image)
    assert later.topics_by_id[T2] is b and later.topics_by_id[T2].leaderless() == ()
    assert later.topics_by_id[T1].leaderless() == (2,)
    assert a.leaderless() == (1, 2)  # the old image is unchanged
