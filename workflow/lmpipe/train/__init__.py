"""The training stage: the loop, optimizers and schedule, checkpoints, FSDP2 sharding, the
launcher and metrics. It knows models and data, and nothing of what uses it (chat fine-tuning
brings its own Task to the same loop). `python -m lmpipe.train --help`.
"""
