"""`servelab serve`: an Open Inference Protocol v2 gateway with Triton's dynamic batcher."""
