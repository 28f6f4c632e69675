"""The chat layer, dialect-neutral: what every API dialect shares between its wire format
and the engine.

* ``request``: sampling resolution (request fields over server defaults, ranges checked),
  stop strings, output limits and loop policy.
* ``prompt``: typed messages (``mlxcel.types.messages``) -> rendered, tokenized
  ``PromptInput``: template variables, ``add_generation_prompt`` /
  ``continue_final_message``, media refusal, and the order of the rules below.
* ``tool_choice``: which tools are rendered and the directive to call one.
* ``thinking``: earlier turns' reasoning (``preserve_thinking``, the rolling-checkpoint
  rule).
* ``reasoning``: a checkpoint's reasoning spec (the family's, or detected), whether a
  prompt ends inside an open reasoning block, and the splitters of the answer's text.
* ``tokens``: prompt text -> token ids within the context window.
* ``output``: the per-answer state machine, engine events -> typed deltas
  (``mlxcel.types.deltas``): stop strings, the reasoning split and the tool parser, the
  one place that holds text back at token boundaries.
* ``answer``: the deltas of a whole answer gathered, for non-streaming responses.

A dialect maps its wire fields to these and the results back to its frames; it holds no
rule of its own about sampling, templates or output parsing.
"""
