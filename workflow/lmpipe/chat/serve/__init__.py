"""`lmpipe serve MODEL_DIR`: a converted chat model behind an OpenAI-compatible API, and a chat
page in the browser.

    lmpipe serve results/runs/embedded-a-chat/model/hf            # http://127.0.0.1:8000/
    python -m lmpipe.chat.serve results/runs/embedded-a-chat/model/hf --port 8001 --api-key KEY

Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (streamed as server-sent
events when asked), and the page at /. As lm-sys/FastChat's fastchat/serve/openai_api_server.py
does, with the model in this process rather than behind a controller and workers: chat messages
are rendered with the run's Vicuna v1.1 template (lmpipe.chat.template, the prompt the model was
fine-tuned on) and the model's own `generate` writes the reply with its KV cache
(lmpipe.chat.cli.generate_ids, as `lmpipe-chat` does). One generation runs at a time, the others
wait in a queue of `--max-queue`; a client that leaves stops its generation.

cli: the command line; app: the routes and OpenAI's shapes; engine: the queue and generation;
page.html: the chat page.
"""
