"""Radix prefix cache over token IDs at block granularity (as SGLang's RadixAttention).

Responsible for: remembering which KV blocks hold which token prefixes;
matching the longest cached prefix of a sequence; inserting a finished
sequence's blocks; pinning prefixes while requests use them (reference counts
along the path to the root); evicting least-recently-used unpinned leaves when
asked or when over its own capacity; hit statistics.
Not responsible for: the KV tensors (it holds block ids only, so it is pure
logic), allocating or freeing blocks (callers free what `evict` and `insert`
hand back), or deciding when to match or insert (the engine).

Every edge key is a whole number of blocks: node.key has len(node.blocks) *
block_size tokens, and nodes split only at block boundaries. Children are
keyed by their first block of tokens. "Time" is a logical clock bumped on
every match and insert, so eviction order is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False)
class RadixNode:
    """One edge of the tree: the tokens from its parent to here and their blocks."""

    key: tuple[int, ...]
    blocks: list[int]
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0  # requests pinning this node or a descendant
    last_access: int = 0  # logical clock of the last match/insert through here
    node_id: int = 0  # tie-breaker for equal last_access


@dataclass(frozen=True)
class MatchResult:
    """Longest cached prefix: its blocks, its length (tokens) and the node to pin."""

    block_ids: tuple[int, ...]
    matched_tokens: int
    node: RadixNode


@dataclass(frozen=True)
class InsertResult:
    """Outcome of an insert. The caller frees duplicate_block_ids and evicted_block_ids.

    new_tokens: tokens newly cached (blocks adopted * block_size)
    duplicate_block_ids: caller's blocks for content the tree already held under other ids
    evicted_block_ids: blocks evicted to stay within capacity_blocks
    """

    new_tokens: int
    duplicate_block_ids: tuple[int, ...]
    evicted_block_ids: tuple[int, ...]


@dataclass(frozen=True)
class RadixStats:
    """Prefix hits since the last reset (tokens) and the tree's size now (blocks)."""

    lookups: int
    hit_tokens: int
    total_tokens: int
    cached_blocks: int
    pinned_blocks: int

    @property
    def hit_rate(self) -> float:
        """hit_tokens / total_tokens, 0 before any lookup."""
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0


class RadixCache:
    """Prefix tree of token blocks.

    block_size: tokens per block (tokens); must equal the KV cache's
    capacity_blocks: most blocks the tree may hold (blocks); None = bounded only by callers' evict()
    """

    def __init__(self, block_size: int, capacity_blocks: int | None = None):
        if block_size < 1:
            raise ValueError(f"block_size {block_size} must be >= 1")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._ids = itertools.count(1)
        self.root = RadixNode(key=(), blocks=[], parent=None, lock_ref=1)  # the root is never evicted
        self._clock = 0
        self._cached_blocks = 0
        self._pinned_blocks = 0
        self._lookups = self._hit_tokens = self._total_tokens = 0

    # ------------------------------------------------------------ queries

    @property
    def cached_blocks(self) -> int:
        return self._cached_blocks

    @property
    def evictable_blocks(self) -> int:
        """Blocks no request pins: what evict() could free if asked for everything."""
        return self._cached_blocks - self._pinned_blocks

    def stats(self) -> RadixStats:
        return RadixStats(self._lookups, self._hit_tokens, self._total_tokens, self._cached_blocks, self._pinned_blocks)

    def reset_stats(self) -> None:
        self._lookups = self._hit_tokens = self._total_tokens = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _blocks_of(self, tokens: tuple[int, ...] | list[int], n_blocks: int) -> list[tuple[int, ...]]:
        bs = self.block_size
        return [tuple(tokens[i * bs : (i + 1) * bs]) for i in range(n_blocks)]

    # ------------------------------------------------------------ match

    def match_prefix(
        self, tokens: list[int] | tuple[int, ...], max_match_tokens: int | None = None, record: bool = True
    ) -> MatchResult:
        """Longest cached prefix of tokens (whole blocks, at most max_match_tokens).
        record counts len(tokens) lookups tokens and the hit in the statistics."""
        limit = len(tokens) if max_match_tokens is None else min(len(tokens), max_match_tokens)
        want = self._blocks_of(tokens, limit // self.block_size)
        node, blocks, now = self.root, [], self._tick()
        i = 0
        while i < len(want) and want[i] in node.children:
            child = node.children[want[i]]
            m = self._common_blocks(child, want[i:])
            if m < len(child.blocks):
                child = self._split(child, m)
            child.last_access = now
            blocks.extend(child.blocks)
            node, i = child, i + m
        if record:
            self._lookups += 1
            self._hit_tokens += len(blocks) * self.block_size
            self._total_tokens += len(tokens)
        return MatchResult(tuple(blocks), len(blocks) * self.block_size, node)

    def _common_blocks(self, node: RadixNode, want: list[tuple[int, ...]]) -> int:
        """How many of node's blocks equal the first blocks of want."""
        mine = self._blocks_of(node.key, len(node.blocks))
        m = 0
        while m < len(mine) and m < len(want) and mine[m] == want[m]:
            m += 1
        return m

    def _split(self, node: RadixNode, m: int) -> RadixNode:
        """Cut node after m blocks; return the new upper node (which inherits node's pins)."""
        cut = m * self.block_size
        upper = RadixNode(
            key=node.key[:cut],
            blocks=node.blocks[:m],
            parent=node.parent,
            lock_ref=node.lock_ref,
            last_access=node.last_access,
            node_id=next(self._ids),
        )
        node.parent.children[upper.key[: self.block_size]] = upper
        node.key, node.blocks, node.parent = node.key[cut:], node.blocks[m:], upper
        upper.children[node.key[: self.block_size]] = node
        return upper

    # ------------------------------------------------------------ insert

    def insert(self, tokens: list[int] | tuple[int, ...], block_ids: list[int]) -> InsertResult:
        """Cache block_ids as the KV of tokens[:len(block_ids) * block_size]."""
        n = len(block_ids)
        if len(tokens) < n * self.block_size:
            raise ValueError(f"{len(tokens)} tokens cannot fill {n} blocks of {self.block_size}")
        want = self._blocks_of(tokens, n)
        node, i, now, duplicates = self.root, 0, self._tick(), []
        node.last_access = now
        while i < n:
            child = node.children.get(want[i])
            if child is None:
                self._add_leaf(node, want[i:], block_ids[i:], now)
                break
            m = self._common_blocks(child, want[i:])
            if m < len(child.blocks):
                child = self._split(child, m)
            duplicates.extend(b for b, mine in zip(block_ids[i : i + m], child.blocks) if b != mine)
            child.last_access = now
            node, i = child, i + m
        evicted = self._enforce_capacity()
        return InsertResult((n - i) * self.block_size, tuple(duplicates), tuple(evicted))

    def _add_leaf(self, parent: RadixNode, key_blocks: list[tuple[int, ...]], blocks: list[int], now: int) -> None:
        key = tuple(t for blk in key_blocks for t in blk)
        leaf = RadixNode(key=key, blocks=list(blocks), parent=parent, last_access=now, node_id=next(self._ids))
        parent.children[key[: self.block_size]] = leaf
        self._cached_blocks += len(blocks)

    def _enforce_capacity(self) -> list[int]:
        if self.capacity_blocks is None or self._cached_blocks <= self.capacity_blocks:
            return []
        return self.evict(self._cached_blocks - self.capacity_blocks)

    # ------------------------------------------------------------ pin / evict

    def pin(self, node: RadixNode) -> None:
        """Protect node and its ancestors from eviction (one reference)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._pinned_blocks += len(node.blocks)
            node.lock_ref += 1
            node = node.parent

    def unpin(self, node: RadixNode) -> None:
        """Drop one reference taken by pin(node)."""
        while node is not self.root:
            if node.lock_ref <= 0:
                raise ValueError("unpin without a matching pin")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._pinned_blocks -= len(node.blocks)
            node = node.parent

    def evict(self, n_blocks: int) -> list[int]:
        """Remove least-recently-used unpinned leaves until n_blocks are freed (or none are left).
        Returns the freed block ids, possibly more than asked (whole nodes go)."""
        heap = [(leaf.last_access, leaf.node_id, leaf) for leaf in self._leaves() if leaf.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < n_blocks:
            _, _, leaf = heapq.heappop(heap)
            freed.extend(leaf.blocks)
            parent = leaf.parent
            del parent.children[leaf.key[: self.block_size]]
            self._cached_blocks -= len(leaf.blocks)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return freed

    def _leaves(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out
