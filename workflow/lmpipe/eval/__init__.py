"""The evaluation stage: each evaluation of lmpipe.registry.EVALUATIONS scores a converted model
and writes one result file (results.py). val_loss.py, hellaswag.py (native, batched), harness.py
(the lm-eval harness, offline), samples.py. `python -m lmpipe.eval --help`.
"""
