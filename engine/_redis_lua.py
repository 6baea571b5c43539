"""The Lua scripts of :class:`~weir.engine._redis_store.RedisStore`: one per atomic step.

Theory of operation
-------------------
Every step that must be atomic across replicas -- creating, rebinding or deleting a
session, claiming and finishing a call, appending to and reading a stream,
renewing and expiring claim leases, allocating an epoch -- is one script, run with
``EVALSHA`` on the server that holds the session's keys, so no other client's
command interleaves with it.  The scripts share a prelude (the session's fixed
keys, its TTL, and the epoch permutation, a Lua twin of
:func:`weir.protocol._event_ids.scramble_epoch` that must agree with it bit for bit; the store
contract tests check that).  Statuses come back as plain strings; the Python side
in ``_redis_store`` turns them into the store interface's types and errors.

Key layout and the meaning of every hash field are described in
``_redis_connection``'s module docstring.
"""

from __future__ import annotations

from weir.protocol.gate import ENTRY_OVERHEAD

# The epoch permutation (protocol.scramble_epoch), in Lua: a four-round Feistel network
# on the 32-bit counter keyed by the session's salt; ``inverse`` undoes it.
_FEISTEL = """
local function weir_feistel(salt, n, inverse)
  local L, R = math.floor(n / 65536), n % 65536
  if not inverse then
    for i = 0, 3 do
      local h = redis.sha1hex(salt .. string.char(i, math.floor(R / 256), R % 256))
      L, R = R, bit.bxor(L, tonumber(string.sub(h, 1, 4), 16))
    end
  else
    for i = 3, 0, -1 do
      local h = redis.sha1hex(salt .. string.char(i, math.floor(L / 256), L % 256))
      L, R = bit.bxor(R, tonumber(string.sub(h, 1, 4), 16)), L
    end
  end
  return L * 65536 + R
end
-- The counter value of an epoch of the session whose record is ``record`` (0: not one).
local function weir_epoch_number(record, epoch)
  local value = tonumber(epoch, 16)
  if not value then return 0 end
  return weir_feistel(redis.call('HGET', record, 'salt') or '', value, true)
end
"""

# KEYS[1] = the stream, KEYS[2] = the session record.  ARGV: epoch (hex), epoch.
_INFO = (
    _FEISTEL
    + """
local allocated = tonumber(redis.call('HGET', KEYS[2], 'epochs') or '0')
local n = weir_epoch_number(KEYS[2], ARGV[1])
if n < 1 or n > allocated then return false end
local binding = redis.call('HGET', KEYS[2], 'b:' .. ARGV[2]) or '0'
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return {binding, -1, '0'} end
local f = {}
local flat = last[1][2]
for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
return {binding, tonumber(string.match(last[1][1], '^(%d+)-')) - 1, f['f'] or '0'}
"""
)

# Mailboxes (cross-replica answers and cancellations): KEYS[1] = the box.
_POST = """
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""
_TAKE = """
local items = redis.call('LRANGE', KEYS[1], 0, -1)
if ARGV[1] == '0' and #items > 0 then redis.call('DEL', KEYS[1]) end
return items
"""

# Tasks: KEYS[1] = the task (a hash: v = version, d = data), KEYS[2] = the
# principal's tasks (a sorted set: id scored by its expiry, server time in ms).
# ARGV: expected version, data, ttl (ms), cap, task id.  Returns 'written',
# 'conflict' (another version, or expired) or 'full' (a creation past the cap).
_PUT_TASK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stored = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if stored ~= tonumber(ARGV[1]) then return 'conflict' end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if stored == 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 'full' end
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'v', stored + 1, 'd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[5])
local longest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], math.max(now + ttl, tonumber(longest[2])))
return 'written'
"""


# --------------------------------------------------------------------------- Lua
#
# Every script gets the session's fixed keys first:
#   KEYS[1] = s (record)  KEYS[2] = k (stream index)  KEYS[3] = c (calls)  KEYS[4] = x (expiry)
# and ARGV[1] = the TTL in milliseconds.  Statuses come back as plain strings.

_PRELUDE = (
    _FEISTEL
    + """
local S, IDX, CALLS, CEXP = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local TTL = tonumber(ARGV[1])
local function touch()
  redis.call('PEXPIRE', S, TTL)
  redis.call('PEXPIRE', IDX, TTL)
  redis.call('PEXPIRE', CALLS, TTL)
  redis.call('PEXPIRE', CEXP, TTL)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function new_epoch()
  local n = redis.call('HINCRBY', S, 'epochs', 1)
  if n > 4294967295 then error('weir: the epoch space of this session is exhausted') end
  return string.format('%08x', weir_feistel(redis.call('HGET', S, 'salt') or '', n, false))
end
local function wipe_streams()
  local names = redis.call('SMEMBERS', IDX)
  for _, name in ipairs(names) do redis.call('DEL', name) end
end
-- The gate's tally, as the in-process ledger keeps it: finished calls ('n') and bytes
-- ('b': every key, running or finished, at its length plus the entry overhead, and
-- every stored response).  Entries written before the tally existed may take it below
-- zero as they go: it is then restarted at zero.
local OVERHEAD = @ENTRY_OVERHEAD@
local function tally(calls, nbytes)
  if calls ~= 0 then redis.call('HINCRBY', CALLS, 'n', calls) end
  if redis.call('HINCRBY', CALLS, 'b', nbytes) < 0 then
    redis.call('HSET', CALLS, 'n', 0, 'b', 0)
  end
end
-- Forget everything the gate holds for a claim (its fields and its epoch's back-link).
local function forget_call(key)
  if redis.call('HEXISTS', CALLS, 'f:' .. key) == 1 then
    local payload = redis.call('HGET', CALLS, 'p:' .. key)
    if payload then tally(-1, -(#key + OVERHEAD + #payload)) else tally(0, -(#key + OVERHEAD)) end
  end
  local epoch = redis.call('HGET', CALLS, 'e:' .. key)
  if epoch then redis.call('HDEL', CALLS, 'k:' .. epoch) end
  redis.call('HDEL', CALLS, 'f:' .. key, 'p:' .. key, 'r:' .. key, 'e:' .. key, 'l:' .. key,
    'o:' .. key, 'c:' .. key)
  redis.call('ZREM', CEXP, key)
end
-- Store a finished call's response (in place of any it had).
local function keep(key, payload)
  local held = redis.call('HGET', CALLS, 'p:' .. key)
  if held then tally(0, #payload - #held) else tally(1, #payload) end
  redis.call('HSET', CALLS, 'p:' .. key, payload)
end
-- Hold the gate to its bounds, as the in-process ledger does, oldest first (by expiry;
-- running claims are skipped, never dropped): past ``max_calls`` the oldest finished
-- calls are forgotten whole; past ``max_bytes`` the oldest responses but ``just``'s
-- become tombstones ('' -- a retry is told the outcome was evicted, nothing re-runs),
-- and only if the keys alone are over are finished calls forgotten.  At most 128
-- entries are looked at: each finish adds one, so the bounds keep up.
local function trim(just, max_calls, max_bytes)
  local tallied = redis.call('HMGET', CALLS, 'n', 'b')
  local n, b = tonumber(tallied[1] or '0'), tonumber(tallied[2] or '0')
  if n <= max_calls and b <= max_bytes then return end
  local oldest = redis.call('ZRANGE', CEXP, 0, 127)
  local function forget_while(over)
    for _, key in ipairs(oldest) do
      if not over() then return end
      local payload = redis.call('HGET', CALLS, 'p:' .. key)
      if payload then
        n, b = n - 1, b - (#key + OVERHEAD + #payload)
        forget_call(key)
      end
    end
  end
  forget_while(function() return n > max_calls end)
  for _, key in ipairs(oldest) do
    if b <= max_bytes or key == just then break end
    local payload = redis.call('HGET', CALLS, 'p:' .. key)
    if payload and payload ~= '' then
      redis.call('HSET', CALLS, 'p:' .. key, '')
      tally(0, -#payload)
      b = b - #payload
    end
  end
  -- Forgetting keys weakens the gate: only when the finished keys can cover the excess
  -- (the newest response alone may hold it, and is kept).
  local keys = 0
  for _, key in ipairs(oldest) do
    if redis.call('HEXISTS', CALLS, 'p:' .. key) == 1 then keys = keys + #key + OVERHEAD end
  end
  if keys >= b - max_bytes then forget_while(function() return b > max_bytes end) end
end
-- A running claim whose lease ran out: the replica running it is gone.  Its outcome
-- becomes the ``interrupted`` error (it may have had effects: never run it again),
-- stored in the gate and appended as the final event of its response stream.
local function interrupt(key, message)
  local rid = redis.call('HGET', CALLS, 'r:' .. key) or 'null'
  local payload = '{"jsonrpc":"2.0","id":' .. rid .. ',"error":{"code":-32000,"message":'
    .. cjson.encode(message) .. ',"data":{"reason":"interrupted"}}}'
  keep(key, payload)
  redis.call('HDEL', CALLS, 'l:' .. key)
  local epoch = redis.call('HGET', CALLS, 'e:' .. key)
  if epoch then
    local E = string.sub(S, 1, -3) .. ':e:' .. epoch
    local top = redis.call('XREVRANGE', E, '+', '-', 'COUNT', 1)
    local id = 2  -- seq 1: after the (never stored) priming event
    if #top > 0 then id = tonumber(string.match(top[1][1], '^(%d+)-')) + 1 end
    redis.call('XADD', E, id .. '-0', 'd', payload, 'f', '1',
      'b', redis.call('HGET', S, 'b:' .. epoch) or '0', 'r', '')
    redis.call('SADD', IDX, E)
    redis.call('PEXPIRE', E, TTL)
  end
  return payload
end
"""
).replace("@ENTRY_OVERHEAD@", str(ENTRY_OVERHEAD))

# ARGV: ttl, field, value, field, value, ...
_CREATE = """
if redis.call('EXISTS', S) == 1 then return 0 end
wipe_streams()  -- leftovers of an earlier session with this id, if any
redis.call('DEL', IDX, CALLS, CEXP)
redis.call('HSET', S, unpack(ARGV, 2))
local now = now_ms()
redis.call('HSET', S, 'seen', now, 'born', now)
redis.call('PEXPIRE', S, TTL)
return 1
"""

# ARGV: ttl.  The session was served now (by the server's clock); its keys live on.
_TOUCH = """
if redis.call('EXISTS', S) == 0 then return 0 end
redis.call('HSET', S, 'seen', now_ms(), 'touched', '1')
touch()
return 1
"""

# ARGV: ttl, idle (ms; '0' = never), untouched (ms; '0' = none).  Delete the session if,
# by the server's clock, it was last served ``idle`` ago, or never served since it was
# born ``untouched`` ago.  1: gone (now or before); 0: it lives on.
_EXPIRE_IDLE = """
if redis.call('EXISTS', S) == 0 then return 1 end
local now = now_ms()
local seen = tonumber(redis.call('HGET', S, 'seen') or '')
if not seen then  -- a record written before last-seen was kept: its clock starts now
  redis.call('HSET', S, 'seen', now, 'born', now)
  return 0
end
local idle, fresh = tonumber(ARGV[2]), tonumber(ARGV[3])
local born = tonumber(redis.call('HGET', S, 'born') or '') or seen
local untouched = redis.call('HEXISTS', S, 'touched') == 0
if (idle > 0 and now - seen >= idle) or (fresh > 0 and untouched and now - born >= fresh) then
  wipe_streams()
  redis.call('DEL', S, IDX, CALLS, CEXP)
  return 1
end
-- It lives on.  The caller may forget its copy, so the record keeps the deadline
-- itself: it expires when the window ends, unless a touch or a write extends it.
local left = -1
if idle > 0 then left = seen + idle - now end
if fresh > 0 and untouched and (left < 0 or born + fresh - now < left) then
  left = born + fresh - now
end
if left > 0 then
  for _, key in ipairs({S, IDX, CALLS, CEXP}) do
    local ttl = redis.call('PTTL', key)
    if ttl == -1 or ttl > left then redis.call('PEXPIRE', key, left) end
  end
end
return 0
"""

_DELETE = """
local existed = redis.call('EXISTS', S)
wipe_streams()
redis.call('DEL', S, IDX, CALLS, CEXP)
return existed
"""

# ARGV: ttl, secret
_REBIND = """
if redis.call('EXISTS', S) == 0 then return false end
redis.call('HINCRBY', S, 'generation', 1)
redis.call('HSET', S, 'secret', ARGV[2])
touch()
return redis.call('HGETALL', S)
"""

# ARGV: ttl
_MARK_BOUND = """
if redis.call('EXISTS', S) == 0 then return false end
redis.call('HSET', S, 'bound', '1')
return 1
"""

# ARGV: ttl, binding (the channel generation the stream is opened under; '0' = none)
_ALLOCATE = """
if redis.call('EXISTS', S) == 0 then return false end
local epoch = new_epoch()
if ARGV[2] ~= '0' then redis.call('HSET', S, 'b:' .. epoch, ARGV[2]) end
touch()
return epoch
"""

# ARGV: ttl, call key, fingerprint, token generation ('' = no token), token secret,
# request id (JSON), owner replica, lease (ms; '0' = none), the interrupted message,
# the delivery's claim id ('' = none: see _RELEASE)
_BEGIN = """
if redis.call('EXISTS', S) == 0 then return {'gone'} end
if ARGV[4] ~= '' then
  local current = tonumber(redis.call('HGET', S, 'generation'))
  local presented = tonumber(ARGV[4])
  if presented < current then return {'stale'} end
  -- The secrets are compared by their digests: no timing of a byte-by-byte compare.
  local held = redis.call('HGET', S, 'secret') or ''
  if presented > current or redis.sha1hex(held) ~= redis.sha1hex(ARGV[5]) then
    return {'unbound'}
  end
end
local now = now_ms()
local dead = redis.call('ZRANGEBYSCORE', CEXP, '-inf', now, 'LIMIT', 0, 64)
for _, key in ipairs(dead) do forget_call(key) end
local epoch = new_epoch()
-- The stream this call's response travels on is bound to the presented token.
if ARGV[4] ~= '' and ARGV[4] ~= '0' then redis.call('HSET', S, 'b:' .. epoch, ARGV[4]) end
local fp = redis.call('HGET', CALLS, 'f:' .. ARGV[2])
local reply
if not fp then
  redis.call('HSET', CALLS, 'f:' .. ARGV[2], ARGV[3], 'r:' .. ARGV[2], ARGV[6],
    'e:' .. ARGV[2], epoch, 'o:' .. ARGV[2], ARGV[7], 'k:' .. epoch, ARGV[2])
  tally(0, #ARGV[2] + OVERHEAD)
  if tonumber(ARGV[8]) > 0 then
    redis.call('HSET', CALLS, 'l:' .. ARGV[2], now + tonumber(ARGV[8]))
  end
  if ARGV[10] ~= '' then redis.call('HSET', CALLS, 'c:' .. ARGV[2], ARGV[10]) end
  redis.call('ZADD', CEXP, now + TTL, ARGV[2])
  reply = {'execute', epoch}
elseif fp ~= ARGV[3] then
  reply = {'mismatch', epoch}
else
  local payload = redis.call('HGET', CALLS, 'p:' .. ARGV[2])
  if payload == '' then
    reply = {'evicted', epoch}  -- it ran; its response was dropped to keep the bounds
  elseif payload then
    reply = {'done', epoch, payload}
  else
    local lease = tonumber(redis.call('HGET', CALLS, 'l:' .. ARGV[2]) or '0')
    if lease > 0 and lease < now then
      reply = {'done', epoch, interrupt(ARGV[2], ARGV[9])}
    else
      reply = {'running', epoch}
    end
  end
end
touch()
return reply
"""

# ARGV: ttl, call key, payload ('' when released), '1' = store / '0' = release, idempotency ttl,
# the gate's bounds: finished calls, bytes
_FINISH = """
if redis.call('EXISTS', S) == 0 then return 0 end
if ARGV[4] == '0' then
  forget_call(ARGV[2])
elseif redis.call('HEXISTS', CALLS, 'f:' .. ARGV[2]) == 1 then
  keep(ARGV[2], ARGV[3])
  redis.call('HDEL', CALLS, 'l:' .. ARGV[2])
  redis.call('ZADD', CEXP, now_ms() + tonumber(ARGV[5]), ARGV[2])
  trim(ARGV[2], tonumber(ARGV[6]), tonumber(ARGV[7]))
end
touch()
return 1
"""

# KEYS[5] = the stream.  ARGV: ttl, generation, seq + 1, data, final ('1'/'0'), binding, maxlen,
# call key ('' for none), idempotency ttl, replica id, the gate's bounds (finished calls, bytes).
# With a call key the data is also stored as that call's response: the final event and the
# gate's record are one atomic step.
_APPEND = """
local E = KEYS[5]
if redis.call('EXISTS', S) == 0 then return 'gone' end
if tonumber(redis.call('HGET', S, 'generation')) ~= tonumber(ARGV[2]) then return 'stale' end
local id = ARGV[3] .. '-0'
local top = redis.call('XREVRANGE', E, '+', '-', 'COUNT', 1)
if #top > 0 then
  local head = tonumber(string.match(top[1][1], '^(%d+)-'))
  local want = tonumber(ARGV[3])
  if want <= head then
    local same = redis.call('XRANGE', E, id, id)
    if #same == 1 then
      local f = {}
      local flat = same[1][2]
      for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
      if f['d'] == ARGV[4] and f['f'] == ARGV[5] and f['b'] == ARGV[6] then return 'duplicate' end
    end
    return 'order:' .. (head - 1)
  end
  if want ~= head + 1 then return 'order:' .. (head - 1) end
end
redis.call('XADD', E, 'MAXLEN', '~', ARGV[7], id, 'd', ARGV[4], 'f', ARGV[5], 'b', ARGV[6],
  'r', ARGV[10])
if ARGV[8] ~= '' and redis.call('HEXISTS', CALLS, 'f:' .. ARGV[8]) == 1 then
  keep(ARGV[8], ARGV[4])
  redis.call('HDEL', CALLS, 'l:' .. ARGV[8])
  redis.call('ZADD', CEXP, now_ms() + tonumber(ARGV[9]), ARGV[8])
  trim(ARGV[8], tonumber(ARGV[11]), tonumber(ARGV[12]))
end
redis.call('SADD', IDX, E)
redis.call('PEXPIRE', E, TTL)
touch()
return 'ok'
"""

# ARGV: ttl, owner replica, lease (ms), call key, call key, ...: extend the leases of the
# owner's running claims.
_RENEW = """
if redis.call('EXISTS', S) == 0 then return 0 end
local now = now_ms()
local until_ms = now + tonumber(ARGV[3])
local renewed = 0
for i = 4, #ARGV do
  local key = ARGV[i]
  if redis.call('HGET', CALLS, 'o:' .. key) == ARGV[2]
      and redis.call('HEXISTS', CALLS, 'l:' .. key) == 1 then
    redis.call('HSET', CALLS, 'l:' .. key, until_ms)
    -- (and it is not pruned as expired while it runs: see _BEGIN)
    redis.call('ZADD', CEXP, now + TTL, key)
    renewed = renewed + 1
  end
end
-- A call still running keeps its claim and its record alive: otherwise a call that
-- outlives the TTL (the sessionless gate's namespace sees no other writes) loses its
-- claim mid-call, and a retry runs the call again.
if renewed > 0 then touch() end
return renewed
"""

# ARGV: ttl, call key, claim id: give back a claim a delivery may have been granted
# without hearing so (the reply was lost) -- only while nothing is stored for it and
# only if that delivery's claim id is the one on record: 1 if it was given back.
_RELEASE = """
if redis.call('EXISTS', S) == 0 then return 0 end
if ARGV[3] == '' or redis.call('HEXISTS', CALLS, 'p:' .. ARGV[2]) == 1 then return 0 end
if redis.call('HGET', CALLS, 'c:' .. ARGV[2]) ~= ARGV[3] then return 0 end
forget_call(ARGV[2])
touch()
return 1
"""

# ARGV: ttl, epoch, the interrupted message: if the call whose response stream is
# ``epoch`` runs under an expired lease, interrupt it (1), else nothing (0).
_EXPIRE = """
if redis.call('EXISTS', S) == 0 then return 0 end
local key = redis.call('HGET', CALLS, 'k:' .. ARGV[2])
if not key or redis.call('HEXISTS', CALLS, 'p:' .. key) == 1 then return 0 end
local lease = tonumber(redis.call('HGET', CALLS, 'l:' .. key) or '0')
if lease == 0 or lease >= now_ms() then return 0 end
interrupt(key, ARGV[3])
return 1
"""

# A read: KEYS[1] = the stream, KEYS[2] = the record.  ARGV: after_seq + 1, epoch (hex)
_READ = (
    _FEISTEL
    + """
local E = KEYS[1]
local first = redis.call('XRANGE', E, '-', '+', 'COUNT', 1)
if #first == 0 then
  -- No event stored yet.  A cursor at the priming event (seq 0, never stored) of
  -- an epoch this session did allocate is valid: the stream is just empty so far.
  local allocated = tonumber(redis.call('HGET', KEYS[2], 'epochs') or '0')
  local n = weir_epoch_number(KEYS[2], ARGV[2])
  if tonumber(ARGV[1]) == 1 and n >= 1 and n <= allocated then return {} end
  return false
end
local last = redis.call('XREVRANGE', E, '+', '-', 'COUNT', 1)
local oldest = tonumber(string.match(first[1][1], '^(%d+)-')) - 1
local newest = tonumber(string.match(last[1][1], '^(%d+)-')) - 1
local want = tonumber(ARGV[1])
if want < oldest or want > newest + 1 then return false end
if want == newest + 1 then return {} end
return redis.call('XRANGE', E, string.format('%d-0', want + 1), '+')
"""
)
