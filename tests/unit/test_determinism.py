"""Determinism: handlers are pure (the same command on the same image gives byte-identical
batches), and replaying the active controller's batches gives equal images on every other
controller — including one restarted from a snapshot of the image (different dict insertion
orders) and one rebuilt by replaying the log."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft.controller.commands import Command
from kraft.controller.settings import ControllerSettings
from kraft.controller.state_machine import QuorumStateMachine
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image import MetadataImage
from kraft.metadata.replay import image_from_records
from kraft.records import decode_batch
from kraft.rpc.bodies import decode_request

SETTINGS = ControllerSettings("det-cluster", num_partitions=2, default_replication_factor=2)
NAMES = ["orders", "x.y", "x_y", "logs", "a-b"]
BROKERS = range(5)

action = st.one_of(
    st.tuples(
        st.just("register"),
        st.sampled_from(BROKERS),
        st.integers(0, 2),
        st.sampled_from([None, "a", "b"]),
    ),
    st.tuples(st.just("unfence"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(st.just("fence"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(st.just("shutdown"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(st.just("unregister"), st.sampled_from(BROKERS)),
    st.tuples(
        st.just("create"),
        st.sampled_from(NAMES),
        st.integers(-1, 4),
        st.integers(-1, 3),
        st.sampled_from(
            [
                None,
                {"cleanup.policy": "compact"},
                {"unclean.leader.election.enable": "true"},
                {"retention.ms": "bad"},
            ]
        ),
    ),
    st.tuples(
        st.just("assign"),
        st.sampled_from(NAMES),
        st.lists(st.permutations(list(BROKERS)), min_size=1, max_size=3),
        st.integers(1, 3),
    ),
    st.tuples(st.just("grow"), st.sampled_from(NAMES), st.integers(0, 6)),
    st.tuples(st.just("delete"), st.lists(st.sampled_from(NAMES), min_size=1, max_size=2)),
    st.tuples(
        st.just("config"),
        st.sampled_from(NAMES + [""]),
        st.sampled_from(["SET", "DELETE", "APPEND", "SUBTRACT"]),
        st.sampled_from(["cleanup.policy", "retention.ms", "unclean.leader.election.enable"]),
        st.sampled_from(["compact", "delete", "1000", "true"]),
    ),
    st.tuples(st.just("elect"), st.sampled_from(["preferred", "unclean"]), st.booleans()),
    st.tuples(
        st.just("isr"),
        st.integers(0, 4),
        st.integers(0, 3),
        st.lists(st.sampled_from(BROKERS), max_size=3),
    ),
    st.tuples(st.just("producer"), st.sampled_from(BROKERS)),
    st.tuples(
        st.just("noop"),
    ),
    st.tuples(st.just("activate"), st.integers(1, 3)),
)


def to_command(image: MetadataImage, step: int, seed: int, a: tuple) -> Command:
    """Concretize an abstract action against the (shared) current image."""
    kind = a[0]

    def epoch(b: int, stale: bool = False) -> int:
        reg = image.brokers.get(b)
        return (reg.epoch if reg else 0) + (1 if stale else 0)

    if kind == "register":
        body = {
            "broker_id": a[1],
            "cluster_id": SETTINGS.cluster_id,
            "incarnation_id": str(uuid.UUID(int=a[2] + 1)),
            "listeners": [
                {
                    "name": "PLAINTEXT",
                    "host": "h",
                    "port": 9000 + a[1],
                    "security_protocol": "PLAINTEXT",
                }
            ],
            "rack": a[3],
        }
        api = "BrokerRegistration"
    elif kind in ("unfence", "fence", "shutdown"):
        api = {
            "unfence": "UnfenceBroker",
            "fence": "FenceBroker",
            "shutdown": "BeginControlledShutdown",
        }[kind]
        body = {"broker_id": a[1], "broker_epoch": epoch(a[1], a[2]), "reason": "session-timeout"}
    elif kind == "unregister":
        api, body = "UnregisterBroker", {"broker_id": a[1]}
    elif kind == "create":
        api, body = (
            "CreateTopics",
            {
                "topics": [
                    {
                        "name": a[1],
                        "num_partitions": a[2],
                        "replication_factor": a[3],
                        "configs": a[4],
                    }
                ]
            },
        )
    elif kind == "assign":
        rf = a[3]
        api, body = (
            "CreateTopics",
            {"topics": [{"name": a[1], "assignments": {i: p[:rf] for i, p in enumerate(a[2])}}]},
        )
    elif kind == "grow":
        api, body = "CreatePartitions", {"topics": [{"name": a[1], "count": a[2]}]}
    elif kind == "delete":
        api, body = "DeleteTopics", {"names": a[1]}
    elif kind == "config":
        rtype = "broker" if a[1] == "" else "topic"
        key = (
            {"retention.ms": "log.retention.ms", "cleanup.policy": "log.cleanup.policy"}.get(
                a[3], a[3]
            )
            if rtype == "broker"
            else a[3]
        )
        api, body = (
            "IncrementalAlterConfigs",
            {
                "resources": [
                    {
                        "resource_type": rtype,
                        "resource_name": a[1],
                        "ops": [{"name": key, "op": a[2], "value": a[4]}],
                    }
                ]
            },
        )
    elif kind == "elect":
        partitions = (
            None if a[2] else [{"topic": n, "partition": 0} for n in sorted(image.topics_by_name)]
        )
        api, body = "ElectLeaders", {"election_type": a[1], "partitions": partitions}
    elif kind == "isr":
        names = sorted(image.topics_by_name)
        topic = image.topic(names[a[1] % len(names)]) if names else None
        part = topic.partitions.get(a[2]) if topic else None
        leader = part.leader if part else 0
        item = {
            "partition": a[2],
            "leader_epoch": part.leader_epoch if part else 0,
            "partition_epoch": part.partition_epoch if part else 0,
            "isr": [leader, *a[3]],
        }
        api, body = (
            "AlterPartition",
            {
                "broker_id": leader,
                "broker_epoch": epoch(leader),
                "topics": [{"topic_id": topic.topic_id if topic else "none", "partitions": [item]}],
            },
        )
    elif kind == "producer":
        api, body = "AllocateProducerIds", {"broker_id": a[1], "broker_epoch": epoch(a[1])}
    elif kind == "activate":
        api, body = "ActivateController", {"leader_id": a[1], "term": step}
    else:
        api, body = "NoOp", {}
    return Command(
        api,
        body,
        request_id=f"r{step}",
        principal="User:p",
        client_id="c",
        timestamp_ms=10_000 + step,
        seed=seed,
        leader_id=1,
    )


def run_pair(actions, seeds, restart_at: int):
    """The active controller ``a`` proposes each action (and a second machine proposing the same
    commands gets the same bytes); follower ``b`` replays a's batches from their bytes and
    restarts from a snapshot of its image at ``restart_at``. Returns a, b, a's encodings and
    batches."""
    a, b, twin = (QuorumStateMachine(SETTINGS) for _ in range(3))
    out_a, batches = [], []
    for step, (act, seed) in enumerate(zip(actions, seeds)):
        if step == restart_at:
            img = b.image
            b = QuorumStateMachine(
                SETTINGS,
                image_from_records(
                    img.iter_records(),
                    offset=img.offset,
                    term=img.term,
                    raft_index=img.raft_index,
                    timestamp_ms=img.timestamp_ms,
                    last_hash=img.last_hash,
                ),
            )
        cmd = to_command(a.image, step, seed, act)
        batch_a, resp_a, _ = a.propose(cmd, 1)
        batch_t, resp_t, _ = twin.propose(cmd, 1)
        enc_a = batch_a.encode() if batch_a else None
        assert enc_a == (batch_t.encode() if batch_t else None), (step, act)
        assert resp_a == resp_t
        if enc_a is not None:
            assert enc_a == a.last_encoded
            b.replay_batch(decode_batch(enc_a))
            assert b.image.last_hash == a.image.last_hash
        out_a.append(enc_a)
        if batch_a is not None:
            batches.append(batch_a)
    return a, b, out_a, batches


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=st.lists(action, min_size=1, max_size=40),
    seed=st.integers(0, 2**64 - 1),
    restart=st.integers(0, 40),
)
def test_random_command_sequences_are_deterministic(actions, seed, restart):
    seeds = [(seed + i * 7919) % 2**64 for i in range(len(actions))]
    a, b, _, batches = run_pair(actions, seeds, restart)
    assert a.image.checksum() == b.image.checksum()
    replayed = QuorumStateMachine(SETTINGS)
    for batch in batches:
        replayed.replay_batch(batch)
    assert replayed.image.checksum() == a.image.checksum()
    assert replayed.recent_request_ids == a.recent_request_ids


def test_a_scripted_cluster_history_is_byte_identical():
    script = [("activate", 1)]
    script += [("register", b, 0, "ab"[b % 2]) for b in BROKERS] + [
        ("unfence", b, False) for b in BROKERS
    ]
    script += [
        ("create", "orders", 4, 3, {"cleanup.policy": "compact"}),
        ("create", "x.y", -1, -1, None),
        ("create", "x_y", 1, 1, None),
        ("assign", "logs", [[0, 1, 2], [2, 1, 0]], 2),
        ("fence", 0, False),
        ("isr", 0, 0, [3]),
        ("unfence", 0, False),
        ("elect", "preferred", True),
        ("shutdown", 1, False),
        ("grow", "orders", 6),
        ("config", "orders", "APPEND", "cleanup.policy", "delete"),
        ("config", "", "SET", "retention.ms", "1000"),
        ("producer", 2),
        ("delete", ["x.y", "nope"]),
        ("create", "x_y", 2, 2, None),
        ("unregister", 4),
        ("elect", "unclean", True),
        ("noop",),
    ]
    seeds = [0xDEADBEEF + i for i in range(len(script))]
    a, b, encodings, _ = run_pair(script, seeds, restart_at=len(script) // 2)
    again, _, encodings_again, _ = run_pair(script, seeds, restart_at=len(script))
    assert encodings == encodings_again
    assert a.image.checksum() == b.image.checksum() == again.image.checksum()
    assert sum(e is not None for e in encodings) >= len(script) - 3


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 5)
    | st.sampled_from(["", "t", "x.y", "SET", "topic", "broker", "0"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "topics",
                    "count",
                    "assignments",
                    "configs",
                    "num_partitions",
                    "replication_factor",
                    "names",
                    "resources",
                    "resource_type",
                    "resource_name",
                    "ops",
                    "op",
                    "value",
                    "partitions",
                    "partition",
                    "topic",
                    "topic_id",
                    "isr",
                    "leader_epoch",
                    "partition_epoch",
                    0,
                    1,
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    api=st.sampled_from(
        [
            "CreateTopics",
            "CreatePartitions",
            "DeleteTopics",
            "IncrementalAlterConfigs",
            "ElectLeaders",
            "BrokerRegistration",
            "UnregisterBroker",
            "FenceBroker",
            "UnfenceBroker",
            "BeginControlledShutdown",
            "LogDirsOffline",
            "AlterPartition",
            "AllocateProducerIds",
            "ActivateController",
        ]
    ),
    body=st.dictionaries(
        st.sampled_from(
            [
                "topics",
                "names",
                "resources",
                "partitions",
                "election_type",
                "broker_id",
                "broker_epoch",
                "validate_only",
                "reason",
                "cluster_id",
                "incarnation_id",
                "listeners",
                "leader_id",
                "term",
                "offline_replicas",
            ]
        ),
        json_like,
        max_size=5,
    ),
)
def test_garbage_input_never_raises(api, body):
    sm = QuorumStateMachine(SETTINGS)
    sm.propose(Command("ActivateController", {"leader_id": 1, "term": 1}, "a"), 1)
    reg = {
        "broker_id": 0,
        "cluster_id": SETTINGS.cluster_id,
        "incarnation_id": str(uuid.UUID(int=1)),
        "listeners": [],
    }
    sm.propose(Command("BrokerRegistration", reg, "b"), 1)
    sm.propose(Command("UnfenceBroker", {"broker_id": 0, "broker_epoch": 2}, "c"), 1)
    sm.propose(Command("CreateTopics", {"topics": [{"name": "t", "num_partitions": 2}]}, "d"), 1)
    before = sm.image
    try:  # the controller's dispatch checks the body's types before any handler runs
        decode_request(api, body)
    except KraftError as e:
        assert e.code == ErrorCode.INVALID_REQUEST and e.message.startswith(api)
        return
    batch, response, _ = sm.propose(Command(api, body, "z", seed=3), 1)
    assert isinstance(response, dict)
    if batch is None:
        assert sm.image is before
    else:
        assert sm.image.offset == batch.last_offset
