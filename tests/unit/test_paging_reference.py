"""The KV paging replay (event-driven: a running sequence takes a turn of its own only
at a block boundary or its last token, and each step's memory is kept as it changes)
held to the same replay written plainly (tests/reference/paging_plain.py: every
sequence decodes each step, the memory summed over them), result for result, over
generated workloads and every strategy."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.llm.paging import LENGTH_MODELS, Strategy, simulate_paging, synthetic_workload
from tests.reference.paging_plain import simulate_paging as plain_paging


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(sorted(LENGTH_MODELS)), n=st.integers(1, 300),
       rate=st.sampled_from([0.02, 0.3, 1.0, 4.0]),
       max_len=st.sampled_from([64, 256, 1024, 4096]),
       prefix=st.sampled_from([0, 16, 40, 200]),
       pool_tokens=st.sampled_from([600, 3_000, 20_000, 200_000]),
       block_size=st.sampled_from([1, 8, 16, 32]), max_num_seqs=st.sampled_from([1, 4, 256]),
       seed=st.integers(0, 2**16))
def test_the_event_driven_replay_is_the_plain_one(model, n, rate, max_len, prefix,
                                                  pool_tokens, block_size, max_num_seqs,
                                                  seed):
    work = synthetic_workload(model, n, rate, max_len, min(prefix, max_len - 2),
                              np.random.default_rng(seed))
    for strategy in Strategy:
        got = simulate_paging(work, strategy, pool_tokens, block_size, max_len, max_num_seqs,
                              max_steps=200_000)
        want = plain_paging(work, strategy, pool_tokens, block_size, max_len, max_num_seqs,
                            max_steps=200_000)
        assert dataclasses.asdict(got) == dataclasses.asdict(want), strategy
