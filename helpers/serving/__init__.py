"""Serving: continuous batching and prefix caching over the engine."""
