from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_SOURCE_PEER: _ClassVar[KVSource]
    KV_SOURCE_LOCAL: _ClassVar[KVSource]

class HandoffMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANDOFF_NONE: _ClassVar[HandoffMode]
    HANDOFF_ONESHOT: _ClassVar[HandoffMode]
    HANDOFF_CHUNKED: _ClassVar[HandoffMode]
    HANDOFF_AUTO: _ClassVar[HandoffMode]
    HANDOFF_KV: _ClassVar[HandoffMode]
KV_SOURCE_PEER: KVSource
KV_SOURCE_LOCAL: KVSource
HANDOFF_NONE: HandoffMode
HANDOFF_ONESHOT: HandoffMode
HANDOFF_CHUNKED: HandoffMode
HANDOFF_AUTO: HandoffMode
HANDOFF_KV: HandoffMode

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "max_tokens", "mode", "handoff")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    mode: str
    handoff: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., mode: _Optional[str] = ..., handoff: _Optional[str] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("index", "token", "worker", "t_ns")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    T_NS_FIELD_NUMBER: _ClassVar[int]
    index: int
    token: int
    worker: str
    t_ns: int
    def __init__(self, index: _Optional[int] = ..., token: _Optional[int] = ..., worker: _Optional[str] = ..., t_ns: _Optional[int] = ...) -> None: ...

class GenerateDone(_message.Message):
    __slots__ = ("request_id", "route", "finish_reason", "duplicates", "md_cached_tokens", "notes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    MD_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    route: str
    finish_reason: str
    duplicates: int
    md_cached_tokens: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., route: _Optional[str] = ..., finish_reason: _Optional[str] = ..., duplicates: _Optional[int] = ..., md_cached_tokens: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("token", "done")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    token: Token
    done: GenerateDone
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., done: _Optional[_Union[GenerateDone, _Mapping]] = ...) -> None: ...

class KVTarget(_message.Message):
    __slots__ = ("path", "kv_address", "drc_address", "start_tokens")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KV_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DRC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    START_TOKENS_FIELD_NUMBER: _ClassVar[int]
    path: str
    kv_address: str
    drc_address: str
    start_tokens: int
    def __init__(self, path: _Optional[str] = ..., kv_address: _Optional[str] = ..., drc_address: _Optional[str] = ..., start_tokens: _Optional[int] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "targets", "use_prefix_cache")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    USE_PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    targets: _containers.RepeatedCompositeFieldContainer[KVTarget]
    use_prefix_cache: bool
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., targets: _Optional[_Iterable[_Union[KVTarget, _Mapping]]] = ..., use_prefix_cache: _Optional[bool] = ...) -> None: ...

class PrefillReply(_message.Message):
    __slots__ = ("first_token", "t_ns", "cached_tokens", "computed_tokens", "sent_from_tokens", "wan", "lines")
    class LinesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: WanEstimate
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[WanEstimate, _Mapping]] = ...) -> None: ...
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    T_NS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SENT_FROM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WAN_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    first_token: int
    t_ns: int
    cached_tokens: int
    computed_tokens: int
    sent_from_tokens: _containers.RepeatedScalarFieldContainer[int]
    wan: WanEstimate
    lines: _containers.MessageMap[str, WanEstimate]
    def __init__(self, first_token: _Optional[int] = ..., t_ns: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., sent_from_tokens: _Optional[_Iterable[int]] = ..., wan: _Optional[_Union[WanEstimate, _Mapping]] = ..., lines: _Optional[_Mapping[str, WanEstimate]] = ...) -> None: ...

class WanEstimate(_message.Message):
    __slots__ = ("rate_mbit", "rtt_ms", "min_rtt_ms", "retrans_pct", "samples")
    RATE_MBIT_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_RTT_MS_FIELD_NUMBER: _ClassVar[int]
    RETRANS_PCT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    rate_mbit: float
    rtt_ms: float
    min_rtt_ms: float
    retrans_pct: float
    samples: int
    def __init__(self, rate_mbit: _Optional[float] = ..., rtt_ms: _Optional[float] = ..., min_rtt_ms: _Optional[float] = ..., retrans_pct: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class CancelReply(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "max_tokens", "kv_source", "use_prefix_cache", "handoff", "handoff_grpc", "handoff_kv", "chunk_tokens", "relay_grpc", "first_index", "prefill_worker")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_SOURCE_FIELD_NUMBER: _ClassVar[int]
    USE_PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_GRPC_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_KV_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RELAY_GRPC_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    kv_source: KVSource
    use_prefix_cache: bool
    handoff: HandoffMode
    handoff_grpc: str
    handoff_kv: str
    chunk_tokens: int
    relay_grpc: str
    first_index: int
    prefill_worker: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., kv_source: _Optional[_Union[KVSource, str]] = ..., use_prefix_cache: _Optional[bool] = ..., handoff: _Optional[_Union[HandoffMode, str]] = ..., handoff_grpc: _Optional[str] = ..., handoff_kv: _Optional[str] = ..., chunk_tokens: _Optional[int] = ..., relay_grpc: _Optional[str] = ..., first_index: _Optional[int] = ..., prefill_worker: _Optional[str] = ...) -> None: ...

class Accepted(_message.Message):
    __slots__ = ("worker", "cached_tokens")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    worker: str
    cached_tokens: int
    def __init__(self, worker: _Optional[str] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class DecodeEnd(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class DecodeEvent(_message.Message):
    __slots__ = ("accepted", "token", "end")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    accepted: Accepted
    token: Token
    end: DecodeEnd
    def __init__(self, accepted: _Optional[_Union[Accepted, _Mapping]] = ..., token: _Optional[_Union[Token, _Mapping]] = ..., end: _Optional[_Union[DecodeEnd, _Mapping]] = ...) -> None: ...

class PrefixQuery(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class PrefixReply(_message.Message):
    __slots__ = ("cached_tokens",)
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    cached_tokens: int
    def __init__(self, cached_tokens: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("prompt_tokens",)
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class LookupReply(_message.Message):
    __slots__ = ("cached_tokens", "active_requests")
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    cached_tokens: int
    active_requests: int
    def __init__(self, cached_tokens: _Optional[int] = ..., active_requests: _Optional[int] = ...) -> None: ...

class KVReadyRequest(_message.Message):
    __slots__ = ("request_id", "worker")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker: str
    def __init__(self, request_id: _Optional[str] = ..., worker: _Optional[str] = ...) -> None: ...

class KVReadyReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HandoffRequest(_message.Message):
    __slots__ = ("request_id", "start_index", "token_ids", "final", "kv", "worker")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    final: bool
    kv: bool
    worker: str
    def __init__(self, request_id: _Optional[str] = ..., start_index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., final: _Optional[bool] = ..., kv: _Optional[bool] = ..., worker: _Optional[str] = ...) -> None: ...

class RelayOutputRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "worker")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    worker: str
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., worker: _Optional[str] = ...) -> None: ...

class RelayOutputReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HandoffReply(_message.Message):
    __slots__ = ("pending_index", "next_token", "extend_ns", "diverged")
    PENDING_INDEX_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXTEND_NS_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    pending_index: int
    next_token: int
    extend_ns: int
    diverged: bool
    def __init__(self, pending_index: _Optional[int] = ..., next_token: _Optional[int] = ..., extend_ns: _Optional[int] = ..., diverged: _Optional[bool] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("worker", "role", "open_requests", "free_blocks", "total_blocks", "active_transfers", "threads", "sockets", "sessions")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OPEN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    SOCKETS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    worker: str
    role: str
    open_requests: int
    free_blocks: int
    total_blocks: int
    active_transfers: int
    threads: int
    sockets: int
    sessions: int
    def __init__(self, worker: _Optional[str] = ..., role: _Optional[str] = ..., open_requests: _Optional[int] = ..., free_blocks: _Optional[int] = ..., total_blocks: _Optional[int] = ..., active_transfers: _Optional[int] = ..., threads: _Optional[int] = ..., sockets: _Optional[int] = ..., sessions: _Optional[int] = ...) -> None: ...
