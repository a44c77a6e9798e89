"""Radix prefix cache: match, insert, split, pin, eviction order, capacity, statistics (pure logic)."""

import pytest

from workers.radix import RadixCache

BS = 4  # block size used throughout (tokens)


def seq(*blocks: int) -> list[int]:
    """Tokens made of whole blocks; block b is [b*10, b*10+1, b*10+2, b*10+3]."""
    return [b * 10 + i for b in blocks for i in range(BS)]


def test_empty_tree_matches_nothing():
    tree = RadixCache(BS)
    m = tree.match_prefix(seq(1, 2))
    assert (m.block_ids, m.matched_tokens) == ((), 0)


def test_insert_then_match_full_and_partial_prefix():
    tree = RadixCache(BS)
    r = tree.insert(seq(1, 2, 3), [100, 101, 102])
    assert r.new_tokens == 12 and r.duplicate_block_ids == () and tree.cached_blocks == 3
    assert tree.match_prefix(seq(1, 2, 3)).block_ids == (100, 101, 102)
    assert tree.match_prefix(seq(1, 2, 9)).block_ids == (100, 101)
    assert tree.match_prefix(seq(5)).block_ids == ()


def test_match_is_block_granular():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2), [100, 101])
    # 7 tokens: the second block is only 3/4 present in the query, so only one block matches
    assert tree.match_prefix(seq(1, 2)[:7]).matched_tokens == 4
    # a difference inside a block makes the whole block miss
    tokens = seq(1, 2)
    tokens[5] = 999
    assert tree.match_prefix(tokens).block_ids == (100,)


def test_max_match_tokens_limits_the_match():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2, 3), [100, 101, 102])
    tokens = seq(1, 2, 3)
    # the engine asks for at most len-1 tokens so one prompt token is left to compute
    assert tree.match_prefix(tokens, max_match_tokens=len(tokens) - 1).block_ids == (100, 101)


def test_insert_only_whole_blocks_of_the_given_ids():
    tree = RadixCache(BS)
    r = tree.insert(seq(1, 2) + [7, 7], [100, 101])  # trailing partial block is not cached
    assert r.new_tokens == 8
    with pytest.raises(ValueError):
        tree.insert(seq(1)[:3], [100])


def test_split_on_insert_keeps_both_branches_and_returns_duplicates():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2, 3, 4), [100, 101, 102, 103])
    r = tree.insert(seq(1, 2, 8), [200, 201, 202])
    # blocks 1, 2 were already cached as 100, 101: the caller's 200, 201 are duplicates to free
    assert r.duplicate_block_ids == (200, 201)
    assert r.new_tokens == 4
    assert tree.cached_blocks == 5
    assert tree.match_prefix(seq(1, 2, 3, 4)).block_ids == (100, 101, 102, 103)
    assert tree.match_prefix(seq(1, 2, 8)).block_ids == (100, 101, 202)
    upper = tree.root.children[tuple(seq(1))]
    assert upper.blocks == [100, 101] and len(upper.children) == 2


def test_reinsert_of_shared_ids_reports_no_duplicates():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2), [100, 101])
    r = tree.insert(seq(1, 2, 3), [100, 101, 300])  # a request that reused the cached prefix
    assert r.duplicate_block_ids == () and r.new_tokens == 4
    assert tree.match_prefix(seq(1, 2, 3)).block_ids == (100, 101, 300)


def test_match_splits_so_the_returned_node_ends_at_the_match():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2, 3), [100, 101, 102])
    m = tree.match_prefix(seq(1, 2, 9))
    assert m.node.key == tuple(seq(1, 2)) and m.node.blocks == [100, 101]


def test_eviction_is_lru_over_leaves():
    tree = RadixCache(BS)
    tree.insert(seq(1), [100])
    tree.insert(seq(2), [200])
    tree.insert(seq(3), [300])
    tree.match_prefix(seq(1))  # touch 1: now 2 is the least recently used
    assert tree.evict(1) == [200]
    assert tree.evict(1) == [300]
    assert tree.evict(1) == [100]
    assert tree.evict(1) == [] and tree.cached_blocks == 0


def test_eviction_frees_whole_leaves_and_then_their_parent():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2), [100, 101])
    tree.insert(seq(1, 3), [100, 102])  # splits: parent [100], children [101], [102]
    freed = tree.evict(3)
    assert sorted(freed) == [100, 101, 102]
    assert tree.cached_blocks == 0 and tree.root.children == {}


def test_pinned_prefix_is_not_evicted_until_unpinned():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2), [100, 101])
    tree.insert(seq(5), [500])
    m = tree.match_prefix(seq(1, 2))
    tree.pin(m.node)
    assert tree.evictable_blocks == 1
    assert tree.evict(10) == [500]
    assert tree.match_prefix(seq(1, 2)).block_ids == (100, 101)
    tree.unpin(m.node)
    assert tree.evictable_blocks == 2
    assert sorted(tree.evict(10)) == [100, 101]


def test_pin_protects_ancestors_but_not_siblings():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2), [100, 101])
    tree.insert(seq(1, 3), [100, 102])
    tree.pin(tree.match_prefix(seq(1, 2)).node)
    assert tree.evict(10) == [102]
    assert tree.cached_blocks == 2


def test_split_of_a_pinned_node_keeps_the_pin_counts_right():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2, 3), [100, 101, 102])
    m = tree.match_prefix(seq(1, 2, 3))
    tree.pin(m.node)
    tree.insert(seq(1, 7), [100, 700])  # splits the pinned node after block 1
    assert tree.evictable_blocks == 1  # only the new leaf [700]
    tree.unpin(m.node)
    assert tree.evictable_blocks == 4
    assert sorted(tree.evict(10)) == [100, 101, 102, 700]


def test_unpin_without_pin_raises():
    tree = RadixCache(BS)
    tree.insert(seq(1), [100])
    with pytest.raises(ValueError):
        tree.unpin(tree.match_prefix(seq(1)).node)


def test_capacity_evicts_lru_on_insert_and_reports_it():
    tree = RadixCache(BS, capacity_blocks=3)
    tree.insert(seq(1, 2), [100, 101])
    tree.insert(seq(3), [300])
    r = tree.insert(seq(4), [400])
    assert r.evicted_block_ids == (100, 101)  # the oldest leaf goes whole
    assert tree.cached_blocks == 2
    assert tree.match_prefix(seq(1, 2)).matched_tokens == 0


def test_capacity_never_evicts_pinned_blocks():
    tree = RadixCache(BS, capacity_blocks=2)
    tree.insert(seq(1, 2), [100, 101])
    tree.pin(tree.match_prefix(seq(1, 2)).node)
    r = tree.insert(seq(3), [300])
    assert r.evicted_block_ids == (300,)  # the only unpinned leaf is the new one
    assert tree.match_prefix(seq(1, 2)).block_ids == (100, 101)


def test_hit_statistics_count_tokens():
    tree = RadixCache(BS)
    tree.insert(seq(1, 2), [100, 101])
    tree.match_prefix(seq(1, 2, 3))  # 8 of 12 tokens hit
    tree.match_prefix(seq(9))  # 0 of 4
    tree.match_prefix(seq(1), record=False)
    s = tree.stats()
    assert (s.lookups, s.hit_tokens, s.total_tokens) == (2, 8, 16)
    assert s.hit_rate == pytest.approx(0.5)
    tree.reset_stats()
    assert tree.stats().hit_rate == 0.0
