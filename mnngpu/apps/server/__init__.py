"""An OpenAI-compatible HTTP server over one or several loaded models (needs `pip install 'mnngpu[serve]'`).

    from mnngpu.apps.server.app import create_app        # imports starlette
    from mnngpu.apps.server.engine import ServedModel    # does not
    app = create_app(ServedModel(llm, "my-model"))       # a Starlette app; run it with uvicorn

app.py is the HTTP side, models.py the served models (loaded on first use, the least recently used
unloaded past --models-max), engine.py the queue in front of an LLM, slots.py and prompt_blocks.py
its slots and the prompt cache they share, choice.py one choice of a request, fields.py the table
of request fields, protocol.py the request parsing, replies.py the response shapes, reasoning.py a
thinking model's <think> split, logprobs.py the log-probabilities and the request's sampler,
anthropic_messages.py and openai_responses.py the two agent APIs over the chat route
(translation.py), embeddings.py and rerank.py the retrieval routes (kinds.py, served_worker.py),
tokens.py /tokenize and /detokenize, stop.py the stop strings, page/ the chat page at /,
lifecycle.py the socket and the two-step shutdown.
"""
