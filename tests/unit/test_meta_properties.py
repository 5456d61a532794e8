"""meta.properties parsing and checks, ``kraft storage format``'s rules, random ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.storage import meta_properties as mp
from kraft.storage.format import NodeStorage, format_storage
from kraft.storage.meta_properties import MetaProperties, StorageIdentityError

CID = "kvgQRI2CRG2nvzI1kyfeUQ"


def test_random_uuid_is_kafka_shaped_and_random() -> None:
    ids = {mp.random_uuid() for _ in range(200)}
    assert len(ids) == 200
    assert all(mp.valid_uuid(i) and not i.startswith("-") for i in ids)
    assert not mp.valid_uuid("short") and not mp.valid_uuid("!" * 22)


def test_render_and_parse_round_trip(tmp_path: Path) -> None:
    meta = MetaProperties(CID, 3, mp.random_uuid())
    mp.write(tmp_path, meta)
    text = (tmp_path / mp.META_PROPERTIES).read_text()
    assert text.startswith("#\n#") and "cluster.id=" + CID in text and "version=1" in text
    assert mp.read(tmp_path) == meta
    assert mp.read(tmp_path / "nothing") is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("cluster.id=x\nnode.id=1\n", "missing version"),
        ("version=1\nnode.id=1\n", "missing cluster.id"),
        ("version=2\ncluster.id=x\nnode.id=1\n", "version '2' is not supported"),
        ("version=1\ncluster.id=x\nnode.id=one\n", "node.id 'one' is not a number"),
        ("version=1\ncluster.id=x\nnode.id=1\ndirectory.id=bad\n", "directory.id 'bad'"),
        ("version=1\njunk line\n", "line 2: expected key=value"),
    ],
)
def test_invalid_files_are_refused_clearly(text: str, error: str) -> None:
    with pytest.raises(StorageIdentityError, match=error):
        mp.parse(text, "m.properties")


def test_a_v1_file_without_directory_id_parses() -> None:
    """Brokers of pykraft before storage formatting wrote version/cluster.id/node.id only."""
    assert mp.parse("cluster.id=c\nnode.id=101\nversion=1\n") == MetaProperties("c", 101, "")


def test_check_directory_names_the_fault_and_the_remedy(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    with pytest.raises(StorageIdentityError, match="no meta.properties: its data was wiped") as e:
        mp.check_directory(d, CID, 1, "c1.properties")
    assert "kraft storage recover --config c1.properties --from-peers" in str(e.value)
    (d / "raft").mkdir(parents=True)
    (d / "raft" / "journal.bin").write_bytes(b"x")
    with pytest.raises(StorageIdentityError, match="holds data but no meta.properties") as e:
        mp.check_directory(d, CID, 1, "c1.properties")
    assert "--ignore-formatted" in str(e.value)
    mp.write(d, MetaProperties("other", 1, mp.random_uuid()))
    with pytest.raises(StorageIdentityError, match="belongs to cluster 'other'"):
        mp.check_directory(d, CID, 1, "c1.properties")
    mp.write(d, MetaProperties(CID, 2, mp.random_uuid()))
    with pytest.raises(StorageIdentityError, match="belongs to node 2"):
        mp.check_directory(d, CID, 1, "c1.properties")
    mp.write(d, MetaProperties(CID, 1, mp.random_uuid()))
    assert mp.check_directory(d, CID, 1, "c1.properties").node_id == 1


def _controller(tmp_path: Path) -> NodeStorage:
    return NodeStorage("controller", CID, 1, (tmp_path / "meta",))


def test_format_a_new_quorum_member_and_refuse_to_format_twice(tmp_path: Path) -> None:
    storage = _controller(tmp_path)
    with pytest.raises(StorageIdentityError, match="--initial-controllers"):
        format_storage(storage)  # a controller's empty directory: the choice is explicit
    assert not (tmp_path / "meta").exists()
    (line,) = format_storage(storage, initial=True)
    assert "formatted" in line and not mp.joining(tmp_path / "meta")
    first = mp.read(tmp_path / "meta")
    with pytest.raises(StorageIdentityError, match="already formatted"):
        format_storage(storage, initial=True)
    assert "left as it is" in format_storage(storage, ignore_formatted=True)[0]
    assert mp.read(tmp_path / "meta") == first  # untouched
    with pytest.raises(StorageIdentityError, match="differs from cluster.id"):
        format_storage(storage, "AAAAAAAAAAAAAAAAAAAAAQ", ignore_formatted=True)


def test_format_to_join_writes_the_join_marker(tmp_path: Path) -> None:
    line = format_storage(_controller(tmp_path), initial=False)[0]
    assert "joins a running quorum" in line and mp.joining(tmp_path / "meta")
    mp.clear_join_marker(tmp_path / "meta")
    assert not mp.joining(tmp_path / "meta")


def test_old_data_is_refused_then_adopted_with_ignore_formatted(tmp_path: Path) -> None:
    (tmp_path / "meta" / "log").mkdir(parents=True)
    (tmp_path / "meta" / "log" / "00000000000000000000.log").write_bytes(b"data")
    with pytest.raises(StorageIdentityError, match="use --ignore-formatted to adopt"):
        format_storage(_controller(tmp_path), initial=True)
    assert (
        "adopted existing data" in format_storage(_controller(tmp_path), ignore_formatted=True)[0]
    )
    assert mp.read(tmp_path / "meta").cluster_id == CID and not mp.joining(tmp_path / "meta")


def test_a_refusal_on_one_broker_dir_writes_nothing(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    mp.write(b, MetaProperties("other", 101, mp.random_uuid()))
    with pytest.raises(StorageIdentityError, match="formatted for cluster other"):
        format_storage(NodeStorage("broker", CID, 101, (a, b)))
    assert not (a / mp.META_PROPERTIES).exists()
    assert len(format_storage(NodeStorage("broker", CID, 101, (a,)))) == 1
