"""A small nanochat-style GPT trainer, and ddpwatch's instrument for known-bad runs.

    python -m trainer --steps 3
    torchrun --standalone --nproc_per_node=2 -m trainer --fault hang:rank=1:step=20

See train.py for the knobs and faults.py for the faults.
"""
