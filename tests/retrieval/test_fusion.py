import pytest

from retrieval import FUSION_DEPTH, RRF_K, Hit, fusion_depth, reciprocal_rank_fusion


def hits(*ids: int) -> list[Hit]:
    return [Hit(i, 100.0 - rank) for rank, i in enumerate(ids)]


def test_scores_are_sums_of_reciprocal_ranks_with_k_60() -> None:
    fused = reciprocal_rank_fusion([hits(1, 2, 3), hits(3, 1)])
    scores = {hit.id: hit.score for hit in fused}
    assert RRF_K == 60
    assert scores[1] == pytest.approx(1 / 61 + 1 / 62)
    assert scores[3] == pytest.approx(1 / 63 + 1 / 61)
    assert scores[2] == pytest.approx(1 / 62)
    assert [hit.id for hit in fused] == [1, 3, 2]


def test_an_item_in_both_lists_beats_one_first_in_only_one() -> None:
    # 7 is only moderately ranked by each retriever; 1 and 2 top one list each.
    dense = hits(1, 5, 6, 7)
    keyword = hits(2, 8, 9, 7)
    assert reciprocal_rank_fusion([dense, keyword])[0].id == 7


def test_only_ranks_count_not_the_scales_of_the_scores() -> None:
    cosine = [Hit(1, 0.9), Hit(2, 0.8)]
    bm25 = [Hit(2, 31.0), Hit(1, 2.0)]
    scaled = [Hit(2, 0.031), Hit(1, 0.002)]
    assert reciprocal_rank_fusion([cosine, bm25]) == reciprocal_rank_fusion([cosine, scaled])


def test_ties_break_by_id_and_limit_cuts() -> None:
    fused = reciprocal_rank_fusion([hits(9, 4), hits(4, 9)])
    assert [hit.id for hit in fused] == [4, 9]  # equal scores
    assert [hit.id for hit in reciprocal_rank_fusion([hits(1, 2, 3)], limit=2)] == [1, 2]
    assert reciprocal_rank_fusion([hits(1)], limit=0) == []


def test_a_duplicate_in_one_list_counts_once_at_its_best_rank() -> None:
    fused = reciprocal_rank_fusion([[Hit(1, 0.9), Hit(2, 0.8), Hit(1, 0.7)]])
    assert {hit.id: hit.score for hit in fused} == {1: pytest.approx(1 / 61), 2: 1 / 62}


def test_empty_lists_and_one_list_keep_its_order() -> None:
    assert reciprocal_rank_fusion([]) == []
    assert reciprocal_rank_fusion([[], []]) == []
    assert [hit.id for hit in reciprocal_rank_fusion([hits(5, 3, 8), []])] == [5, 3, 8]
    with pytest.raises(ValueError, match="k must be"):
        reciprocal_rank_fusion([hits(1)], k=-1)


def test_lists_are_read_deeper_than_the_top_k() -> None:
    assert fusion_depth(5) == FUSION_DEPTH == 100
    assert fusion_depth(250) == 250
