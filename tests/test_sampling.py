import pytest

from sweeplab.data.sampling import ResumableShuffleBatchSampler


def _epochs(sampler, n):
    return [batch for _ in range(n) for batch in sampler]


@pytest.mark.parametrize("stop_after", [0, 1, 3, 4, 5, 9])
def test_a_restored_sampler_continues_exactly_where_it_stopped_across_epochs(stop_after):
    reference = _epochs(ResumableShuffleBatchSampler(9, 2, seed=3), 3)
    first = ResumableShuffleBatchSampler(9, 2, seed=3)
    seen, iterator = [], iter(first)
    for _ in range(stop_after):
        try:
            seen.append(next(iterator))
        except StopIteration:  # the epoch ended: the loader would start the next one
            iterator = iter(first)
            seen.append(next(iterator))
    restored = ResumableShuffleBatchSampler(9, 2, seed=3)
    restored.load_state_dict(first.state_dict())
    seen += _epochs(restored, 3)
    assert seen[: len(reference)] == reference


def test_every_epoch_is_a_fresh_permutation_of_whole_batches():
    sampler = ResumableShuffleBatchSampler(10, 3, seed=0, drop_last=True)
    e0, e1 = list(sampler), list(sampler)
    assert len(e0) == len(sampler) == 3 and all(len(b) == 3 for b in e0)
    assert e0 != e1 and len({i for b in e0 for i in b}) == 9
    assert len(ResumableShuffleBatchSampler(10, 3, seed=0, drop_last=False)) == 4
