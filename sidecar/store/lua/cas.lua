-- cas.lua: compare-and-set of a few JSON documents, with sorted-set index updates.
--
-- KEYS[1..n]      the documents the transaction read (n = ARGV[1])
-- KEYS[n+1..]     the sorted-set indexes the plan touches
-- ARGV[1]         n, the number of document keys
-- ARGV[2..n+1]    the raw value each document had when read; "" = absent
-- ARGV[n+2]       the plan, JSON:
--                   {"w": [[doc_i, value_i | null, "ttl_ms"], ...],
--                    "x": [[index_i, member, score | null], ...],
--                    "t": [[index_i, "below"], ...],
--                    "i": [[key_pos, field, delta, "ttl_ms"], ...]}
--                 doc_i counts from 1 among the documents, index_i from 1
--                 among the indexes; value_i is the ARGV position of the new
--                 document (after the plan), null deletes; ttl_ms is a decimal
--                 string of milliseconds, "0" keeps forever; score (a decimal
--                 string) null removes the member; a trim removes every
--                 member scored below "below" (ZREMRANGEBYSCORE, exclusive).
--                 An increment adds delta to the number at field of the JSON
--                 document at KEYS[key_pos] (after the indexes; never
--                 compared), creating {field: delta} when the key is absent.
--                 Optional "b": [[[[doc_i, weight], ...], field, below | null,
--                 at_least | null], ...]: bounds on documents compared by
--                 them, not whole: the sum of weight * the count at field of
--                 each (0 when absent) below "below" and at least
--                 "at_least"; one that fails, or a document that holds no
--                 whole count there, counts as a change.
--                 Optional "f": the fence, the server time (epoch
--                 milliseconds) past which nothing is written and the
--                 answer is -1: the caller stopped waiting for this script
--                 (a server that paused with it queued runs it later).
-- ARGV[n+3..]     the new documents, each a JSON string: kept apart from the
--                 plan so the script never decodes them.
-- Returns 1 when the plan was applied, -1 when it ran past its fence. When any document changed since it
-- was read, nothing is written and the answer is {0, value_1, ..., value_n}:
-- every document's current value (nil when absent), read at one instant (one
-- MGET), so the caller re-runs its function on them without reading again.

-- SET with a TTL in milliseconds ("0": none).
local function put(key, value, ttl_ms)
  if ttl_ms ~= '0' then
    redis.call('SET', key, value, 'PX', ttl_ms)
  else
    redis.call('SET', key, value)
  end
end

-- The weighted sum a bound (plan "b") is checked against; nil when a
-- document is not an object holding a whole count from 0 to 2^53 at the
-- field (absent: 0), which fails the bound: the caller reads and decides.
local function bounded_sum(bound, now)
  local total = 0
  for _, kw in ipairs(bound[1]) do
    local raw = now[kw[1]]
    if raw then
      local ok, doc = pcall(cjson.decode, raw)
      if not ok or type(doc) ~= 'table' then return nil end
      local count = doc[bound[2]]
      if count == nil then count = 0 end
      if type(count) ~= 'number' or count ~= count or count < 0
          or count > 9007199254740992 or math.floor(count) ~= count then
        return nil
      end
      total = total + kw[2] * count
    end
  end
  return total
end

local n = tonumber(ARGV[1])
local plan = cjson.decode(ARGV[n + 2])
-- Every compared document in one MGET (one command, however many there are).
if n > 0 then
  local now = redis.call('MGET', unpack(KEYS, 1, n))
  local bounded = {}
  for _, b in ipairs(plan['b'] or {}) do
    for _, kw in ipairs(b[1]) do bounded[kw[1]] = true end
  end
  local changed = false
  for i = 1, n do
    local value = now[i]
    if value == false then value = '' end
    if not bounded[i] and value ~= ARGV[i + 1] then
      changed = true
      break
    end
  end
  for _, b in ipairs(plan['b'] or {}) do
    if changed then break end
    local total = bounded_sum(b, now)
    if total == nil or (b[3] ~= cjson.null and total >= b[3])
        or (b[4] ~= cjson.null and total < b[4]) then
      changed = true
    end
  end
  if changed then
    table.insert(now, 1, 0)
    return now
  end
end

if plan['f'] then
  local now = redis.call('TIME')
  if tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000 > plan['f'] then
    return -1
  end
end

-- Increments are computed before anything is written: a target that is not
-- a JSON object fails the script with nothing applied.
local counted = {}
for _, inc in ipairs(plan['i'] or {}) do
  local raw = redis.call('GET', KEYS[inc[1]])
  local doc = {}
  if raw then doc = cjson.decode(raw) end
  if (raw and string.sub(raw, 1, 1) ~= '{') or type(doc) ~= 'table' then
    return redis.error_reply('increment target is not a JSON object: ' .. KEYS[inc[1]])
  end
  doc[inc[2]] = (tonumber(doc[inc[2]]) or 0) + inc[3]
  counted[#counted + 1] = {KEYS[inc[1]], cjson.encode(doc), inc[4]}
end
for _, w in ipairs(plan['w']) do
  if w[2] == cjson.null then
    redis.call('DEL', KEYS[w[1]])
  else
    put(KEYS[w[1]], ARGV[w[2]], w[3])
  end
end
for _, c in ipairs(counted) do
  put(c[1], c[2], c[3])
end
for _, t in ipairs(plan['t'] or {}) do
  redis.call('ZREMRANGEBYSCORE', KEYS[n + t[1]], '-inf', '(' .. t[2])
end
for _, x in ipairs(plan['x']) do
  local key = KEYS[n + x[1]]
  if x[3] == cjson.null then
    redis.call('ZREM', key, x[2])
  else
    redis.call('ZADD', key, x[3], x[2])
  end
end
return 1
