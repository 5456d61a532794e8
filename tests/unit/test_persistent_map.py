"""PersistentMap (kraft/metadata/persistent_map.py): a plain dict's contents and order, without
copying the whole map per update, and old versions unchanged."""

from __future__ import annotations

import pickle
import random

import pytest

from kraft.metadata.persistent_map import PersistentMap, as_persistent_map


def _check(m: PersistentMap[str, int], model: dict[str, int]) -> None:
    assert list(m) == list(model)
    assert list(m.items()) == list(model.items())
    assert list(m.values()) == list(model.values())
    assert list(m.keys()) == list(model.keys())
    assert len(m) == len(model)
    assert m == model and model == m
    for key, value in model.items():
        assert key in m and m[key] == value and m.get(key) == value
    for absent in ("absent", 7):
        assert absent not in m and m.get(absent, "dflt") == "dflt"  # type: ignore[call-overload]  # any key may be asked
        with pytest.raises(KeyError):
            m[absent]  # type: ignore[index]  # any key may be asked


def test_random_updates_match_a_dict_in_contents_and_order() -> None:
    rng = random.Random(5)
    m: PersistentMap[str, int] = as_persistent_map({})
    model: dict[str, int] = {}
    versions: list[tuple[PersistentMap[str, int], dict[str, int]]] = []
    for step in range(800):
        keys = list(model)
        deletes = rng.sample(keys, min(len(keys), rng.choice((0, 0, 1, 3))))
        sets = {f"k{rng.randrange(600)}": step for _ in range(rng.choice((1, 2, 5, 40)))}
        for key in deletes:
            del model[key]
        model.update(sets)
        m = m.updated(sets, deletes)
        _check(m, model)
        if step % 53 == 0:
            versions.append((m, dict(model)))
    for old, snapshot in versions:  # earlier versions are untouched by later updates
        _check(old, snapshot)


def test_deleted_then_readded_key_goes_last_whether_or_not_folded() -> None:
    base = as_persistent_map({"a": 1, "b": 2, "c": 3})
    once = base.updated({"a": 9}, ["a"])  # in one update
    twice = base.updated(None, ["a"]).updated({"a": 9})  # in two
    assert list(once.items()) == list(twice.items()) == [("b", 2), ("c", 3), ("a", 9)]


def test_updates_copy_only_the_overlay() -> None:
    big = PersistentMap.of({f"t{i}": i for i in range(20_000)})
    after = big.updated({"t5": -5, "new": 1}, ["t7"])
    assert after._base is big._base  # the 20,000 entries are shared, not copied
    assert len(after._over) == 3
    assert big["t5"] == 5 and "t7" in big and "new" not in big


def test_overlay_is_folded_once_it_outgrows_its_bound() -> None:
    m = PersistentMap.of({f"t{i}": i for i in range(10_000)})
    for i in range(300):
        m = m.updated({f"t{i}": -i})
    assert len(m._over) <= 2 * 100  # 2 * sqrt(10,000)
    assert [m[f"t{i}"] for i in (0, 299, 300)] == [0, -299, 300]


def test_bad_deletes_raise_and_change_nothing() -> None:
    m = as_persistent_map({"a": 1})
    with pytest.raises(KeyError):
        m.updated(None, ["zz"])
    gone = m.updated(None, ["a"])
    with pytest.raises(KeyError):
        gone.updated(None, ["a"])
    assert dict(m) == {"a": 1} and dict(gone) == {}


def test_not_hashable_and_wraps_dicts_without_copying() -> None:
    d = {"x": 1}
    m = as_persistent_map(d)
    assert m._base is d and as_persistent_map(m) is m
    with pytest.raises(TypeError):
        hash(m)


def test_pickles_with_deletes_folded() -> None:
    m = as_persistent_map({"a": 1, "b": 2}).updated({"c": 3}, ["a"])
    back = pickle.loads(pickle.dumps(m))
    assert list(back.items()) == [("b", 2), ("c", 3)] and "a" not in back
