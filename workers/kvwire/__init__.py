"""The KV data plane: framed, checksummed KV cache over plain TCP, separate from gRPC control.

Responsible for: the frame format; sending one transfer (a token range of one
request's KV) over N parallel connections while its layers are still being
produced, with a per-socket congestion-control choice, progress events,
end-to-end acknowledgement, retry on a broken or stalled connection, and
cancellation (`KVSender`), connections kept open between transfers
(`ConnectionPool`); receiving and verifying transfers and handing
complete ones, as engine KV blobs, to whoever expects them (`KVReceiver`,
`Inbox`), within the bounds a broken or hostile peer meets (`ReceiverLimits`).
Not responsible for: what to send or when (the roles), where its settings
come from or where its events go (the roles pass a SendSettings and an
EventSink in: seam.py), importing KV into an engine (workers/engine.py), or
the emulated network under the sockets. It imports nothing of workers/roles/.

Frame (little-endian), FRAME_HEADER then payload_len bytes of payload:

    magic "PKVF" | version u8 | type u8 | layer u16 | transfer_id u64 |
    token_offset u32 | token_count u32 | payload_len u32 | crc32c(payload) u32

(version 2; version 1 used zlib's crc32, 3x slower than the SSE4.2 crc32c.)

Types, sender -> receiver: BEGIN (payload: JSON TransferMeta), LAYER (the K
then V of tokens [token_offset, +token_count) of one layer: payload is
2 x token_count x row_bytes), END (payload: JSON {next_token, chunks}),
CANCEL, RESUME (a retry of the same transfer_id asks what the receiver holds); receiver -> sender:
ACK (the transfer is complete and verified), HAVE (answer to RESUME: JSON {state: new | partial |
done, chunks: [[layer, token_offset], ...]}).
Connection 0 of a transfer carries BEGIN, its share of LAYER chunks, END and
the ACK; connection c carries chunks c, c+N, ... Chunks may arrive before
BEGIN (other connections) and are buffered until it does. A transfer is
complete when BEGIN, END and every chunk have arrived. Any malformed,
truncated or corrupted frame closes its connection (error event). A transfer
whose connection died is kept by the receiver (RESUME_KEEP_S); the sender's
retry keeps the transfer_id, asks with RESUME and sends only the chunks the
receiver lacks (BEGIN too when it never arrived), so a retry under loss does
not start over. A chunk that arrives twice (its first copy raced the
connection's death) is checked and not counted again. A RESUME makes the
transfer's other connections stale: a BEGIN still waiting on one of them
(for a session not yet open) is dropped quietly with that connection
(kv_conn_refused), never the live attempt.
"""

from workers.kvwire.blob import BufferPool, ChunkCrcs, blob_buffer, fold_chunk_crcs, seal_blob
from workers.kvwire.frame import (
    ACK,
    BEGIN,
    CANCEL,
    END,
    FRAME_HEADER,
    FRAME_MAGIC,
    FRAME_TYPES,
    FRAME_VERSION,
    LAYER,
    FrameError,
    TransferFailed,
    TransferMeta,
    meta_for,
    pack_frame,
)
from workers.kvwire.inbox import Inbox, ReceivedTransfer
from workers.kvwire.limits import ReceiverLimits
from workers.kvwire.receiver import KVReceiver
from workers.kvwire.seam import EventSink, SendSettings
from workers.kvwire.sender import KVSender, SendResult, send_blob, start_blob
from workers.kvwire.sockets import (
    CONNECTIONS,
    ConnectionPool,
    available_congestion,
    count_socket_fds,
    parse_address,
    recv_exact,
    send_all,
    set_congestion,
)

__all__ = [
    "ACK",
    "BEGIN",
    "CANCEL",
    "CONNECTIONS",
    "END",
    "FRAME_HEADER",
    "FRAME_MAGIC",
    "FRAME_TYPES",
    "FRAME_VERSION",
    "LAYER",
    "BufferPool",
    "ChunkCrcs",
    "ConnectionPool",
    "EventSink",
    "FrameError",
    "Inbox",
    "KVReceiver",
    "KVSender",
    "ReceivedTransfer",
    "ReceiverLimits",
    "SendResult",
    "SendSettings",
    "TransferFailed",
    "TransferMeta",
    "available_congestion",
    "blob_buffer",
    "count_socket_fds",
    "fold_chunk_crcs",
    "meta_for",
    "pack_frame",
    "parse_address",
    "recv_exact",
    "seal_blob",
    "send_all",
    "send_blob",
    "start_blob",
    "set_congestion",
]
