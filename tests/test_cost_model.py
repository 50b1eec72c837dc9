"""The cost model's arithmetic against published figures and against itself (no process needed)."""

import pytest

from dp_helpers.scratch.collectives.ring import collective_time, ring_time
from dp_helpers.scratch.cost.calculator import (
    STRATEGIES,
    Cluster,
    Transformer,
    activations,
    collectives,
    memory_per_rank,
    model_states,
    step_time,
)
from dp_helpers.scratch.cost.step_time import after_backward, fit_alpha_beta, overlapped


@pytest.mark.parametrize(("strategy", "published_gb"), [("DDP", 120), ("ZeRO-1", 31.4), ("ZeRO-2", 16.6),
                                                       ("ZeRO-3 / FSDP2", 1.9)])
def test_model_states_match_the_zero_papers_figure_1(strategy, published_gb):
    # Rajbhandari et al. 2020, Figure 1: 7.5 B parameters, 64 data-parallel ranks, K = 12, in GB of 1e9 bytes
    assert sum(model_states(7.5e9, strategy, 64).values()) / 1e9 == pytest.approx(published_gb, abs=0.05)


def test_hsdp_shards_within_its_group_only():
    hsdp, fsdp = model_states(1e9, "HSDP", 64, shard_group=8), model_states(1e9, "ZeRO-3 / FSDP2", 8)
    assert hsdp == fsdp  # 64 ranks in groups of 8 hold what FSDP on 8 ranks holds


def test_activations_follow_korthikanti_and_checkpointing_keeps_each_layers_input():
    m = Transformer(layers=2, hidden=1024, heads=16, vocab=1000, sequence=512, micro_batch=4)
    sbh = 512 * 4 * 1024
    assert activations(m) == 2 * sbh * (34 + 5 * 16 * 512 / 1024)
    assert activations(m, checkpointing=True) == 2 * 2 * sbh


def test_zero3_moves_one_and_a_half_times_ddps_bytes_when_gradients_travel_as_parameters_do():
    # ZeRO section 7: all-reduce = reduce-scatter + all-gather (2 x the gradients' bytes per rank); stage 3 adds a
    # second all-gather of the parameters. That holds when both travel in 16 bits, as in the paper
    def sent(strategy, grad_bytes):
        return sum(collective_time(kind, n, w, 0.0, 1.0)
                   for kind, n, w, _ in collectives(1e9, strategy, 1024, grad_bytes=grad_bytes))

    assert sent("ZeRO-1", 2) == pytest.approx(sent("DDP", 2))
    assert sent("ZeRO-3 / FSDP2", 2) == pytest.approx(1.5 * sent("DDP", 2))
    # with fp32 gradients (torch's default under autocast, FSDP2 with reduce_dtype=float32) DDP sends twice the
    # bf16 bytes, and ZeRO-3's two bf16 all-gathers plus an fp32 reduce-scatter come to DDP's bytes
    assert sent("DDP", 4) == pytest.approx(2 * sent("DDP", 2))
    assert sent("ZeRO-3 / FSDP2", 4) == pytest.approx(sent("DDP", 4))


def test_gradients_travel_in_fp32_unless_told_otherwise():
    for strategy in STRATEGIES:
        reduced = [n for kind, n, _, _ in collectives(1e9, strategy, 64) if kind != "all_gather"]
        assert sum(reduced) == pytest.approx(4e9 * (1 + (strategy == "HSDP") / 8))  # HSDP: its shard, once more
        gathered = [n for kind, n, _, _ in collectives(1e9, strategy, 64) if kind == "all_gather"]
        assert all(n == 2e9 for n in gathered)
    m = Transformer(layers=4, hidden=512, heads=8, vocab=1000, sequence=128, micro_batch=2)
    c = Cluster(gpus=8, flops=1e12, bandwidth=1e9, latency=0.0)
    fp32, bf16 = (step_time(m, "DDP", c, grad_bytes=b)["communication"] for b in (4, 2))
    assert fp32 == pytest.approx(2 * bf16)


@pytest.mark.parametrize(("gpus", "shard_group"), [(12, 8), (4, 8), (64, 0), (10, 4)])
def test_an_hsdp_shape_the_mesh_would_refuse_is_refused_in_one_sentence(gpus, shard_group):
    c = Cluster(gpus=gpus, flops=1e12, bandwidth=1e9, shard_group=shard_group)
    m = Transformer(layers=2, hidden=64, heads=4, vocab=100, sequence=16, micro_batch=1)
    for call in (lambda: step_time(m, "HSDP", c), lambda: memory_per_rank(m, "HSDP", c)):
        with pytest.raises(ValueError, match=f"^HSDP needs a shard group that divides the GPUs: {gpus} GPUs "):
            call()
    assert step_time(m, "DDP", c)["communication"] > 0  # the shard group matters to HSDP alone


def test_an_unknown_strategy_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="'FSDP' is not one of DDP, ZeRO-1, ZeRO-2, ZeRO-3 / FSDP2, HSDP"):
        collectives(1e9, "FSDP", 8)


def test_a_step_is_compute_plus_the_ring_or_the_larger_of_the_two():
    m = Transformer(layers=4, hidden=512, heads=8, vocab=1000, sequence=128, micro_batch=2)
    c = Cluster(gpus=8, flops=1e12, bandwidth=1e9, latency=1e-5)
    for strategy in STRATEGIES:
        t = step_time(m, strategy, c)
        assert t["no overlap"] == pytest.approx(t["compute"] + t["communication"])
        assert t["perfect overlap"] == max(t["compute"], t["communication"])
        assert memory_per_rank(m, strategy, c)["total"] == pytest.approx(
            sum(v for k, v in memory_per_rank(m, strategy, c).items() if k != "total"))
    assert step_time(m, "DDP", c)["compute"] == pytest.approx(6 * m.parameters * 128 * 2 / 1e12)


def test_overlap_hides_all_but_the_last_bucket_when_the_link_keeps_up():
    buckets, alpha, beta = [1e6] * 4, 1e-5, 1e9
    one = ring_time(1e6, 2, alpha, beta)
    assert overlapped(0.01, 0.1, [4e6], 2, alpha, beta) == pytest.approx(after_backward(0.11, [4e6], 2, alpha, beta))
    assert overlapped(0.01, 0.1, buckets, 2, alpha, beta) == pytest.approx(0.11 + one)  # only the last is exposed
    slow = 1e6  # bytes/s: the link, not the backward, decides
    assert overlapped(0.01, 0.1, buckets, 2, alpha, slow) == pytest.approx(0.01 + 0.025 + 4 * ring_time(1e6, 2, alpha, slow))


def test_the_fit_recovers_alpha_and_beta():
    sizes = [1e3, 1e5, 1e6, 1e7]
    alpha, beta = fit_alpha_beta(sizes, [ring_time(n, 4, 3e-5, 2e8) for n in sizes], 4)
    assert alpha == pytest.approx(3e-5) and beta == pytest.approx(2e8)


def test_zero3_step_walks_the_units_on_one_serial_link_by_hand():
    from dp_helpers.scratch.cost.step_time import zero3_step

    # two equal units; each gather and each reduce-scatter takes 1 s (one latency step on 2 ranks, bytes free);
    # forward 1 s and backward 2 s per unit
    by_hand = {False: 12.0,  # every collective in a row with the compute: 4 gathers, 2 scatters, 6 s of compute
               True: 9.0}  # each next gather under the current unit's compute; the backward's first gather and last scatter exposed
    for prefetch, seconds in by_hand.items():
        assert zero3_step(2.0, 4.0, [100, 100], 2, 1.0, float("inf"), prefetch=prefetch) == seconds


def test_zero3_step_holds_the_link_for_each_collective_s_overhead_too():
    from dp_helpers.scratch.cost.step_time import zero3_step

    # the same two units with 0.5 s more per collective: 1.5 s each on the link
    by_hand = {False: 15.0,  # 6 collectives in a row with 6 s of compute
               True: 11.0}  # the backward's gathers hold the link until 7 s, its two scatters until 11 s
    for prefetch, seconds in by_hand.items():
        assert zero3_step(2.0, 4.0, [100, 100], 2, 1.0, float("inf"), prefetch=prefetch, overhead=0.5) == seconds
    for prefetch in (True, False):  # on 2 ranks a gather or a scatter is one latency step: an overhead adds alike
        units = [1000, 2 ** 20, 4096]
        assert zero3_step(0.05, 0.1, units, 2, 0.0, 1e8, prefetch=prefetch, overhead=2e-3) == pytest.approx(
            zero3_step(0.05, 0.1, units, 2, 2e-3, 1e8, prefetch=prefetch))


def test_zero3_step_is_the_compute_on_a_free_link_and_prefetch_never_loses():
    from dp_helpers.scratch.cost.step_time import zero3_step

    assert zero3_step(0.1, 0.2, [10, 20, 30], 4, 0.0, float("inf"), prefetch=False) == pytest.approx(0.3)
    for alpha in (1e-5, 1e-3, 1e-1):
        for beta in (1e6, 1e9):
            units = [1000, 2 ** 20, 2 ** 20, 4096]
            ahead, asked = (zero3_step(0.05, 0.1, units, 2, alpha, beta, prefetch=p) for p in (True, False))
            assert ahead <= asked and ahead >= 0.15  # never slower; never below the compute


# The Ultra-Scale Playbook (Hugging Face, 2025), its chart of activation memory against sequence length: Llama 3.1
# 8B, 70B and 405B, one sequence per GPU, no recomputation, GiB, as published in the chart's data
PLAYBOOK_ACTIVATIONS = {(32, 4096, 32): [9.25390625, 28.5078125, 97.015625, 354.03125, 1348.0625],
                        (80, 8192, 64): [46.2578125, 142.515625, 485.03125, 1770.0625, 6740.125],
                        (126, 16384, 128): [145.703125, 448.90625, 1527.8125, 5575.625, 21231.25]}


@pytest.mark.parametrize(("shape", "published"), PLAYBOOK_ACTIVATIONS.items())
def test_activations_match_the_ultrascale_playbooks_chart(shape, published):
    layers, hidden, heads = shape
    for s, gib in zip((1024, 2048, 4096, 8192, 16384), published, strict=True):
        ours = activations(Transformer(layers, hidden, heads, 128_256, s, 1))
        assert gib * 2**30 - ours == s * hidden  # the chart counts one more s*b*h bytes (b = 1), nothing else
