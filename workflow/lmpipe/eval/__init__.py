"""The evaluation stage: each evaluation of lmpipe.registry.EVALUATIONS scores a converted model
and writes one result file (results.py). val_loss.py, hellaswag.py (native, batched), harness.py
(the one runner of lm-eval on local tasks, offline; HellaSwag through it), samples.py, suite/;
sandbox.py runs model-generated code (a HumanEval executor).
`python -m lmpipe.eval --help`.
"""
