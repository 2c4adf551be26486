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
