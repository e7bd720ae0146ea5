"""Chat fine-tuning (Vicuna-style SFT) on top of the training stage.

template.py (FastChat's Vicuna v1.1), data.py (ShareGPT conversations -> masked rows), loader.py,
finetune.py (the trainer's worker for fine-tuning runs: it brings its own Task to
lmpipe.train.loop, which knows nothing of chat), evals.py (held-out conversation loss, chat
samples), cli.py (`lmpipe-chat`). `python -m lmpipe.chat --help`.
"""
