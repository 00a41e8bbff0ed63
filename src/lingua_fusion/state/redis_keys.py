"""Every Redis key name the project uses, in one place."""

PREFIX = "lf:"


def stream_log(stream_id: str) -> str:
    """List of committed final events (JSON), in sequence order: the write-ahead log."""
    return f"{PREFIX}stream:{stream_id}:log"


def stream_epoch(stream_id: str) -> str:
    """The stream's owner epoch alone (an int), written with the snapshot by a resume's claim: what the take-over
    watch reads every second without fetching whole snapshots (api/takeover.py). Absent: never resumed."""
    return f"{PREFIX}stream:{stream_id}:epoch"


def stream_snapshot(stream_id: str) -> str:
    """Hash: the state needed to continue the stream (spec, token digest, last seq, committed_until, ...)."""
    return f"{PREFIX}stream:{stream_id}:snap"


def room(room_id: str) -> str:
    """String: a room's record (JSON: owner, state, source, the publisher's targets and stream id)."""
    return f"{PREFIX}room:{room_id}"


def room_tokens(room_id: str) -> str:
    """Hash: the room's listener tokens, token id -> JSON ``{digest (SHA-256), created, label}``."""
    return f"{PREFIX}room:{room_id}:listener-tokens"


def room_presence(room_id: str) -> str:
    """Sorted set: ``listener_id|lang`` scored by the wall-clock time its presence expires."""
    return f"{PREFIX}room:{room_id}:presence"


def room_live(room_id: str) -> str:
    """Redis stream (MAXLEN ~): the room's live events (JSON in field ``e``), read by one follower per gateway."""
    return f"{PREFIX}room:{room_id}:live"


def room_finals(room_id: str) -> str:
    """Sorted set: the room's finals (JSON) scored by seq, the last N kept: late joiners' history."""
    return f"{PREFIX}room:{room_id}:finals"


def rooms_open_of_owner(key_id: str) -> str:
    """Sorted set: the waiting and live rooms an API key created, scored by when their record expires."""
    return f"{PREFIX}rooms:owner:{key_id}:open"


def rooms_ended_of_owner(key_id: str) -> str:
    """Sorted set: the ended rooms an API key created, scored by when their record expires (the oldest first)."""
    return f"{PREFIX}rooms:owner:{key_id}:ended"


def room_of_stream(stream_id: str) -> str:
    """String: the room a stream publishes into (a resumed publisher re-attaches)."""
    return f"{PREFIX}stream:{stream_id}:room"


def tm_entry(digest: str) -> str:
    """String: one translation-memory entry (JSON), keyed by the digest of (segment, route, glossary version)."""
    return f"{PREFIX}tm:{digest}"


def cluster_gateway(cluster: str, gateway_id: str) -> str:
    """String (JSON, short TTL): a cluster gateway's heartbeat: its pid, its live stream ids, its admitted streams.
    ``cluster``: the cluster's proxy address (host:port), so clusters sharing a Redis do not count each other."""
    return f"{PREFIX}cluster:{cluster}:gateway:{gateway_id}"


def cluster_gateways(cluster: str) -> str:
    """SCAN pattern of every gateway heartbeat of ``cluster``."""
    return f"{PREFIX}cluster:{cluster}:gateway:*"


def cluster_drain(cluster: str) -> str:
    """String (TTL): set by ``serve --cluster`` on SIGTERM: every gateway of ``cluster`` drains its streams."""
    return f"{PREFIX}cluster:{cluster}:drain"


def api_key(digest: str) -> str:
    """Hash: one API key's record (key_id, name, scopes, created, revoked), found by the SHA-256 digest of the key
    itself: authenticating a request is one HGETALL. The key is never stored."""
    return f"{PREFIX}key:{digest}"


def api_key_id(key_id: str) -> str:
    """String: the digest of the key ``key_id`` names (listing, revocation by id)."""
    return f"{PREFIX}key-id:{key_id}"


def api_keys() -> str:
    """Sorted set: every key id, scored by when it was created."""
    return f"{PREFIX}keys"


def glossary(glossary_id: str) -> str:
    """String: one glossary (JSON: owner, name, languages, terms, created)."""
    return f"{PREFIX}glossary:{glossary_id}"


def glossaries_of_owner(key_id: str) -> str:
    """Sorted set: the glossaries an API key uploaded, scored by when (the latest is the default one)."""
    return f"{PREFIX}glossaries:owner:{key_id}"


def glossary_owners() -> str:
    """Set: every key id that has uploaded a glossary (``state migrate`` and its check walk them)."""
    return f"{PREFIX}glossaries:owners"


def stream_quota(key_id: str) -> str:
    """Sorted set: the live streams of an API key on every gateway, scored by when each one's lease lapses
    (stream/quota.py): its size is the key's count against ``server.max_streams_per_key``."""
    return f"{PREFIX}quota:{key_id}:streams"


def stream_quota_holders(key_id: str) -> str:
    """Hash: stream id -> the gateway holding its slot (a resume elsewhere moves it; only the holder releases)."""
    return f"{PREFIX}quota:{key_id}:holders"


def stream_ticket(digest: str) -> str:
    """String (PX: the ticket's lifetime): an unredeemed stream ticket (JSON: key id, admin), found by the SHA-256
    digest of its token; a redeem deletes it, so it opens one stream on whichever gateway (api/redis_tickets.py)."""
    return f"{PREFIX}ticket:{digest}"


def stream_tickets() -> str:
    """Sorted set: every unredeemed ticket's digest, scored by its expiry (the bound on tickets in all)."""
    return f"{PREFIX}tickets"


def stream_tickets_of_key(key_id: str) -> str:
    """Sorted set: one key's unredeemed tickets' digests, scored by expiry (the per-key bound, revocation)."""
    return f"{PREFIX}tickets:key:{key_id}"


def vocab(vocab_id: str) -> str:
    """Hash: a vocabulary's record (owner, name, kind, lang, created), ``bytes`` (the landmark JSON its examples
    hold) and ``version`` (an int raised by every change: each process's cached recogniser is rebuilt on it)."""
    return f"{PREFIX}vocab:{vocab_id}"


def vocab_examples(vocab_id: str) -> str:
    """Sorted set: the vocabulary's example ids scored by when they were taught (the order recognition reads)."""
    return f"{PREFIX}vocab:{vocab_id}:examples"


def vocab_example_meta(vocab_id: str) -> str:
    """Hash: example id -> JSON ``{gloss, frames (how many), created}``."""
    return f"{PREFIX}vocab:{vocab_id}:meta"


def vocab_frames(vocab_id: str) -> str:
    """Hash: example id -> its landmark JSON text, as exported."""
    return f"{PREFIX}vocab:{vocab_id}:frames"


def vocab_features(vocab_id: str) -> str:
    """Hash: example id -> its features (float32 bytes): what the recogniser is built from."""
    return f"{PREFIX}vocab:{vocab_id}:features"


def vocab_glosses(vocab_id: str) -> str:
    """Hash: gloss -> how many of the vocabulary's examples teach it (its length: the distinct glosses)."""
    return f"{PREFIX}vocab:{vocab_id}:glosses"


def vocabs_of_owner(key_id: str) -> str:
    """Sorted set: an API key's vocabulary ids scored by when they were made (its size: the per-key cap)."""
    return f"{PREFIX}vocabs:owner:{key_id}"


def vocab_bytes_of_owner(key_id: str) -> str:
    """String (int): the landmark JSON bytes that an API key's vocabularies hold (``max_bytes`` is checked on it)."""
    return f"{PREFIX}vocabs:owner:{key_id}:bytes"


def vocab_owners() -> str:
    """Set: every API key that keeps a vocabulary (what a migration walks)."""
    return f"{PREFIX}vocabs:owners"


def replica_metrics(replica: str) -> str:
    """String (expiring after three publish intervals): one replica's /metrics page, labelled with its replica and
    role, for the cluster view (metrics_view.py)."""
    return f"{PREFIX}metrics:replica:{replica}"


def replica_metrics_index() -> str:
    """Sorted set: the replicas that published a page, scored by when it expires (what the cluster view reads)."""
    return f"{PREFIX}metrics:replicas"
