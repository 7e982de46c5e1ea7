"""braid.torch.elastic.ElasticSampler: an epoch's remaining indices, sharded over the world as
it is at each reset (no runtime needed: the world is given)."""

import sys

import pytest

from braid_launch import build_dir

torch = pytest.importorskip("torch")
sys.path.insert(0, str(build_dir() / "python"))
from braid.torch.elastic import ElasticSampler  # noqa: E402


def shards(n, world, processed=(), epoch=0, shuffle=True):
    out = []
    for r in range(world):
        s = ElasticSampler(range(n), shuffle=shuffle, num_replicas=world, rank=r)
        s.load_state_dict({"epoch": epoch, "processed_indices": set(processed)})
        out.append(list(s))
    return out


def test_the_ranks_shards_cover_the_epoch_once_plus_padding():
    parts = shards(10, 3)
    assert [len(p) for p in parts] == [4, 4, 4]
    flat = [i for p in parts for i in p]
    assert set(flat) == set(range(10))
    assert len(flat) - len(set(flat)) == 2, "ceil(10/3)*3 - 10 indices repeated"
    assert parts == shards(10, 3), "the same permutation on every rank and call"
    assert parts != shards(10, 3, epoch=1), "another epoch, another permutation"
    assert shards(6, 2, shuffle=False) == [[0, 2, 4], [1, 3, 5]]


def test_a_changed_world_shards_only_what_the_epoch_has_not_processed():
    # Three ranks process their first batch of 2, then one is lost: the merged record of
    # every rank leaves 14 of 20 indices, which the two survivors split without repeats.
    world = [ElasticSampler(range(20), seed=3, num_replicas=3, rank=r) for r in range(3)]
    done = set()
    for s in world:
        batch = s.get_indices(0, 2)
        assert len(batch) == 2
        s.record_batch(0, 2)
        done.update(batch)
    assert len(done) == 6
    merged = set().union(*(s.processed_indices for s in world))
    assert merged == done
    survivors = []
    for r in range(2):
        s = ElasticSampler(range(20), seed=3, num_replicas=2, rank=r)
        s.load_state_dict({"epoch": 0, "processed_indices": merged})
        survivors.append(list(s))
        assert len(s) == 7
    flat = survivors[0] + survivors[1]
    assert sorted(flat) == sorted(set(range(20)) - done)
    assert not set(flat) & done, "nothing processed comes back"


def test_set_epoch_forgets_what_was_processed_and_state_round_trips():
    s = ElasticSampler(range(8), num_replicas=2, rank=1)
    s.record_indices([0, 1, 2])
    assert len(s) == 4, "recorded, not yet re-sharded"
    state = s.state_dict()
    s.reset()
    assert len(s) == 3 and not set(s) & {0, 1, 2}
    s.set_epoch(1)
    assert s.processed_indices == set() and len(s) == 4
    s.load_state_dict(state)
    assert s.epoch == 0 and s.processed_indices == {0, 1, 2} and len(s) == 3


def test_bad_worlds_and_batches_are_refused_and_an_empty_epoch_is_empty():
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2 ranks"):
        ElasticSampler(range(4), num_replicas=2, rank=2)
    s = ElasticSampler(range(4), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="at least 0"):
        s.get_indices(-1, 2)
    s.load_state_dict({"epoch": 0, "processed_indices": set(range(4))})
    assert len(s) == 0 and list(s) == []
