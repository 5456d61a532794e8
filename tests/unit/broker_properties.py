"""The smallest valid broker.properties, as a dict, for tests of broker settings."""

MINIMAL_BROKER = {
    "node.id": "101",
    "process.roles": "broker",
    "cluster.id": "abc",
    "controller.quorum.bootstrap.servers": "127.0.0.1:9093",
    "listeners": "PLAINTEXT://127.0.0.1:9092",
    "log.dirs": "/tmp/x",
}
