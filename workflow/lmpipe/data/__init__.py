"""The data stages: download raw text, tokenize it into llm.c shards, and read them back.

download.py (raw text, the only network use), tokenize.py (GPT-2 BPE into shards),
tokenizer.py (tiktoken's gpt2 from the repo's files), shards.py (the llm.c shard format),
loader.py (the training and validation batches over shards). `python -m lmpipe.data --help`.
"""
