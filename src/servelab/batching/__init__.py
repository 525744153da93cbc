"""Dynamic batching: arrivals, service time, Triton's batcher as a discrete-event simulation."""
