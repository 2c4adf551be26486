"""helpers.notebook.streaming: the streamers notebook 03 uses on both stacks."""
import torch

from helpers.notebook.streaming import PutRecorder, TimingStreamer, latency_stats


def test_put_recorder_tells_the_calling_conventions_apart():
    per_token = PutRecorder()  # transformers-neuronx sample(): one (batch, 1) tensor per step, then end() once
    for _ in range(3):
        per_token.put(torch.tensor([[5], [6]]))
    per_token.end()
    assert per_token.puts == [(2, 1)] * 3 and per_token.ends == 1
    assert per_token.summary() == "3 put() call(s) of shape (2, 1); end() called 1 time(s)"
    prompt_only = PutRecorder()  # NxD Inference 0.8 generate(): transformers puts the prompt, nothing else
    prompt_only.put(torch.ones(1, 37, dtype=torch.long))
    assert prompt_only.summary() == "1 put() call(s) of shape (1, 37); end() called 0 time(s)"
    assert PutRecorder().summary() == "0 put() call(s) of shape -; end() called 0 time(s)"


def test_timing_streamer_times_a_hand_driven_loop():
    s = TimingStreamer()
    s.reset()
    for t in range(4):
        s.put(torch.tensor([[t]]))
    s.end()
    assert s.tokens.tolist() == [[0, 1, 2, 3]] and s.ended == 1
    stats = latency_stats(s.times)
    assert stats["n_tokens"] == 4 and stats["ttft_s"] >= 0 and stats["itl_median_s"] >= 0


def test_streaming_cost_interleaves_and_reports_a_verdict_not_a_guess():
    from helpers.notebook.streaming import streaming_cost

    calls = []

    def generate(streamer):
        calls.append(streamer is None)
        if streamer is not None:
            for t in range(3):
                streamer.put(torch.tensor([[t]]))
            streamer.end()

    cost = streaming_cost(generate, 3)
    assert calls == [False, True] * 3 and cost.put_share.n == 3 and cost.ttft.n == 3
    assert cost.with_without.a.n == 3 and "streamer's put() calls" in cost.report()
    one = streaming_cost(generate, 1)
    assert "no spread, so no verdict" in one.report()


def test_describe_stream_prints_a_p90_only_with_enough_gaps():
    from helpers.notebook.streaming import MIN_SAMPLES_FOR_P90, describe_stream, per_token_times

    stats = {"ttft_s": 0.1, "total_s": 1.0}
    few = describe_stream([0.1 + 0.01 * i for i in range(5)], stats)
    many = describe_stream([0.1 + 0.01 * i for i in range(MIN_SAMPLES_FOR_P90 + 2)], stats)
    assert "TTFT 100.0 ms" in few and "p90" not in few and "p90" in many
    nxdi = {"ttft_s": None, "total_s": 1.0}
    assert not per_token_times(nxdi) and "deliveries" in describe_stream([1.0, 1.0], nxdi)


def test_streaming_setup_refuses_one_token_and_plots_the_stream():
    import pytest

    from helpers.notebook.streaming import plot_stream_latency, setup_streaming

    with pytest.raises(ValueError, match="max_new_tokens=1"):
        setup_streaming("reference", None, "cpu", 0, None, "Hi", 1, 256, 1, 1)
    assert plot_stream_latency([0.1, 0.12, 0.15]) is not None
