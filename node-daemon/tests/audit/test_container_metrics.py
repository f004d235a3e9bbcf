"""Per-container metrics: the ledger's wait histogram as Prometheus buckets (exact), and
series that go with their container."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from tessera_node import metrics
from tessera_node.budget.ledger import WAIT_BUCKETS


def ledger_hist(waits_ns: list[int]) -> tuple[int, ...]:
    """What hook/src/tokens.c records: bucket = bit length of the wait in whole µs, ≤ 31."""
    h = [0] * WAIT_BUCKETS
    for w in waits_ns:
        h[min(31, (w // 1000).bit_length())] += 1
    return tuple(h)


@given(st.lists(st.integers(0, 1 << 42), max_size=60))
def test_buckets_count_exactly_the_waits_below_each_bound(waits: list[int]) -> None:
    buckets = metrics.wait_buckets(ledger_hist(waits))
    assert buckets[-1] == ("+Inf", float(len(waits)))
    counts = [c for _, c in buckets]
    assert counts == sorted(counts)
    for (le, count), e in zip(buckets, metrics.WAIT_BUCKET_EXPONENTS, strict=False):
        assert float(le) == (1 << e) / 1e6
        assert count == sum(w < (1 << e) * 1000 for w in waits)


def test_series_go_with_their_container() -> None:
    fig = metrics.ContainerFigures("team", "p", "c", "GPU-1", 300, 400, 50.0, 12.5,
                                   ledger_hist([5_000, 20_000_000]), 0.02, False)
    metrics.CONTAINERS.set([fig])
    text = generate_latest().decode()
    labels = 'container="c",gpu="GPU-1",namespace="team",pod="p"'
    assert f"tessera_container_memory_budget_bytes{{{labels}}} 400.0" in text
    assert f"tessera_container_memory_used_bytes{{{labels}}} 300.0" in text
    assert f"tessera_container_core_budget_percent{{{labels}}} 50.0" in text
    assert f"tessera_container_utilization_percent{{{labels}}} 12.5" in text
    assert ('tessera_container_token_wait_seconds_bucket{container="c",gpu="GPU-1",'
            'le="0.016384",namespace="team",pod="p"} 1.0') in text
    assert f"tessera_container_token_wait_seconds_count{{{labels}}} 2.0" in text
    metrics.CONTAINERS.set([])
    assert 'pod="p"' not in generate_latest().decode()
