"""The chat layer, dialect-neutral: what every API dialect shares between its wire format
and the engine.

* ``request``: sampling resolution (request fields over server defaults, ranges checked),
  stop strings, output limits and loop policy.
* ``prompt``: template variables and the rules that shape a prompt.

A dialect maps its wire fields to these and the results back to its frames; it holds no
rule of its own about sampling or templates.
"""
