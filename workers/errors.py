"""Typed errors raised by the inference engine and its KV cache.

Responsible for: one exception class per way a request or a KV transfer can be
refused, each carrying the offending values as attributes and a message that
names them and the allowed range.
Not responsible for: deciding when to raise (the engine and `kvcache` do) or
how a role reports the error to its client.

Hierarchy:

    EngineError
      BadRequest            the request itself is invalid; retrying cannot help
        EmptyPrompt, PromptTooLong, TokenOutOfVocab, BadMaxTokens,
        BadSampling, DuplicateRequest
      UnknownRequest        no request with this id is open
      BadRequestState       the operation does not fit the request's state
      KVImportError         a KV blob cannot be imported
        KVHeaderError, KVChecksumError, KVRangeError
      CapacityExceeded      not enough free KV blocks (now, or ever)
      QueueFull             a bounded waiting queue is full
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine and its KV cache raise on purpose."""


class BadRequest(EngineError):
    """The request is invalid as given; it never entered the engine."""


class EmptyPrompt(BadRequest):
    """The prompt has no tokens."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        super().__init__(f"request {request_id!r}: prompt is empty (need at least 1 token)")


class PromptTooLong(BadRequest):
    """The prompt leaves no room in the context for a generated token."""

    def __init__(self, request_id: str, prompt_tokens: int, max_seq_len: int):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_seq_len = max_seq_len
        super().__init__(
            f"request {request_id!r}: prompt has {prompt_tokens} tokens; "
            f"the context holds {max_seq_len}, so a prompt may have at most {max_seq_len - 1}"
        )


class TokenOutOfVocab(BadRequest):
    """A token ID lies outside [0, vocab_size)."""

    def __init__(self, request_id: str, position: int, token_id: int, vocab_size: int):
        self.request_id = request_id
        self.position = position
        self.token_id = token_id
        self.vocab_size = vocab_size
        super().__init__(
            f"request {request_id!r}: token {token_id} at index {position} is outside the vocabulary [0, {vocab_size})"
        )


class BadMaxTokens(BadRequest):
    """max_tokens is not positive, or prompt + max_tokens exceeds the context."""

    def __init__(self, request_id: str, max_tokens: int, prompt_tokens: int, max_seq_len: int):
        self.request_id = request_id
        self.max_tokens = max_tokens
        super().__init__(
            f"request {request_id!r}: max_tokens={max_tokens} is invalid; it must be in "
            f"[1, {max_seq_len - prompt_tokens}] (context {max_seq_len} - prompt {prompt_tokens})"
        )


class BadSampling(BadRequest):
    """Sampling parameters out of range."""

    def __init__(self, request_id: str, field: str, value: object, allowed: str):
        self.request_id = request_id
        self.field = field
        super().__init__(f"request {request_id!r}: sampling.{field}={value!r} is invalid; allowed: {allowed}")


class DuplicateRequest(BadRequest):
    """A request with this id is already open."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        super().__init__(f"request {request_id!r} is already open")


class UnknownRequest(EngineError):
    """No open request has this id."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        super().__init__(f"no open request {request_id!r}")


class BadRequestState(EngineError):
    """The operation does not fit where the request is (e.g. decode before its prompt KV exists)."""

    def __init__(self, request_id: str, operation: str, reason: str):
        self.request_id = request_id
        self.operation = operation
        super().__init__(f"request {request_id!r}: cannot {operation}: {reason}")


class KVImportError(EngineError):
    """A KV blob cannot be imported; nothing was written."""


class KVHeaderError(KVImportError):
    """The blob's header is malformed or does not match this engine (magic, version, dtype, shape, model)."""

    def __init__(self, field: str, got: object, expected: object):
        self.field = field
        self.got = got
        self.expected = expected
        super().__init__(f"KV blob header: {field} is {got!r}, expected {expected!r}")


class KVChecksumError(KVImportError):
    """The blob's payload does not match the checksum in its header."""

    def __init__(self, got: int, expected: int):
        self.got = got
        self.expected = expected
        super().__init__(f"KV blob checksum mismatch: payload crc32c {got:#010x}, header says {expected:#010x}")


class KVRangeError(KVImportError):
    """The blob's token range or token IDs do not fit the request it is imported into."""

    def __init__(self, request_id: str, reason: str):
        self.request_id = request_id
        super().__init__(f"request {request_id!r}: KV blob does not fit: {reason}")


class CapacityExceeded(EngineError):
    """Not enough free KV blocks; the request holds nothing afterwards.

    never_fits is True when the request needs more than the whole cache, so
    waiting cannot help.
    """

    def __init__(self, request_id: str, needed_blocks: int, available_blocks: int, total_blocks: int, block_size: int):
        self.request_id = request_id
        self.needed_blocks = needed_blocks
        self.available_blocks = available_blocks
        self.total_blocks = total_blocks
        self.never_fits = needed_blocks > total_blocks
        when = "ever (larger than the whole cache)" if self.never_fits else "now"
        super().__init__(
            f"request {request_id!r}: needs {needed_blocks} KV blocks "
            f"({needed_blocks * block_size} tokens), only {available_blocks} of "
            f"{total_blocks} can be freed {when}"
        )


class QueueFull(EngineError):
    """A bounded waiting queue is full; the request was not queued."""

    def __init__(self, request_id: str, max_waiting: int):
        self.request_id = request_id
        self.max_waiting = max_waiting
        super().__init__(f"request {request_id!r} rejected: waiting queue is full ({max_waiting} requests)")
