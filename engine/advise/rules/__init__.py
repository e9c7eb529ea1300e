"""The advisor's rules, one module per family. Each rule takes the run (``RunData``) and returns
findings (usually zero or one), firing only on evidence in the data.

``startup`` (the server did not start), ``memory`` (the KV cache and GPU memory), ``client`` (this
client or vLLM's API server sets the pace), ``batching`` (the queue, prefill against decode in a
step), ``gpu`` (tensor parallel, kernel launches, CUDA graphs), ``speculative``; what several read
in ``common``. ``engine.advise.advisor.RULES`` runs them in order.
"""
