"""The constraint backend protocol: the reference for a backend shipped as a plugin.

A backend turns a ``Constraint`` into a ``Compiled`` index for one tokenizer's
``TokenVocabulary``; the engine gives each constrained row a ``Matcher`` from it. The
backend owns no thread, no cache and no MLX array: ``ConstraintCompiler`` runs ``compile``
and ``dump`` in a compile worker process (so a backend pickles: ``workers``), ``load``s the
bytes in the server and keeps the results (in memory and on disk), and the engine step
owns the mask buffer and applies it.

The mask format is the one outlines-core writes: a row of ``mask_words(n)`` int32 words
in which bit ``t % 32`` of word ``t // 32`` allows token ``t``. The engine allocates one
C-contiguous ``(B, W)`` int32 numpy buffer per step (``W >= mask_words(vocabulary.size)``,
usually ``mask_words`` of the logits width) and hands each constrained row's view to its
matcher's ``write_mask_into``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from mlxcel.engine.constraints.vocabulary import TokenVocabulary
    from mlxcel.types.constraints import Constraint


def mask_words(n_tokens: int) -> int:
    """Int32 words of a mask row that covers ``n_tokens`` token ids."""
    return (n_tokens + 31) // 32


@runtime_checkable
class Matcher(Protocol):
    """One row's place in a compiled constraint. Used on the engine thread only.

    A matcher made with ``active=False`` constrains nothing until ``start()``: a prompt
    that opens a reasoning block is free until the block ends, and then the constraint
    begins at its first state. EOS (any of the vocabulary's ``eos_ids``) is allowed only
    in an accepting state; after it the row is ``finished``.
    """

    @property
    def active(self) -> bool:
        """Whether the constraint applies to the next token."""
        ...

    @property
    def accepting(self) -> bool:
        """Active, and the tokens so far form a complete match (EOS is allowed now)."""
        ...

    @property
    def finished(self) -> bool:
        """An EOS was accepted: nothing may follow."""
        ...

    def start(self) -> None:
        """Begin constraining at the constraint's first state (no-op when active)."""
        ...

    def write_mask_into(self, row: np.ndarray) -> None:
        """Write the allowed-token mask into ``row``: a C-contiguous int32 view of
        ``W >= mask_words(vocabulary.size)`` words, every word written (words past the
        vocabulary are zero). An inactive matcher allows every token."""
        ...

    def advance(self, token: int) -> bool:
        """Move past the sampled ``token``; False (state unchanged) when the mask did not
        allow it. An inactive matcher accepts any token and stays where it is."""
        ...


@runtime_checkable
class Rewindable(Protocol):
    """A ``Matcher`` that can take its last advances back, so that a speculative verify
    step can read the masks after each draft token (``speculate.draft_masks``) and leave
    the row where it was: the row's own tokens then advance it as usual. A matcher
    without it (a plugin's, a reasoning budget's) never drafts."""

    @property
    def max_rollback(self) -> int:
        """How many advances ``rollback`` can take back."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` successful advances (an accepted EOS included)."""
        ...


@runtime_checkable
class Compiled(Protocol):
    """A constraint compiled for one vocabulary; shared by every row that uses it."""

    def matcher(self, *, active: bool = True) -> Matcher:
        """A fresh matcher at the constraint's first state."""
        ...


@runtime_checkable
class ConstraintBackend(Protocol):
    """Compiles constraints. ``name`` and ``cache_tag`` are part of the compile cache's
    key, so a backend that changes its output format or options changes its tag."""

    name: str
    cache_tag: str

    def check(self, constraint: Constraint) -> None:
        """Raise an ``InvalidRequest`` subclass if the constraint cannot be compiled,
        without compiling: cheap, so the request path can refuse it early."""
        ...

    def compile(self, constraint: Constraint, vocabulary: TokenVocabulary) -> Compiled:
        """Build the index: slow, runs in a compile worker process (killed at the timeout).
        Raises what ``check`` raises, or an ``InvalidRequest`` subclass when no output
        of this vocabulary can match."""
        ...

    def dump(self, compiled: Compiled) -> bytes:
        """The compiled index as bytes for the persistent cache."""
        ...

    def load(self, data: bytes, constraint: Constraint,
             vocabulary: TokenVocabulary) -> Compiled:
        """The inverse of ``dump`` for the same constraint and vocabulary."""
        ...
