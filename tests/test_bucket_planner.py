"""The bucket planner: exact (checked against brute force over every subset) on small cases."""
import numpy as np
import pytest

from helpers.planning import bucket_planner as bp


def test_padded_tokens_hand_computed():
    # tnx: 100 -> 128 (28), 128 -> 128 (0), 200 -> 256 (56)
    assert bp.padded_tokens([128, 256], [100, 128, 200]) == pytest.approx(84 / 3)
    # nxdi first_fit is strict: 128 -> 256 (128); the largest may be equal: 256 -> 256
    assert bp.padded_tokens([128, 256], [100, 128, 256], rule="nxdi") == pytest.approx((28 + 128 + 0) / 3)
    assert bp.padded_tokens([128, 256], [100, 200], weights=[3, 1]) == pytest.approx((3 * 28 + 56) / 4)
    with pytest.raises(ValueError, match="exceed the largest bucket 256"):
        bp.padded_tokens([128, 256], [300])
    assert bp.overflow_fraction([128, 256], [100, 300, 400, 200]) == 0.5


def test_plan_hand_computed():
    assert bp.plan_buckets([10, 11, 12, 50, 51], 2) == [12, 51]
    assert bp.plan_buckets([10, 11, 12, 50, 51], 1) == [51]
    assert bp.plan_buckets([10, 11, 12, 50, 51], 2, rule="nxdi") == [13, 51]   # 51 == the largest: allowed
    assert bp.plan_buckets([10, 11, 12, 50, 51], 2, align=8) == [16, 56]
    assert bp.plan_buckets([10, 50, 51], 2, align=8, max_length=52) == [16, 52]
    assert bp.plan_buckets([7, 7, 7], 4) == [7]  # never more buckets than distinct lengths


@pytest.mark.parametrize("seed", range(40))
def test_plan_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 10))
    lengths = rng.integers(1, 80, size=n)
    weights = rng.random(n) if seed % 3 == 0 else None
    k, rule, align = int(rng.integers(1, 5)), ("tnx", "nxdi")[seed % 2], (1, 1, 8)[seed % 3]
    plan = bp.plan_buckets(lengths, k, weights, rule=rule, align=align)
    best, best_cost = bp.brute_force_buckets(lengths, k, weights, rule=rule, align=align)
    assert len(plan) <= k and all(b % align == 0 or b == max(plan) for b in plan)
    assert bp.padded_tokens(plan, lengths, weights, rule) == pytest.approx(best_cost, abs=1e-9)


def test_plan_beats_powers_of_two_on_the_guides_example():
    """transformers-neuronx guide: prompts of about 1500 +/- 500 tokens, n_positions 2048."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.normal(1500, 250, 4000)), 1, 2048).astype(int)
    plan = bp.plan_buckets(lengths, 5, max_length=2048)
    assert len(plan) == 5 and plan[-1] == lengths.max()
    powers = bp.padded_tokens([128, 256, 512, 1024, 2048], lengths)
    assert bp.padded_tokens(plan, lengths) < powers / 3
    # the guide's suggestion is one feasible 5-bucket set on multiples of 256: the optimum is no worse
    aligned = bp.plan_buckets(lengths, 5, max_length=2048, align=256)
    assert all(b % 256 == 0 for b in aligned)
    assert bp.padded_tokens(aligned, lengths) <= bp.padded_tokens(bp.GUIDE_1500_BUCKETS, lengths)
    assert bp.plan_buckets(lengths, 5, max_length=2048, align="guide") == aligned  # <= 2048: the same grid


def test_guide_grid():
    """The guide's grid: multiples of 256 up to 2048, of 512 beyond (no 256-steps beyond 2k)."""
    assert bp._align_up(np.array([1, 256, 257, 2048, 2049, 2600, 3073]), "guide").tolist() == \
        [256, 256, 512, 2048, 2560, 3072, 3584]
    lengths = [300, 2100, 2200, 2900, 3000]
    plan = bp.plan_buckets(lengths, 3, align="guide", max_length=4096)
    assert plan == [512, 2560, 3072] and all(b % 512 == 0 for b in plan if b > 2048)
    best, _ = bp.brute_force_buckets(lengths, 3, align="guide", max_length=4096)
    assert bp.padded_tokens(plan, lengths) == pytest.approx(bp.padded_tokens(best, lengths))


def test_decode_lengths():
    values, counts = bp.decode_lengths([3, 5], [2, 3])
    # request 1 attends over 4, 5 positions; request 2 over 6, 7, 8
    assert values.tolist() == [4, 5, 6, 7, 8] and counts.tolist() == [1, 1, 1, 1, 1]
    values, counts = bp.decode_lengths([3, 3], [2, 1])
    assert values.tolist() == [4, 5] and counts.tolist() == [2, 1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(lengths=[], max_buckets=2), "empty"),
    (dict(lengths=[0, 4], max_buckets=2), ">= 1"),
    (dict(lengths=[4], max_buckets=0), "max_buckets"),
    (dict(lengths=[4], max_buckets=1, align=0), "align"),
    (dict(lengths=[4], max_buckets=1, align="pow2"), "align"),
    (dict(lengths=[40], max_buckets=1, max_length=32), "exceeds max_length=32"),
    (dict(lengths=[4], max_buckets=1, rule="vllm"), "rule"),
])
def test_plan_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bp.plan_buckets(**kwargs)
