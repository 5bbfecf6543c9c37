"""The Lua scripts of :class:`~inference.scheduling.redis.RedisScheduler`: each operation
on the queue is one of them, atomic on the server.

Keys, under ``{key_prefix}{{name}}:`` (the braces are a cluster hash tag, so every key of
one queue lives on one shard):

- ``ring``: list of teams with waiters; the head is the RIGHT end, newcomers LPUSH
- ``deficit``: hash team -> requests left in the head team's current turn
- ``weight``: hash team -> quantum (requests per turn)
- ``team:<team>``: list of that team's tickets, FIFO
- ``waiting``: hash ticket -> team, for every queued ticket
- ``alive``: zset ticket -> when a queued ticket lapses unless its waiter polls again
- ``leases``: zset ticket -> lease expiry; its size is the number of slots held
- ``granted``: hash ticket -> grant time, for the service-time average
- ``stats``: hash: mean (EWMA of hold durations, seconds)

A ticket is ``<instance>:<random>``, ``<instance>`` naming the RedisScheduler (one per
process and event loop) whose waiter holds it. When dispatch grants a ticket it
PUBLISHes the ticket on ``wake:<instance>`` (a pub/sub channel, not a key), which that
instance's one subscription hears; the lease in ``leases`` is the grant itself, so a
waiter that missed the message finds it by polling. No connection is held per waiter.

Every script runs ``purge`` then ``dispatch`` (except renew and cancel), so expired
leases and abandoned tickets are reclaimed whenever anyone touches the queue. The scripts
implement exactly :class:`~inference.scheduling.queue.FairQueue`'s order.
"""

_LUA_PRELUDE = """
local RING, DEFICIT, WEIGHT, WAITING, ALIVE, LEASES, GRANTED, STATS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local capacity, lease_seconds, base = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]

local function team_key(team) return base .. 'team:' .. team end

local function retire(team)
  redis.call('LREM', RING, 1, team)
  redis.call('HDEL', DEFICIT, team)
  redis.call('HDEL', WEIGHT, team)
end

local function unqueue(ticket, team)
  local queue = team_key(team)
  redis.call('LREM', queue, 1, ticket)
  redis.call('HDEL', WAITING, ticket)
  redis.call('ZREM', ALIVE, ticket)
  if redis.call('LLEN', queue) == 0 then retire(team) end
end

local function purge()
  for _, ticket in ipairs(redis.call('ZRANGEBYSCORE', LEASES, '-inf', now)) do
    redis.call('ZREM', LEASES, ticket)
    redis.call('HDEL', GRANTED, ticket)
  end
  for _, ticket in ipairs(redis.call('ZRANGEBYSCORE', ALIVE, '-inf', now)) do
    local team = redis.call('HGET', WAITING, ticket)
    if team then unqueue(ticket, team) else redis.call('ZREM', ALIVE, ticket) end
  end
end

-- FairQueue.pop: the head team serves, topping up its deficit at the start of its turn.
local function next_ticket()
  while true do
    local team = redis.call('LINDEX', RING, -1)
    if not team then return nil end
    local queue = team_key(team)
    local ticket = redis.call('LPOP', queue)
    if ticket then
      local deficit = tonumber(redis.call('HGET', DEFICIT, team)) or 0
      if deficit <= 0 then
        deficit = deficit + (tonumber(redis.call('HGET', WEIGHT, team)) or 1)
      end
      deficit = deficit - 1
      if redis.call('LLEN', queue) == 0 then
        retire(team)
      elseif deficit <= 0 then
        redis.call('HSET', DEFICIT, team, 0)
        redis.call('RPOPLPUSH', RING, RING)
      else
        redis.call('HSET', DEFICIT, team, deficit)
      end
      redis.call('HDEL', WAITING, ticket)
      redis.call('ZREM', ALIVE, ticket)
      return ticket
    end
    retire(team)  -- a ring entry without tickets cannot happen; never stall on one
  end
end

local function grant(ticket)
  redis.call('ZADD', LEASES, now + lease_seconds, ticket)
  redis.call('HSET', GRANTED, ticket, now)
end

local function dispatch()
  purge()
  while redis.call('ZCARD', LEASES) < capacity do
    local ticket = next_ticket()
    if not ticket then return end
    grant(ticket)
    -- Wake the waiter through its scheduler's channel; nobody listening loses nothing.
    local instance = string.match(ticket, '^(%x+):')
    if instance then redis.call('PUBLISH', base .. 'wake:' .. instance, ticket) end
  end
end

-- FairQueue.ahead: replay the rounds on counters until the ticket at ``index`` of
-- ``team``'s queue would be served.
local function ahead(team, index)
  local ring = redis.call('LRANGE', RING, 0, -1)
  local order, first, last = {}, 1, 0
  local length, deficit, weight = {}, {}, {}
  for i = #ring, 1, -1 do
    local t = ring[i]
    last = last + 1
    order[last] = t
    length[t] = redis.call('LLEN', team_key(t))
    deficit[t] = tonumber(redis.call('HGET', DEFICIT, t)) or 0
    weight[t] = tonumber(redis.call('HGET', WEIGHT, t)) or 1
  end
  local served = 0
  while first <= last do
    local head = order[first]
    if deficit[head] <= 0 then deficit[head] = deficit[head] + weight[head] end
    if head == team and index == 0 then return served end
    served = served + 1
    length[head] = length[head] - 1
    deficit[head] = deficit[head] - 1
    if head == team then index = index - 1 end
    if length[head] == 0 then
      first = first + 1
    elseif deficit[head] <= 0 then
      first = first + 1
      last = last + 1
      order[last] = head
    end
  end
  return served
end
"""

# ARGV[5..7]: ticket, team, weight. Returns 1 when granted at once, else 0 (queued).
ENQUEUE_SCRIPT = (
    _LUA_PRELUDE
    + """
local ticket, team, weight = ARGV[5], ARGV[6], tonumber(ARGV[7])
purge()
if redis.call('HLEN', WAITING) == 0 and redis.call('ZCARD', LEASES) < capacity then
  grant(ticket)
  return 1
end
if redis.call('RPUSH', team_key(team), ticket) == 1 then redis.call('LPUSH', RING, team) end
redis.call('HSET', WEIGHT, team, weight)
redis.call('HSET', WAITING, ticket, team)
redis.call('ZADD', ALIVE, now + lease_seconds, ticket)
dispatch()
if redis.call('ZSCORE', LEASES, ticket) then return 1 end
return 0
"""
)

# ARGV[5]: the polling waiter's ticket, kept alive. Reclaims expired leases. Returns 1
# when the ticket holds a lease (granted, whether or not its wake-up was heard), else 0.
POLL_SCRIPT = (
    _LUA_PRELUDE
    + """
if redis.call('HEXISTS', WAITING, ARGV[5]) == 1 then
  redis.call('ZADD', ALIVE, 'XX', now + lease_seconds, ARGV[5])
end
dispatch()
if redis.call('ZSCORE', LEASES, ARGV[5]) then return 1 end
return 0
"""
)

# ARGV[5..6]: ticket, EWMA alpha. Returns 1 if the lease was still held, else 0.
RELEASE_SCRIPT = (
    _LUA_PRELUDE
    + """
local ticket, alpha = ARGV[5], tonumber(ARGV[6])
local released = 0
if redis.call('ZREM', LEASES, ticket) == 1 then
  released = 1
  local since = tonumber(redis.call('HGET', GRANTED, ticket))
  if since then
    local sample = math.max(0, now - since)
    local mean = tonumber(redis.call('HGET', STATS, 'mean'))
    if mean then mean = mean + alpha * (sample - mean) else mean = sample end
    redis.call('HSET', STATS, 'mean', mean)
  end
end
redis.call('HDEL', GRANTED, ticket)
dispatch()
return released
"""
)

# ARGV[5]: ticket. Returns {0, position, mean} when it was taken out of the queue,
# {1} when it had been granted (the caller keeps or releases the lease), {2} when gone.
CANCEL_SCRIPT = (
    _LUA_PRELUDE
    + """
local ticket = ARGV[5]
local team = redis.call('HGET', WAITING, ticket)
if team then
  local index = redis.call('LPOS', team_key(team), ticket)
  local position = 0
  if index then position = ahead(team, index) end
  unqueue(ticket, team)
  return {0, position, redis.call('HGET', STATS, 'mean')}
end
if redis.call('ZSCORE', LEASES, ticket) then return {1} end
return {2}
"""
)

# ARGV[5]: ticket. Returns 1 if renewed, 0 if the lease had lapsed (its slot is gone).
RENEW_SCRIPT = (
    _LUA_PRELUDE
    + """
local expiry = tonumber(redis.call('ZSCORE', LEASES, ARGV[5]))
if expiry and expiry > now then
  redis.call('ZADD', LEASES, 'XX', now + lease_seconds, ARGV[5])
  return 1
end
return 0
"""
)

# Returns {waiting, held}, not counting what has lapsed but is not yet purged.
COUNT_SCRIPT = (
    _LUA_PRELUDE
    + """
local after = string.format('(%.17g', now)
return {redis.call('ZCOUNT', ALIVE, after, '+inf'), redis.call('ZCOUNT', LEASES, after, '+inf')}
"""
)
