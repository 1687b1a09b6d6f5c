"""The model's bytes, hashed once on the head and copied down the chain of ranks over the fabric, verified."""
