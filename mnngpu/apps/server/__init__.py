"""An OpenAI-compatible HTTP server over one loaded model (needs `pip install 'mnngpu[serve]'`).

    from mnngpu.apps.server.app import create_app        # imports starlette
    from mnngpu.apps.server.engine import ServedModel    # does not
    app = create_app(ServedModel(llm, "my-model"))       # a Starlette app; run it with uvicorn

app.py is the HTTP side, engine.py the queue in front of the model, choice.py one choice of a
request, fields.py the table of OpenAI request fields, protocol.py the request parsing,
replies.py the response shapes, logprobs.py the log-probabilities and the request's sampler,
tokens.py /tokenize and /detokenize, stop.py the stop strings, lifecycle.py the socket and the
two-step shutdown.
"""
