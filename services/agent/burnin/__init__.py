"""Burn-in of a node's GPUs before it takes work (`whaleflux test-gpu`, the agent's validation gate).

`plan.py` says what to run, `spec.py` what the model should achieve (gpu_models.yaml),
`card.py` judges measurements into a report card (pure), `run.py` drives an exerciser
(`cuda.py` on real GPUs, `simulated.py` for simulated ones) while sampling the GPU
backend, `ptx.py` holds the device kernels, `gate.py` decides when a node must validate.
"""
