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
-- ARGV[n+3..]     the new documents, each a JSON string: kept apart from the
--                 plan so the script never decodes them.
-- Returns 1 when the plan was applied. When any document changed since it
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

local n = tonumber(ARGV[1])
-- Every compared document in one MGET (one command, however many there are).
if n > 0 then
  local now = redis.call('MGET', unpack(KEYS, 1, n))
  for i = 1, n do
    local value = now[i]
    if value == false then value = '' end
    if value ~= ARGV[i + 1] then
      table.insert(now, 1, 0)
      return now
    end
  end
end

local plan = cjson.decode(ARGV[n + 2])
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
