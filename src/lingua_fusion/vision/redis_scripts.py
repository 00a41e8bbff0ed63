"""The Lua steps of the Redis vocabulary store (``redis_store.py``): each check and the write it guards run as one
script, so gateways writing at once cannot pass a limit together.

Every script gets the same keys (``vocab_keys``): KEYS[1..6] the vocabulary's (record, examples, meta, frames,
features, glosses), KEYS[7..9] its owner's (vocabulary ids, bytes, and the set of owners). A write is safe to
send again (redis-py may after a broken connection): an example or vocabulary id that is there already is left as
it is. Every change to a vocabulary's examples raises its record's ``version``.
"""

from __future__ import annotations

from ..state import redis_keys as keys


def vocab_keys(owner: str, vocab_id: str) -> list[str]:
    return [keys.vocab(vocab_id), keys.vocab_examples(vocab_id), keys.vocab_example_meta(vocab_id),
            keys.vocab_frames(vocab_id), keys.vocab_features(vocab_id), keys.vocab_glosses(vocab_id),
            keys.vocabs_of_owner(owner), keys.vocab_bytes_of_owner(owner), keys.vocab_owners()]


# put(eid, gloss, meta, frames, features, created): one example, unless its id is there; 1 when written
_PUT = """
local function put(eid, gloss, meta, frames, feats, created)
  if redis.call('ZSCORE', KEYS[2], eid) then return 0 end
  local size = string.len(frames)
  redis.call('HSET', KEYS[3], eid, meta)
  redis.call('HSET', KEYS[4], eid, frames)
  redis.call('HSET', KEYS[5], eid, feats)
  redis.call('ZADD', KEYS[2], created, eid)
  redis.call('HINCRBY', KEYS[6], gloss, 1)
  redis.call('HINCRBY', KEYS[1], 'bytes', size)
  redis.call('INCRBY', KEYS[8], size)
  return 1
end
local function used()
  return tonumber(redis.call('GET', KEYS[8]) or '0')
end
"""

# a vocabulary (ARGV: owner, id, name, kind, lang, created, max per owner) unless the owner keeps that many:
# 1 made, 0 no room, 2 there already (this owner's), -1 the id is another owner's
CREATE = _PUT + """
local function create()
  if redis.call('EXISTS', KEYS[1]) == 1 then
    if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then return 2 end
    return -1
  end
  if redis.call('ZCARD', KEYS[7]) >= tonumber(ARGV[7]) then return 0 end
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'name', ARGV[3], 'kind', ARGV[4], 'lang', ARGV[5],
             'created', ARGV[6], 'bytes', 0, 'version', 0)
  redis.call('ZADD', KEYS[7], ARGV[6], ARGV[2])
  redis.call('SADD', KEYS[9], ARGV[1])
  return 1
end
"""

CREATE_ONE = CREATE + "return create()"

# one example (ARGV: owner, max examples, max bytes, eid, gloss, meta, frames, features, created) within the
# limits: {'ok', version} | {'not_found'} | {'max_examples'} | {'max_bytes', used}
ADD_EXAMPLE = _PUT + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return {'not_found'} end
if redis.call('ZSCORE', KEYS[2], ARGV[4]) then return {'ok', redis.call('HGET', KEYS[1], 'version')} end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return {'max_examples'} end
local u = used()
if u + string.len(ARGV[7]) > tonumber(ARGV[3]) then return {'max_bytes', tostring(u)} end
put(ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
return {'ok', tostring(redis.call('HINCRBY', KEYS[1], 'version', 1))}
"""

# a vocabulary with all its examples (ARGV: the CREATE's seven, max bytes, then six per example: eid, gloss,
# meta, frames, features, created), all or nothing: {'ok'} | {'max_vocabularies'} | {'max_bytes', used}
IMPORT = CREATE + """
local size = 0
for i = 9, #ARGV, 6 do size = size + string.len(ARGV[i + 3]) end
local u = used()
if u + size > tonumber(ARGV[8]) then return {'max_bytes', tostring(u)} end
local made = create()
if made == 0 then return {'max_vocabularies'} end
if made == -1 then return {'taken'} end
for i = 9, #ARGV, 6 do put(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
return {'ok'}
"""

# one example as it was stored elsewhere (ARGV: eid, gloss, meta, frames, features, created), no limit checked:
# 1 written, 0 there already, -1 no such vocabulary
RESTORE_EXAMPLE = _PUT + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local n = put(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
if n == 1 then redis.call('HINCRBY', KEYS[1], 'version', 1) end
return n
"""

# ARGV: owner, example id: 1 deleted, 0 no such example, -1 no such vocabulary (of this owner)
DELETE_EXAMPLE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
local meta = redis.call('HGET', KEYS[3], ARGV[2])
if not meta then return 0 end
local size = redis.call('HSTRLEN', KEYS[4], ARGV[2])
local gloss = cjson.decode(meta)['gloss']
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[2])
redis.call('HDEL', KEYS[5], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('HINCRBY', KEYS[6], gloss, -1) <= 0 then redis.call('HDEL', KEYS[6], gloss) end
redis.call('HINCRBY', KEYS[1], 'bytes', -size)
redis.call('DECRBY', KEYS[8], size)
redis.call('HINCRBY', KEYS[1], 'version', 1)
return 1
"""

# ARGV: owner, vocabulary id: 1 deleted, 0 no such vocabulary (of this owner). UNLINK: a large one's memory is
# freed off Redis's main thread
DELETE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local size = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('ZREM', KEYS[7], ARGV[2])
if redis.call('ZCARD', KEYS[7]) == 0 then
  redis.call('DEL', KEYS[8])
  redis.call('SREM', KEYS[9], ARGV[1])
elseif size > 0 then
  redis.call('DECRBY', KEYS[8], size)
end
return 1
"""
