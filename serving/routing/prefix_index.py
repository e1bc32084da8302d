"""An approximate prefix tree of what one replica's prefix cache holds, bounded, least recently used out.

A prompt is cut into blocks of `block_tokens` token ids; block i is named by a hash chained over blocks
0..i, so a name stands for the whole prefix up to that block: a node of a token trie, without the trie's
pointers. The longest cached prefix of a prompt is then its run of leading block names found here. The
chain starts from the request's cache scope (a tenant's: serving.tenants.cache_scope), as SGLang's radix cache
keys a prefix by its `cache_salt` too: the same tokens of two tenants are two prefixes, in the replica and here.
Approximate three ways, all on the side of cheapness: a partial last block is not indexed; the index
holds what was routed to the replica, not what the replica kept (its own radix cache evicts on its own
schedule; the bound below is set to the replica's KV capacity to follow it); and a 64-bit hash could
collide (a wrong guess costs one cache miss, never a wrong answer).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np
import xxhash


def block_names(tokens: Sequence[int], block_tokens: int, scope: str | None = None) -> list[int]:
    """Chained names of the full blocks of `tokens`: names[i] identifies tokens[: (i + 1) * block_tokens]
    within `scope` (None: the scope of requests that carry none)."""
    ids = np.asarray(tokens, dtype="<i4")
    data = ids.tobytes()
    step = 4 * block_tokens
    names, prev = [], 0 if scope is None else xxhash.xxh3_64_intdigest(scope.encode())
    for start in range(0, (len(ids) // block_tokens) * step, step):
        prev = xxhash.xxh3_64_intdigest(data[start : start + step], seed=prev)
        names.append(prev)
    return names


class PrefixIndex:
    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, names: Sequence[int]) -> int:
        """How many leading blocks of a prompt are held (its cached prefix, in blocks)."""
        n = 0
        for name in names:
            if name not in self._blocks:
                break
            n += 1
        return n

    def insert(self, names: Sequence[int]) -> None:
        """The replica is about to hold this prompt. Deepest block first, so that a prefix is always more
        recent than what extends it and eviction takes leaves before the prefixes they hang from."""
        blocks = self._blocks
        for name in reversed(names):
            if name in blocks:
                blocks.move_to_end(name)
            else:
                blocks[name] = None
        self.evict()

    def evict(self) -> None:
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def resize(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.evict()

    def clear(self) -> None:
        self._blocks.clear()
