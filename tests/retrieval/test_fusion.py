import pytest

from retrieval import (
    FUSION_DEPTH,
    RRF_K,
    FusionPolicy,
    Hit,
    Normalised,
    fuse,
    fusion_depth,
    min_max_scores,
    normalised_score_fusion,
    reciprocal_rank_fusion,
    z_scores,
)


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


# Normalised-score fusion.


def test_min_max_scales_each_list_to_zero_one_with_a_floor_of_zero() -> None:
    normalised = min_max_scores([Hit(1, 0.9), Hit(2, 0.7), Hit(3, 0.5)])
    assert normalised.scores == {1: 1.0, 2: pytest.approx(0.5), 3: 0.0}
    assert normalised.floor == 0.0


def test_z_scores_use_the_population_deviation_and_floor_at_the_lowest() -> None:
    normalised = z_scores([Hit(1, 3.0), Hit(2, 2.0), Hit(3, 1.0)])
    deviation = (2 / 3) ** 0.5
    assert normalised.scores == {
        1: pytest.approx(1 / deviation),
        2: pytest.approx(0.0),
        3: pytest.approx(-1 / deviation),
    }
    assert normalised.floor == pytest.approx(-1 / deviation)


def test_a_list_of_equal_scores_gives_its_members_one_and_the_missing_zero() -> None:
    for normalise in (min_max_scores, z_scores):
        assert normalise([Hit(4, 2.5), Hit(5, 2.5)]) == Normalised({4: 1.0, 5: 1.0}, 0.0)
        assert normalise([Hit(4, 7.0)]) == Normalised({4: 1.0}, 0.0)
        assert normalise([]) == Normalised({}, 0.0)


def test_an_item_listed_twice_counts_at_its_best_score() -> None:
    assert min_max_scores([Hit(1, 0.9), Hit(2, 0.1), Hit(1, 0.3)]).scores == {1: 1.0, 2: 0.0}


def test_the_convex_combination_with_missing_items_at_each_lists_floor() -> None:
    dense = [Hit(1, 0.9), Hit(2, 0.5), Hit(3, 0.1)]  # min-max: 1, 0.5, 0
    keyword = [Hit(3, 20.0), Hit(4, 10.0), Hit(5, 0.0)]  # min-max: 1, 0.5, 0
    fused = normalised_score_fusion(dense, keyword, alpha=0.7, normalise=min_max_scores)
    scores = {hit.id: hit.score for hit in fused}
    assert scores == {
        1: pytest.approx(0.7 * 1.0 + 0.3 * 0.0),  # missing from keyword: its floor 0
        2: pytest.approx(0.7 * 0.5),
        3: pytest.approx(0.7 * 0.0 + 0.3 * 1.0),
        4: pytest.approx(0.3 * 0.5),
        5: pytest.approx(0.0),
    }
    assert [hit.id for hit in fused] == [1, 2, 3, 4, 5]


def test_a_missing_item_gets_the_lowest_z_score_of_the_list_it_misses() -> None:
    dense = [Hit(1, 3.0), Hit(2, 2.0), Hit(3, 1.0)]
    keyword = [Hit(9, 5.0), Hit(1, 1.0)]  # z: 9 -> 1, 1 -> -1
    fused = normalised_score_fusion(dense, keyword, alpha=0.5, normalise=z_scores)
    scores = {hit.id: hit.score for hit in fused}
    deviation = (2 / 3) ** 0.5
    assert scores[1] == pytest.approx(0.5 / deviation - 0.5)
    assert scores[9] == pytest.approx(0.5 * -1 / deviation + 0.5)  # dense floor
    assert scores[3] == pytest.approx(0.5 * -1 / deviation - 0.5)  # keyword floor


def test_scale_does_not_matter_but_score_gaps_do() -> None:
    cosine = [Hit(1, 0.9), Hit(2, 0.89), Hit(3, 0.2)]
    bm25 = [Hit(3, 31.0), Hit(2, 30.0), Hit(1, 2.0)]
    scaled = [Hit(hit.id, hit.score / 1000) for hit in bm25]
    for normalise in (min_max_scores, z_scores):
        fused = normalised_score_fusion(cosine, bm25, alpha=0.5, normalise=normalise)
        again = normalised_score_fusion(cosine, scaled, alpha=0.5, normalise=normalise)
        assert [hit.id for hit in fused] == [hit.id for hit in again]
        assert [hit.score for hit in fused] == pytest.approx([hit.score for hit in again])
        assert fused[0].id == 2  # a hair behind the top of both lists: first here
    # By ranks alone 2 comes last (2/62 < 1/61 + 1/63): the gaps between scores are lost.
    assert [hit.id for hit in reciprocal_rank_fusion([cosine, bm25])] == [1, 3, 2]


def test_equal_fused_scores_break_by_id_and_limit_cuts() -> None:
    dense = [Hit(8, 1.0), Hit(6, 0.0)]
    keyword = [Hit(6, 1.0), Hit(8, 0.0)]
    fused = normalised_score_fusion(dense, keyword, alpha=0.5, normalise=min_max_scores)
    assert [(hit.id, hit.score) for hit in fused] == [(6, 0.5), (8, 0.5)]
    limited = normalised_score_fusion(dense, keyword, alpha=0.5, normalise=z_scores, limit=1)
    assert [hit.id for hit in limited] == [6]


def test_one_list_only_or_none_keeps_that_lists_order() -> None:
    dense = [Hit(5, 0.9), Hit(3, 0.4), Hit(8, 0.1)]
    for normalise in (min_max_scores, z_scores):
        for alpha in (0.3, 0.7):
            alone = normalised_score_fusion(dense, [], alpha=alpha, normalise=normalise)
            assert [hit.id for hit in alone] == [5, 3, 8]
            swapped = normalised_score_fusion([], dense, alpha=alpha, normalise=normalise)
            assert [hit.id for hit in swapped] == [5, 3, 8]
        assert normalised_score_fusion([], [], alpha=0.5, normalise=normalise) == []


def test_alpha_one_or_zero_is_one_list_alone() -> None:
    dense = [Hit(1, 0.9), Hit(2, 0.5)]
    keyword = [Hit(2, 9.0), Hit(1, 1.0)]
    only_dense = normalised_score_fusion(dense, keyword, alpha=1.0, normalise=min_max_scores)
    only_keyword = normalised_score_fusion(dense, keyword, alpha=0.0, normalise=min_max_scores)
    assert [hit.id for hit in only_dense] == [1, 2]
    assert [hit.id for hit in only_keyword] == [2, 1]
    with pytest.raises(ValueError, match="alpha"):
        normalised_score_fusion(dense, keyword, alpha=1.5, normalise=min_max_scores)


def test_fuse_follows_the_policy() -> None:
    dense = [Hit(1, 0.9), Hit(2, 0.89), Hit(3, 0.2)]
    keyword = [Hit(3, 31.0), Hit(2, 30.0), Hit(1, 2.0)]
    assert fuse(dense, keyword, policy=FusionPolicy()) == reciprocal_rank_fusion([dense, keyword])
    minmax = FusionPolicy(method="minmax", alpha=0.6)
    assert fuse(dense, keyword, policy=minmax, limit=2) == normalised_score_fusion(
        dense, keyword, alpha=0.6, normalise=min_max_scores, limit=2
    )
    zscore = FusionPolicy(method="zscore", alpha=0.6)
    assert fuse(dense, keyword, policy=zscore) == normalised_score_fusion(
        dense, keyword, alpha=0.6, normalise=z_scores
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": "borda"}, "method"),
        ({"alpha": -0.1}, "alpha"),
        ({"depth": 0}, "depth"),
        ({"rrf_k": -1}, "k must"),
    ],
)
def test_a_policy_out_of_range_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FusionPolicy(**fields)  # type: ignore[arg-type]


def test_the_policy_depth_sets_how_deep_lists_are_read() -> None:
    assert fusion_depth(5, 300) == 300
    assert fusion_depth(500, 300) == 500


# Fusion by document: each document's best chunk takes the document's fused score.


def test_by_document_a_documents_best_chunk_counts_its_best_in_each_list() -> None:
    # Document 10 is found by meaning in chunk 1 and by words in chunk 2; document 20 by
    # both in one chunk, 3, a little lower in each list.
    dense = [Hit(1, 3.0), Hit(3, 2.0), Hit(2, 1.0)]  # min-max: 1, 0.5, 0
    keyword = [Hit(2, 30.0), Hit(3, 20.0), Hit(4, 10.0)]  # min-max: 1, 0.5, 0
    documents = {1: 10, 2: 10, 3: 20, 4: 30}
    plain = normalised_score_fusion(dense, keyword, alpha=0.5, normalise=min_max_scores)
    assert [hit.id for hit in plain][:2] == [1, 2]  # tied at 0.5 with 3, by id
    assert {hit.id: hit.score for hit in plain}[3] == pytest.approx(0.5)
    fused = normalised_score_fusion(
        dense, keyword, alpha=0.5, normalise=min_max_scores, documents=documents
    )
    scores = {hit.id: hit.score for hit in fused}
    # Chunk 1 leads document 10 (0.5 against chunk 2's 0.5, by id) and takes 0.5 * 1 +
    # 0.5 * 1; chunk 2 keeps its own 0.5, as do 3 and 4 (the only chunks of theirs).
    assert scores == {1: 1.0, 2: 0.5, 3: 0.5, 4: 0.0}
    assert [hit.id for hit in fused] == [1, 2, 3, 4]


def test_by_document_other_chunks_keep_their_own_scores_and_unnamed_items_stand_alone() -> None:
    dense = [Hit(1, 3.0), Hit(2, 2.0), Hit(5, 1.0)]  # min-max: 1, 0.5, 0
    keyword = [Hit(2, 9.0), Hit(5, 3.0), Hit(1, 1.0)]  # min-max: 1, 0.25, 0
    documents = {1: 10, 2: 10}  # 5 is named by none: a document of its own
    fused = normalised_score_fusion(
        dense, keyword, alpha=0.5, normalise=min_max_scores, documents=documents
    )
    scores = {hit.id: hit.score for hit in fused}
    # Chunk 2 leads document 10 (0.75 against chunk 1's 0.5): it takes 1 and 1.
    assert scores == {2: 1.0, 1: 0.5, 5: pytest.approx(0.125)}


def test_by_document_with_one_chunk_per_document_changes_nothing() -> None:
    dense = [Hit(1, 0.9), Hit(2, 0.5), Hit(3, 0.1)]
    keyword = [Hit(3, 20.0), Hit(4, 10.0), Hit(1, 0.0)]
    documents = {item: 100 + item for item in (1, 2, 3, 4)}
    for method in ("rrf", "minmax", "zscore"):
        chunks = fuse(dense, keyword, policy=FusionPolicy(method=method))
        by_document = FusionPolicy(method=method, by_document=True)
        assert fuse(dense, keyword, policy=by_document, documents=documents) == chunks


def test_rrf_by_document_sums_each_documents_best_reciprocal_ranks() -> None:
    fused = reciprocal_rank_fusion([hits(1, 3), hits(2, 3)], documents={1: 10, 2: 10, 3: 30})
    scores = {hit.id: hit.score for hit in fused}
    assert scores == {1: pytest.approx(2 / 61), 2: 1 / 61, 3: pytest.approx(2 / 62)}
    assert [hit.id for hit in fused] == [1, 3, 2]


def test_fusion_by_document_needs_the_documents_and_is_off_unless_asked() -> None:
    dense, keyword = hits(1, 2), hits(2, 1)
    with pytest.raises(ValueError, match="by document"):
        fuse(dense, keyword, policy=FusionPolicy(method="zscore", by_document=True))
    policy = FusionPolicy(method="zscore")
    assert not policy.by_document
    assert fuse(dense, keyword, policy=policy, documents={1: 5, 2: 5}) == fuse(
        dense, keyword, policy=policy
    )
